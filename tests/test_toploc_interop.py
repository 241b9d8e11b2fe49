"""crypto.toploc against the reference package ``toploc`` 0.1.6.

The golden-vector tests always run: the reference's bytes and verifier figures are committed
in tests/golden/ (tests/support/toploc_golden.py builds the inputs and regenerates the file). The other
tests need the reference itself (scripts/setup-reference.sh builds it; setup.sh --dev runs
that) and compare on fresh inputs, both directions, and pin where we deliberately differ.
"""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from intellect_node.crypto.toploc import PRIME, build_proofs, unbind_proofs, verify_proofs
from tests.support import toploc_golden
from tests.support.toploc_model import TinyConfig, TinyLlama


@pytest.mark.parametrize("case", toploc_golden.CASES, ids=lambda c: c.name)
def test_golden_bytes_and_figures(case: toploc_golden.Case) -> None:
    golden = toploc_golden.load()[case.name]
    expected = [bytes.fromhex(p) for p in golden["proofs"]]
    hidden = toploc_golden.golden_input(case)
    assert build_proofs(hidden, chunk_size=case.chunk_size, topk=case.topk) == expected
    verdicts = verify_proofs(
        toploc_golden.recomputed_input(case), expected, chunk_size=case.chunk_size, topk=case.topk
    )
    assert [[v.exp_mismatches, v.mant_err_mean, v.mant_err_median] for v in verdicts] == golden["figures"]


def test_golden_cases_cover_ties_nan_and_both_topk_paths() -> None:
    """The golden inputs are only worth something if they hit the hard parts."""
    binomial, ties_case, nan_case, _ = toploc_golden.CASES
    ties = toploc_golden.golden_input(ties_case)[:32].reshape(-1).abs().float()
    threshold = ties.topk(128).values[-1]
    assert (ties == threshold).sum() > 50  # dozens of equal magnitudes at the top-k boundary
    nan_values = toploc_golden.golden_input(nan_case)
    assert nan_values.isnan().any() and nan_values.isinf().any()
    # torch.topk's heap path takes rows of >= 64 * 128 values, nth_element the shorter ones.
    assert 32 * binomial.hidden >= 64 * 128 > (binomial.tokens % 32) * binomial.hidden


# ---- against the installed reference --------------------------------------------------------------


@pytest.fixture(scope="module")
def ref():
    return pytest.importorskip("toploc")


def _ref_build(ref, hidden: torch.Tensor, chunk_size: int = 32, topk: int = 128) -> list[bytes]:
    return ref.build_proofs_bytes(hidden, chunk_size, topk, skip_prefill=True)


def _ref_figures(ref, hidden: torch.Tensor, proofs: list[bytes], chunk_size: int = 32, topk: int = 128):
    results = ref.verify_proofs_bytes(hidden, proofs, chunk_size, topk, skip_prefill=True)
    return [(r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in results]


def _our_figures(hidden: torch.Tensor, proofs: list[bytes], chunk_size: int = 32, topk: int = 128):
    verdicts = verify_proofs(hidden, proofs, chunk_size=chunk_size, topk=topk)
    return [(v.exp_mismatches, v.mant_err_mean, v.mant_err_median) for v in verdicts]


def _model_states(hidden_size: int, tokens: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    config = TinyConfig(hidden=hidden_size, mlp=2 * hidden_size, heads=hidden_size // 64, layers=2)
    model = TinyLlama(config, seed=4)
    sequence = torch.randint(0, config.vocab, (tokens,), generator=torch.Generator().manual_seed(6))
    return model.recompute(sequence[:8], sequence[8:], dtype=dtype)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tokens=st.integers(1, 100),
    width=st.sampled_from([128, 256, 896, 1024]),
    scale=st.sampled_from([1.0, 1 / 8]),
    seed=st.integers(0, 2**16),
)
def test_bytes_equal_the_reference(ref, tokens: int, width: int, scale: float, seed: int) -> None:
    values = torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed))
    hidden = (values / scale).round().mul(scale).to(torch.bfloat16)  # scale 1: heavy ties
    assert build_proofs(hidden) == _ref_build(ref, hidden)


