"""TOPLOC proofs (crypto.toploc): format, exact figures, strictness, fuzzing, and a real model.

An independent, slow oracle (per chunk: ``torch.topk`` on magnitudes, the modulus by brute force,
Newton interpolation in Python integers) pins the bytes without the reference package; the
interop tests compare against the reference itself.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from intellect_node.crypto.toploc import (
    NOT_MEASURED,
    PRIME,
    ChunkVerdict,
    Thresholds,
    bind_proofs,
    build_proofs,
    chunk_count,
    chunk_masks,
    proof_size,
    unbind_proofs,
    verify_proofs,
)
from tests.support.toploc_model import TinyConfig, TinyLlama

REASONS = {
    "ok",
    "exp_mismatch",
    "mantissa_mean",
    "mantissa_median",
    "malformed_type",
    "malformed_length",
    "bad_modulus",
    "coefficient_out_of_field",
    "count_mismatch",
}


# ---- an independent oracle ----------------------------------------------------------------------


def _newton(xs: list[int], ys: list[int]) -> list[int]:
    n = len(xs)
    dd = [y % PRIME for y in ys]
    for k in range(1, n):
        for i in range(n - 1, k - 1, -1):
            dd[i] = (dd[i] - dd[i - 1]) * pow(xs[i] - xs[i - k], -1, PRIME) % PRIME
    coeffs = [0] * n
    for i in range(n - 1, -1, -1):  # Horner on the Newton form
        coeffs = [(c_prev - xs[i] * c) % PRIME for c, c_prev in zip(coeffs, [0] + coeffs[:-1], strict=True)]
        coeffs[0] = (coeffs[0] + dd[i]) % PRIME
    return coeffs


def oracle_proofs(hidden: torch.Tensor, chunk_size: int = 32, topk: int = 128) -> list[bytes]:
    hidden = hidden.to(torch.bfloat16)
    proofs = []
    for start in range(0, hidden.shape[0], chunk_size):
        flat = hidden[start : start + chunk_size].reshape(-1)
        idx = flat.abs().topk(topk).indices.tolist()
        bits = [b & 0xFFFF for b in flat.view(torch.int16)[idx].tolist()]
        m = next(m for m in range(PRIME, 0, -1) if len({i % m for i in idx}) == topk)
        coeffs = _newton([i % m for i in idx], bits)
        proofs.append(struct.pack(f">{topk + 1}H", m, *coeffs))
    return proofs


def horner(coeffs: list[int], x: int) -> int:
    value = 0
    for c in reversed(coeffs):
        value = (value * x + c) % PRIME
    return value


def bf16_from_bits(bits: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(torch.bfloat16).reshape(shape)


def distinct_magnitudes(tokens: int, hidden: int, seed: int) -> torch.Tensor:
    """bf16 values whose magnitudes are all different (random order and signs): no ties.

    Finite bf16 magnitudes number 0x7F80, so at most about 32000 values fit."""
    rng = np.random.default_rng(seed)
    count = tokens * hidden
    assert count <= 0x7F00
    mags = 0x80 + rng.permutation(count)
    signs = rng.integers(0, 2, count) << 15
    return bf16_from_bits(mags | signs, (tokens, hidden))


def tied_values(tokens: int, hidden: int, seed: int) -> torch.Tensor:
    """Few distinct magnitudes: the top-k boundary falls inside long runs of equal values."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(-40, 41, (tokens, hidden), generator=gen) / 8).to(torch.bfloat16)


def randn(tokens: int, hidden: int, seed: int) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


# ---- format and bytes ---------------------------------------------------------------------------


def test_proof_layout_modulus_and_polynomial() -> None:
    hidden = randn(40, 1024, seed=1)
    proofs = build_proofs(hidden)
    assert len(proofs) == chunk_count(40) == 2
    for chunk, proof in enumerate(proofs):
        assert len(proof) == proof_size() == 258
        m, *coeffs = struct.unpack(">129H", proof)
        flat = hidden[32 * chunk : 32 * chunk + 32].reshape(-1)
        idx = flat.abs().topk(128).indices.tolist()
        assert len({i % m for i in idx}) == 128
        assert all(len({i % bigger for i in idx}) < 128 for bigger in range(m + 1, PRIME + 1))
        assert max(coeffs) < PRIME
        bits = [b & 0xFFFF for b in flat.view(torch.int16)[idx].tolist()]
        assert [horner(coeffs, i % m) for i in idx] == [b % PRIME for b in bits]


def test_bound_proofs_follow_the_spec() -> None:
    """specs/toploc.md 3.1, written out independently: chunk c's mask is SHAKE-256 of the domain,
    the key's u16be length, the key and u32be(c), read as u16be values mod p; a bound proof is the
    unbound modulus and the coefficients plus the mask, mod p. A short key's vector is pinned."""
    key = bytes(range(32))
    hidden = randn(40, 1024, seed=1)
    unbound, bound = build_proofs(hidden), build_proofs(hidden, key=key)
    for chunk, (plain, masked) in enumerate(zip(unbound, bound, strict=True)):
        stream = hashlib.shake_256(b"intellect-node/toploc/chunk-mask/v1" + b"\x00\x20" + key
                                   + chunk.to_bytes(4, "big")).digest(256)
        mask = [int.from_bytes(stream[2 * i : 2 * i + 2], "big") % PRIME for i in range(128)]
        assert chunk_masks(key, 1, first=chunk)[0].tolist() == mask
        m, *coeffs = struct.unpack(">129H", plain)
        assert struct.unpack(">129H", masked) == (m, *((c + x) % PRIME for c, x in zip(coeffs, mask, strict=True)))
    assert chunk_masks(key, 1, first=3)[0, :4].tolist() == [6818, 35699, 61889, 21169]
    assert bind_proofs(unbound, key) == bound and unbind_proofs(bound, key) == unbound
    assert bind_proofs(unbound[1:], key, first_chunk=1) == bound[1:]
    assert [v.reason for v in verify_proofs(hidden, bound, key=key)] == ["ok", "ok"]
    assert [v.reason for v in verify_proofs(hidden, bound)] == ["exp_mismatch"] * 2  # a bound proof read unbound
    assert [v.reason for v in verify_proofs(hidden, unbound, key=key)] == ["exp_mismatch"] * 2  # an unbound one


@pytest.mark.parametrize("key", [b"", "text", bytes(65536), bytearray(32)], ids=["empty", "str", "long", "bytearray"])
def test_invalid_keys_raise(key) -> None:
    hidden = randn(40, 1024, seed=1)
    for call in (lambda: build_proofs(hidden, key=key), lambda: verify_proofs(hidden, build_proofs(hidden), key=key)):
        with pytest.raises(ValueError, match="key"):
            call()


@pytest.mark.parametrize(
    "hidden, chunk_size, topk",
    [
        (randn(70, 512, seed=2), 32, 128),  # two heap-path chunks and a short torch-path tail
        (tied_values(40, 4096, seed=3), 32, 128),  # ties at the boundary, long rows
        (tied_values(64, 96, seed=4), 32, 128),  # rows too short for the heap path
        (randn(19, 300, seed=5), 8, 32),
        (distinct_magnitudes(33, 512, seed=6), 32, 128),
    ],
    ids=["randn", "ties-4096", "short-rows", "c8-k32", "distinct"],
)
def test_bytes_equal_the_oracle(hidden: torch.Tensor, chunk_size: int, topk: int) -> None:
    assert build_proofs(hidden, chunk_size=chunk_size, topk=topk) == oracle_proofs(hidden, chunk_size, topk)