def test_bytes_equal_the_reference_on_model_states(ref) -> None:
    hidden = _model_states(1024, 8 + 70).to(torch.bfloat16)
    assert build_proofs(hidden) == _ref_build(ref, hidden)
    wide = torch.randn(40, 4096, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert build_proofs(wide) == _ref_build(ref, wide)


def test_each_side_verifies_the_others_proofs_with_the_same_figures(ref) -> None:
    prover = _model_states(1024, 8 + 96).to(torch.bfloat16)
    ours, theirs = build_proofs(prover), _ref_build(ref, prover)
    verifiers = {
        "same": prover,
        "bf16-compute": _model_states(1024, 8 + 96, dtype=torch.bfloat16),
        "mantissa-bumped": (prover.float() * 1.03).to(torch.bfloat16),
    }
    for name, hidden in verifiers.items():
        expected = _ref_figures(ref, hidden, theirs)
        assert _our_figures(hidden, theirs) == expected, name
        assert _ref_figures(ref, hidden, ours) == expected, name
    assert _ref_figures(ref, prover, ours) == [(0, 0.0, 0.0)] * 3


def test_bound_proofs_are_the_references_under_the_row_mask(ref) -> None:
    """The protocol's proofs (bound to a row key) are the reference's bytes plus a public mask:
    unbound, they are the reference's to the byte and its verifier gives the same figures; as sent,
    the reference (which knows no key) sees random polynomials, and so does our verifier under any
    other key."""
    prover = _model_states(1024, 8 + 70).to(torch.bfloat16)
    verifier = _model_states(1024, 8 + 70, dtype=torch.bfloat16)
    key = hashlib.sha256(b"interop row").digest()
    bound = build_proofs(prover, key=key)
    theirs = _ref_build(ref, prover)
    assert unbind_proofs(bound, key) == theirs and bound != theirs
    assert [p[:2] for p in bound] == [p[:2] for p in theirs]  # the modulus is not masked
    figures = [(v.exp_mismatches, v.mant_err_mean, v.mant_err_median) for v in verify_proofs(verifier, bound, key=key)]
    assert figures == _ref_figures(ref, verifier, theirs)
    assert all(e > 100 for e, _, _ in _ref_figures(ref, verifier, bound))
    other = hashlib.sha256(b"another row").digest()
    assert all(v.exp_mismatches > 100 for v in verify_proofs(verifier, bound, key=other))


# ---- where we differ on purpose --------------------------------------------------------------------


def test_reference_accepts_a_short_proof_list_we_do_not(ref) -> None:
    hidden = torch.randn(96, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    proofs = build_proofs(hidden)
    assert len(_ref_figures(ref, hidden, proofs[:1])) == 1  # two chunks silently unchecked
    assert [v.reason for v in verify_proofs(hidden, proofs[:1])] == ["count_mismatch"] * 3


def test_reference_ignores_the_sign_we_do_not(ref) -> None:
    hidden = torch.randn(64, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    proofs = build_proofs(hidden)
    assert _ref_figures(ref, -hidden, proofs) == [(0, 0.0, 0.0)] * 2
    assert [v.reason for v in verify_proofs(-hidden, proofs)] == ["exp_mismatch"] * 2


def test_reference_python_verifier_rejects_honest_chunks_we_do_not(ref) -> None:
    """Its Python path evaluates the polynomial at the raw index instead of ``index mod m``; that
    only shows when m < 65497 and indices reach m, i.e. on some chunks of long rows."""
    hidden = torch.randn(160, 4096, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    proofs = build_proofs(hidden)
    small_m = [i for i, p in enumerate(proofs) if struct.unpack(">H", p[:2])[0] < PRIME]
    assert len(small_m) == 3  # this seed has such chunks
    python_path = ref.verify_proofs_bytes(list(hidden), proofs, 32, 128, skip_prefill=True)
    assert all(python_path[i].exp_mismatches > 38 for i in small_m)
    assert all(v.ok and v.exp_mismatches == 0 for v in verify_proofs(hidden, proofs))


def test_fp32_and_fp16_inputs(ref) -> None:
    """The reference cannot prove fp32: it returns all-zero "null" proofs, one more than there are
    chunks. It commits fp16 bit patterns. We round both to bf16, the same way on both sides."""
    full = torch.randn(64, 512, generator=torch.Generator().manual_seed(5))
    null = _ref_build(ref, full)
    assert null == [bytes(258)] * 3
    assert [v.reason for v in verify_proofs(full, null)] == ["count_mismatch"] * 2
    assert [v.reason for v in verify_proofs(full, null[:2])] == ["bad_modulus"] * 2
    assert build_proofs(full) == _ref_build(ref, full.to(torch.bfloat16))
    half = full.to(torch.float16)
    assert build_proofs(half) == _ref_build(ref, half.to(torch.bfloat16)) != _ref_build(ref, half)