def test_nan_and_inf_chunks_match_the_oracle() -> None:
    hidden = randn(40, 512, seed=7)
    hidden[3, 17] = float("nan")
    hidden[5, 100] = float("inf")
    hidden[36, 9] = float("-inf")
    assert build_proofs(hidden) == oracle_proofs(hidden)
    assert all(v.ok for v in verify_proofs(hidden, build_proofs(hidden)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.integers(1, 40),
    width=st.sampled_from([16, 64, 256, 300]),
    chunk_size=st.sampled_from([1, 4, 32]),
    topk=st.sampled_from([1, 8, 12, 16]),  # 12: odd levels in the product tree
    kind=st.sampled_from(["randn", "ties"]),
    seed=st.integers(0, 2**16),
)
def test_property_bytes_and_self_verification(
    tokens: int, width: int, chunk_size: int, topk: int, kind: str, seed: int
) -> None:
    hidden = randn(tokens, width, seed) if kind == "randn" else tied_values(tokens, width, seed)
    if min(tokens % chunk_size or chunk_size, chunk_size) * width < topk:
        with pytest.raises(ValueError):
            build_proofs(hidden, chunk_size=chunk_size, topk=topk)
        return
    proofs = build_proofs(hidden, chunk_size=chunk_size, topk=topk)
    assert proofs == oracle_proofs(hidden, chunk_size, topk)
    verdicts = verify_proofs(hidden, proofs, chunk_size=chunk_size, topk=topk)
    assert verdicts == [ChunkVerdict(0, 0.0, 0.0, True, "ok")] * chunk_count(tokens, chunk_size)


def test_fp32_and_fp16_are_rounded_to_bf16_on_both_sides() -> None:
    full = torch.randn(64, 512, generator=torch.Generator().manual_seed(8))
    assert build_proofs(full) == build_proofs(full.to(torch.bfloat16))
    half = full.to(torch.float16)
    assert build_proofs(half) == build_proofs(half.to(torch.bfloat16))
    assert all(v.ok and v.mant_err_mean == 0 for v in verify_proofs(full, build_proofs(full.to(torch.bfloat16))))


def test_empty_rollout() -> None:
    assert build_proofs(torch.zeros(0, 512)) == []
    assert verify_proofs(torch.zeros(0, 512), []) == []


@pytest.mark.parametrize(
    "hidden, kwargs",
    [
        (torch.zeros(512), {}),
        (torch.zeros(4, 512, dtype=torch.int32), {}),
        (torch.zeros(1, 64), {}),  # one token of 64 values cannot hold top-128
        (torch.zeros(40, 512), {"topk": 0}),
        (torch.zeros(40, 512), {"chunk_size": 0}),
    ],
)
def test_invalid_local_arguments_raise(hidden: torch.Tensor, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        build_proofs(hidden, **kwargs)
    with pytest.raises(ValueError):
        verify_proofs(hidden, [], **kwargs)


# ---- exact figures and thresholds ---------------------------------------------------------------


def _top_entries(chunk: torch.Tensor) -> np.ndarray:
    """The chunk's top-128 flat positions, largest magnitude first."""
    return chunk.reshape(-1).abs().topk(128).indices.numpy()


def _edit_bits(hidden: torch.Tensor, positions: np.ndarray, edit) -> torch.Tensor:
    bits = hidden.view(torch.int16).numpy().astype(np.int64).reshape(-1) & 0xFFFF
    bits[positions] = edit(bits[positions])
    return bf16_from_bits(bits, tuple(hidden.shape))


def _verdict(hidden: torch.Tensor, proofs: list[bytes], **kwargs) -> ChunkVerdict:
    (verdict,) = verify_proofs(hidden, proofs, **kwargs)
    return verdict


@pytest.mark.parametrize("count, ok", [(0, True), (38, True), (39, False), (128, False)])
def test_exponent_mismatches_are_counted_exactly(count: int, ok: bool) -> None:
    hidden = distinct_magnitudes(32, 1000, seed=9)
    proofs = build_proofs(hidden)
    top = _top_entries(hidden)[:count]
    doubled = _edit_bits(hidden, top, lambda b: b + (1 << 7))  # exponent + 1: magnitude doubles
    verdict = _verdict(doubled, proofs)
    expected_mean = 0.0 if count < 128 else NOT_MEASURED
    assert (verdict.exp_mismatches, verdict.mant_err_mean, verdict.ok) == (count, expected_mean, ok)
    assert verdict.reason == ("ok" if ok else "exp_mismatch")


def test_sign_flips_are_exponent_mismatches() -> None:
    """The reference compares exponents only, so a negated commitment passes there; not here."""
    hidden = distinct_magnitudes(32, 1000, seed=10)
    proofs = build_proofs(hidden)
    negated = _verdict(-hidden, proofs)
    assert (negated.exp_mismatches, negated.reason) == (128, "exp_mismatch")
    some = _verdict(_edit_bits(hidden, _top_entries(hidden)[:40], lambda b: b ^ 0x8000), proofs)
    assert (some.exp_mismatches, some.mant_err_mean, some.reason) == (40, 0.0, "exp_mismatch")


def _with_mantissa_errors(hidden: torch.Tensor, errors: list[int]) -> torch.Tensor:
    """Raise the mantissa of top entries by the given amounts (no carry: same exponent, larger
    magnitude, so the top-k set stays the same)."""
    flat_bits = hidden.view(torch.int16).numpy().astype(np.int64).reshape(-1) & 0x7F
    top = [p for p in _top_entries(hidden) if flat_bits[p] + max(errors) <= 0x7F][: len(errors)]
    assert len(top) == len(errors)
    delta = dict(zip(top, errors, strict=True))
    return _edit_bits(hidden, np.array(top), lambda b: b + np.array([delta[p] for p in top]))


@pytest.mark.parametrize(
    "errors, figures, reason",
    [
        ([20] * 43 + [21] * 20, (1280 / 128, 0.0), "ok"),  # mean exactly 10, median 0
        ([20] * 42 + [21] * 21, (1281 / 128, 0.0), "mantissa_mean"),
        ([8] * 64, (4.0, 8.0), "ok"),  # upper median (sorted[64]) exactly 8
        ([9] * 64, (4.5, 9.0), "mantissa_median"),
        ([9] * 63, (63 * 9 / 128, 0.0), "ok"),  # 65 zeros: median 0
    ],
)
def test_mantissa_mean_and_upper_median(errors: list[int], figures: tuple[float, float], reason: str) -> None:
    hidden = distinct_magnitudes(32, 1000, seed=11)
    verdict = _verdict(_with_mantissa_errors(hidden, errors), build_proofs(hidden))
    assert (verdict.exp_mismatches, verdict.mant_err_mean, verdict.mant_err_median) == (0, *figures)
    assert (verdict.reason, verdict.ok) == (reason, reason == "ok")


def test_thresholds_are_configurable() -> None:
    hidden = distinct_magnitudes(32, 1000, seed=12)
    proofs = build_proofs(hidden)
    edited = _with_mantissa_errors(hidden, [3] * 100)  # mean 300 / 128
    assert _verdict(edited, proofs).ok
    strict = Thresholds(max_exp_mismatches=0, max_mant_err_mean=2.0, max_mant_err_median=8.0)
    assert _verdict(edited, proofs, thresholds=strict).reason == "mantissa_mean"
    assert Thresholds() == Thresholds(38, 10.0, 8.0)


# ---- strictness: counts and malformed proofs ----------------------------------------------------


@pytest.fixture(scope="module")
def three_chunks() -> tuple[torch.Tensor, list[bytes]]:
    hidden = randn(80, 512, seed=13)
    return hidden, build_proofs(hidden)


def _unmeasured(reason: str) -> ChunkVerdict:
    return ChunkVerdict(128, NOT_MEASURED, NOT_MEASURED, False, reason)


def test_honest_proofs_pass(three_chunks) -> None:
    hidden, proofs = three_chunks
    assert verify_proofs(hidden, proofs) == [ChunkVerdict(0, 0.0, 0.0, True, "ok")] * 3
    assert verify_proofs(hidden, tuple(bytearray(p) for p in proofs)) == verify_proofs(hidden, proofs)


@pytest.mark.parametrize(
    "edit",
    [lambda p: p[:-1], lambda p: p + p[:1], lambda p: [], lambda p: p[:1] * 5],
    ids=["short", "extra", "none", "five"],
)
def test_count_mismatch_rejects_every_chunk(three_chunks, edit) -> None:
    hidden, proofs = three_chunks
    assert verify_proofs(hidden, edit(proofs)) == [_unmeasured("count_mismatch")] * 3


def test_count_mismatch_on_an_empty_rollout_still_rejects() -> None:
    assert verify_proofs(torch.zeros(0, 512), [b"\x00" * 258]) == [_unmeasured("count_mismatch")]


@pytest.mark.parametrize("proofs", [None, b"\x00" * 774, "proofs", 3, {0: b""}])
def test_proofs_that_are_not_a_list_are_rejected(three_chunks, proofs) -> None:
    hidden, _ = three_chunks
    assert verify_proofs(hidden, proofs) == [_unmeasured("malformed_type")] * 3


def _with_modulus(proof: bytes, m: int) -> bytes:
    return struct.pack(">H", m) + proof[2:]


def _with_coefficient(proof: bytes, index: int, value: int) -> bytes:
    at = 2 + 2 * index
    return proof[:at] + struct.pack(">H", value) + proof[at + 2 :]


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda p: p[:-1], "malformed_length"),
        (lambda p: p + b"\x00", "malformed_length"),
        (lambda p: b"", "malformed_length"),
        (lambda p: p.hex(), "malformed_type"),
        (lambda p: None, "malformed_type"),
        (lambda p: list(p), "malformed_type"),
        (lambda p: _with_modulus(p, 0), "bad_modulus"),
        (lambda p: _with_modulus(p, 1), "bad_modulus"),
        (lambda p: _with_modulus(p, 127), "bad_modulus"),
        (lambda p: _with_modulus(p, PRIME + 1), "bad_modulus"),
        (lambda p: _with_modulus(p, 0xFFFF), "bad_modulus"),
        (lambda p: _with_coefficient(p, 0, PRIME), "coefficient_out_of_field"),
        (lambda p: _with_coefficient(p, 127, 0xFFFF), "coefficient_out_of_field"),
    ],
)
def test_a_malformed_proof_rejects_its_chunk_only(three_chunks, edit, reason: str) -> None:
    hidden, proofs = three_chunks
    verdicts = verify_proofs(hidden, [proofs[0], edit(proofs[1]), proofs[2]])
    assert verdicts[1] == _unmeasured(reason)
    assert verdicts[0].ok and verdicts[2].ok


def test_in_range_moduli_are_evaluated(three_chunks) -> None:
    hidden, proofs = three_chunks
    for m in (128, PRIME):
        verdict = verify_proofs(hidden, [_with_modulus(proofs[0], m), *proofs[1:]])[0]
        assert verdict.reason in {"ok", "exp_mismatch", "mantissa_mean", "mantissa_median"}


_ANY_ITEM = st.one_of(
    st.binary(max_size=600),
    st.binary(min_size=258, max_size=258),
    st.builds(lambda m, c: struct.pack(">H", m) + c, st.integers(0, 0xFFFF), st.binary(min_size=256, max_size=256)),
    st.none(),
    st.integers(),
    st.text(max_size=20),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(proofs=st.one_of(st.lists(_ANY_ITEM, max_size=5), _ANY_ITEM, st.tuples(_ANY_ITEM, _ANY_ITEM, _ANY_ITEM)))
def test_fuzzed_proofs_are_rejected_never_raised(three_chunks, proofs) -> None:
    hidden, _ = three_chunks
    verdicts = verify_proofs(hidden, proofs)
    assert len(verdicts) == 3
    assert all(isinstance(v, ChunkVerdict) and not v.ok and v.reason in REASONS for v in verdicts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    moduli=st.lists(st.integers(128, PRIME), min_size=3, max_size=3),
    raw=st.lists(st.binary(min_size=256, max_size=256), min_size=3, max_size=3),
)
def test_well_formed_random_polynomials_are_rejected(three_chunks, moduli, raw) -> None:
    hidden, _ = three_chunks
    coeffs = [np.frombuffer(r, dtype=">u2").astype(np.int64) % PRIME for r in raw]
    proofs = [struct.pack(">129H", m, *c.tolist()) for m, c in zip(moduli, coeffs, strict=True)]
    assert all(v.reason == "exp_mismatch" for v in verify_proofs(hidden, proofs))


# ---- a real (tiny) transformer: honest recomputation against cheats ----------------------------

CONFIG = TinyConfig(hidden=1024, mlp=2816, heads=16, layers=3)
GENERATED = 96  # three chunks of 32 values x 1024 (32768 values: the heap path, as in production)
# The honest figures measured on this model stay within exp 4, mean 1.2, median 1 (bf16 against
# fp32 compute); a 1% weight perturbation measures exp 8-10, mean 3.2-3.4, median 3.
CPU_CALIBRATED = Thresholds(max_exp_mismatches=38, max_mant_err_mean=2.0, max_mant_err_median=2.0)


class Rollout:
    """An inference worker's rollout: tokens sampled with a KV cache, their hidden states, proofs."""

    def __init__(self) -> None:
        self.model = TinyLlama(CONFIG, seed=1)
        self.prompt = torch.randint(0, CONFIG.vocab, (16,), generator=torch.Generator().manual_seed(5))
        self.completion, hidden = self.model.generate(self.prompt, GENERATED, seed=3)
        self.proofs = build_proofs(hidden)
        self.recomputed = self.model.recompute(self.prompt, self.completion)

    def recompute(self, model: TinyLlama | None = None, **kwargs) -> torch.Tensor:
        return (model or self.model).recompute(self.prompt, self.completion, **kwargs)


@pytest.fixture(scope="module")
def rollout():
    """One thread for the model tests (the 2-threads variant sets its own): two threads on a
    shared 2-core machine spin against each other and slow every pass several times over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Rollout()
    finally:
        torch.set_num_threads(threads)


def _with_threads(count: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


HONEST = {
    "same-pass": lambda r: r.recomputed,
    "batch-of-3": lambda r: r.recompute(
        batch_with=torch.randint(0, CONFIG.vocab, (2, 16 + GENERATED), generator=torch.Generator().manual_seed(9))
    ),
    "2-threads": lambda r: _with_threads(2, r.recompute),
    "split-matmuls": lambda r: r.recompute(split=2),
    "bf16-compute": lambda r: r.recompute(dtype=torch.bfloat16),
}


@pytest.mark.parametrize("variant", HONEST)
def test_honest_recomputation_is_accepted(rollout: Rollout, variant: str) -> None:
    hidden = HONEST[variant](rollout)
    verdicts = verify_proofs(hidden, rollout.proofs)
    assert [v.reason for v in verdicts] == ["ok"] * 3, verdicts
    # Also inside the tighter envelope used below to catch a 1% weight perturbation.
    assert all(v.ok for v in verify_proofs(hidden, rollout.proofs, thresholds=CPU_CALIBRATED))


def _proofs_from(hidden: torch.Tensor) -> list[bytes]:
    return build_proofs(hidden)


CHEATS = {
    "other-weights": lambda r: _proofs_from(r.recompute(TinyLlama(CONFIG, seed=2))),
    "weights+5%": lambda r: _proofs_from(r.recompute(r.model.perturbed(0.05, seed=11))),
    "prompt-shifted": lambda r: _proofs_from(r.model.recompute(r.prompt[1:], r.completion)),
    "layer-2-of-3": lambda r: _proofs_from(r.recompute(layer=2)),
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_cheats_are_rejected_in_every_chunk(rollout: Rollout, cheat: str) -> None:
    verdicts = verify_proofs(rollout.recomputed, CHEATS[cheat](rollout))
    assert [v.reason for v in verdicts] == ["exp_mismatch"] * 3, verdicts


def test_proofs_swapped_between_chunks_are_rejected(rollout: Rollout) -> None:
    p = rollout.proofs
    verdicts = verify_proofs(rollout.recomputed, [p[1], p[0], p[2]])
    assert [v.reason for v in verdicts] == ["exp_mismatch", "exp_mismatch", "ok"]


@pytest.mark.parametrize("edit", [lambda p: p[:2], lambda p: p + p[-1:]], ids=["truncated", "extra"])
def test_truncated_or_padded_proof_lists_are_rejected(rollout: Rollout, edit) -> None:
    verdicts = verify_proofs(rollout.recomputed, edit(rollout.proofs))
    assert [v.reason for v in verdicts] == ["count_mismatch"] * 3


def test_one_percent_perturbation_needs_calibrated_thresholds(rollout: Rollout) -> None:
    """A limit of TOPLOC, not of this implementation: 1% weight noise moves the final hidden
    states less than the INTELLECT-2 defaults tolerate (they are set for bf16 GPU kernels), so
    the defaults accept it. Its figures are well outside this deployment's honest envelope,
    though, and thresholds calibrated to that envelope reject every chunk."""
    cheat = build_proofs(rollout.recompute(rollout.model.perturbed(0.01, seed=11)))
    by_default = verify_proofs(rollout.recomputed, cheat)
    assert all(v.ok for v in by_default), by_default
    calibrated = verify_proofs(rollout.recomputed, cheat, thresholds=CPU_CALIBRATED)
    assert [v.reason for v in calibrated] == ["mantissa_mean"] * 3, calibrated
