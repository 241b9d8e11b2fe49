"""TOPLOC activation proofs: build them from a rollout's hidden states, verify them against a
recomputation.

A proof commits, for every chunk of ``chunk_size`` generated tokens, to the ``topk`` largest
(by magnitude) entries of the final hidden state (after the last norm) in bf16. Each chunk's
proof is 258 bytes (for topk 128): a big-endian u16 modulus ``m`` followed by 128 big-endian u16
coefficients, lowest power first, of the polynomial over GF(65497) that maps
``flat_index mod m`` to the entry's bf16 bit pattern. ``specs/toploc.md`` is the normative
description; this module is byte-compatible with ``build_proofs_bytes(..., skip_prefill=True)``
of the reference package ``toploc`` 0.1.6 and stricter than its verifier where that is wrong.

Why the code looks the way it does:

- One call handles a whole rollout: the top-k of all chunks, the modulus search, the
  interpolation and the evaluation are batched across chunks (numpy / torch, no C extension).
- Byte compatibility includes *which* of several equal magnitudes the top-k keeps. The
  reference uses ``torch.topk`` on CPU, which for rows of at least ``64 * topk`` elements runs a
  heap selection (``std::partial_sort``) whose choice among ties depends on the row's order.
  Elements that the heap would skip have no effect on it, so we drop elements provably below the
  heap's minimum at their position (bounded from group maxima of the prefix), keep the rest in
  their original order and let ``torch.topk`` run the same heap on that much shorter row. Rows
  that are short or contain NaN go to ``torch.topk`` whole, exactly as in the reference.
- The interpolation uses the barycentric form ``f = sum_i y_i w_i Pi(X) / (X - x_i)`` whose
  heavy parts are small float64 matrix products; every intermediate stays below 2**53, so the
  float arithmetic is exact and the result is the unique interpolating polynomial, equal to
  the reference's Newton form coefficient for coefficient.
- A proof is bound to its row, chunk and checkpoint by a key (``key=``): the coefficients are the
  reference's plus a mask polynomial drawn from ``(key, chunk index)``. Activations alone cannot
  bind a row: siblings of one prompt have nearly the same states on short rows (the first state
  of every completion is the prompt's last, identical across the group; the last token never
  enters a state at all), within the tolerance TOPLOC must grant honest recomputation. A mask
  removed with the wrong key leaves a uniformly random polynomial: about ``topk`` exponent
  mismatches. The modulus and the reference's coefficients are unchanged underneath
  (``unbind_proofs`` recovers them), so interop stays byte for byte.
- ``verify_proofs`` never raises because of the proofs: any malformed proof, a wrong number of
  proofs or a non-bytes item is a rejection with a stable reason string. It raises only for
  invalid local arguments (the verifier's own hidden states or parameters).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

PRIME: Final = 65497
"""The field GF(65497): the reference's prime, below 2**16 so that coefficients fit a u16."""

NOT_MEASURED: Final = float(2**64)
"""Mantissa figure when no mantissa was compared; the reference reports the same value."""

DEFAULT_CHUNK_SIZE: Final = 32
DEFAULT_TOPK: Final = 128
MASK_DOMAIN: Final = b"intellect-node/toploc/chunk-mask/v1"
"""Domain of the SHAKE-256 stream a chunk's mask polynomial is drawn from (specs/toploc.md 3.1)."""

_INV_PRIME: Final = 1.0 / PRIME
_SIGN_EXP_SHIFT: Final = 7  # bf16: 1 sign bit, 8 exponent bits, 7 mantissa bits
_MANT_MASK: Final = 0x7F
_MAG_MASK: Final = 0x7FFF
_NAN_FLOOR: Final = 0x7F80  # magnitude bits above this are NaN (0x7F80 itself is inf)
# torch.topk on CPU switches from nth_element to a heap (partial_sort) at this many elements per k.
_HEAP_ROW_FACTOR: Final = 64
# Prefilter geometry: stretches of 1024 elements, each split into 64 groups of 16 elements taken
# at stride 64, so a group maximum is an elementwise max of 16 contiguous vectors (fast).
_STRETCH: Final = 1024
_LANES: Final = 64
_POWER_SPLIT: Final = 16  # x^d = x^(16a) * x^b: powers up to 16 and of x^16, not of all degrees


@dataclass(frozen=True)
class Thresholds:
    """Acceptance limits for one chunk; a figure equal to its limit passes.

    The defaults are INTELLECT-2's: honest recomputation on other hardware, batch sizes or
    kernels changes a few low mantissa bits and, through near-ties in the top-k, a few of the
    selected positions; tampering changes exponents and large mantissa fractions.
    """

    max_exp_mismatches: int = 38
    max_mant_err_mean: float = 10.0
    max_mant_err_median: float = 8.0


@dataclass(frozen=True)
class ChunkVerdict:
    """The verdict for one chunk of tokens.

    ``exp_mismatches`` counts top-k entries whose sign or exponent differ (the reference ignores
    the sign); ``mant_err_mean`` and ``mant_err_median`` are over the absolute mantissa
    differences of the other entries (median: the upper one, as the reference's C++ verifier).
    When nothing was measured (a malformed proof, a count mismatch) the figures are ``topk`` and
    ``NOT_MEASURED``. ``reason`` is one of ``ok``, ``exp_mismatch``, ``mantissa_mean``,
    ``mantissa_median``, ``malformed_type``, ``malformed_length``, ``bad_modulus``,
    ``coefficient_out_of_field``, ``count_mismatch``.
    """

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    ok: bool
    reason: str


def proof_size(topk: int = DEFAULT_TOPK) -> int:
    """Bytes in one chunk's proof: the u16 modulus and ``topk`` u16 coefficients."""
    return 2 + 2 * topk


def chunk_count(tokens: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
    """Proofs for ``tokens`` generated tokens: one per started chunk (the last may be short)."""
    return -(-tokens // chunk_size)


def build_proofs(
    hidden: torch.Tensor,
    *,
    key: bytes | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    topk: int = DEFAULT_TOPK,
) -> list[bytes]:
    """Proofs for the generated tokens' final hidden states ``hidden`` of shape [tokens, hidden].

    fp32 / fp16 inputs are rounded to bf16 first (round to nearest even, as ``Tensor.to``), the
    same way ``verify_proofs`` does, so prover and verifier compare the same numbers. Without a
    ``key``, equals the reference's ``build_proofs_bytes(hidden, chunk_size, topk,
    skip_prefill=True)`` for bf16: activations only, which any row with similar states also
    passes. With a ``key`` (the protocol's row key, ``protocol.rollouts.proof_key``), chunk c's
    coefficients carry the mask of ``(key, c)``: ``bind_proofs`` of the unbound bytes.
    Raises ``ValueError`` for invalid arguments, including a chunk of fewer than ``topk`` values
    (where the reference logs an error and returns all-zero proofs).
    """
    rows = _as_bf16(hidden, chunk_size, topk)
    _check_key(key)
    positions = _chunk_topk_positions(rows, chunk_size, topk)
    if positions.shape[0] == 0:
        return []
    bits = _gather_bits(rows, chunk_size, positions)
    moduli = _injective_moduli(positions)
    xs = positions % moduli[:, None]
    coeffs = _interpolate(xs, bits)
    if key is not None:
        coeffs = (coeffs + chunk_masks(key, positions.shape[0], topk)) % PRIME
    table = np.empty((positions.shape[0], topk + 1), dtype=">u2")
    table[:, 0] = moduli
    table[:, 1:] = coeffs
    blob = table.tobytes()
    size = proof_size(topk)
    return [blob[i : i + size] for i in range(0, len(blob), size)]


def verify_proofs(
    hidden: torch.Tensor,
    proofs: Sequence[bytes],
    *,
    key: bytes | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    topk: int = DEFAULT_TOPK,
    thresholds: Thresholds | None = None,
) -> list[ChunkVerdict]:
    """Check ``proofs`` against recomputed final hidden states ``hidden`` [tokens, hidden].

    ``key`` is the row key the proofs must have been built with (None: unbound proofs, the
    reference's); chunk c's mask of ``(key, c)`` is removed before the polynomial is evaluated,
    so a proof built for another row, step or chunk evaluates to random values here and fails
    as ``exp_mismatch`` with nearly every entry mismatched.

    Returns one verdict per chunk. If ``proofs`` is not a list or tuple, or holds a different
    number of proofs than there are chunks, every verdict is a rejection (``malformed_type`` /
    ``count_mismatch``), and there is always at least one: ``all(v.ok for v in verdicts)`` is a
    safe acceptance test even for zero tokens. A malformed single proof rejects its own chunk.
    Raises ``ValueError`` only for invalid ``hidden``, ``key``, ``chunk_size`` or ``topk``.
    """
    limits = thresholds if thresholds is not None else Thresholds()
    rows = _as_bf16(hidden, chunk_size, topk)
    _check_key(key)
    chunks = chunk_count(rows.shape[0], chunk_size)
    if not isinstance(proofs, (list, tuple)):
        return [_unmeasured("malformed_type", topk)] * max(chunks, 1)
    if len(proofs) != chunks:
        return [_unmeasured("count_mismatch", topk)] * max(chunks, 1)
    if chunks == 0:
        return []
    moduli, coeffs, problems = _parse_proofs(proofs, topk)
    if key is not None:
        coeffs = (coeffs - chunk_masks(key, chunks, topk)) % PRIME
    positions = _chunk_topk_positions(rows, chunk_size, topk)
    actual = _gather_bits(rows, chunk_size, positions)
    good = np.array([p is None for p in problems])
    expected = np.zeros_like(actual)
    if good.any():
        xs = positions[good] % moduli[good, None]
        expected[good] = _evaluate(coeffs[good], xs)
    exp_mm, mean, median = _figures(expected, actual)
    verdicts = []
    for i, problem in enumerate(problems):
        if problem is not None:
            verdicts.append(_unmeasured(problem, topk))
        else:
            verdicts.append(_judge(int(exp_mm[i]), float(mean[i]), float(median[i]), limits))
    return verdicts


def chunk_masks(key: bytes, chunks: int, topk: int = DEFAULT_TOPK, *, first: int = 0) -> np.ndarray:
    """[chunks, topk] mask coefficients in [0, PRIME) of chunks ``first ..`` of the row ``key``.

    Chunk c's mask is SHAKE-256 of ``MASK_DOMAIN || u16be(len(key)) || key || u32be(c)``, read as
    ``topk`` big-endian u16 values reduced mod PRIME. The reduction makes 0..38 twice as likely as
    other values (39 of 65536 draws): harmless, since the mask only has to differ between rows and
    chunks, and two bytes per value keep the hashing a few microseconds per chunk. Deterministic
    and public: it binds, it hides nothing.
    """
    _check_key(key)
    if key is None:
        raise ValueError("a mask needs a key")
    prefix = MASK_DOMAIN + len(key).to_bytes(2, "big") + key
    stream = b"".join(hashlib.shake_256(prefix + c.to_bytes(4, "big")).digest(2 * topk)
                      for c in range(first, first + chunks))
    return np.frombuffer(stream, dtype=">u2").reshape(chunks, topk).astype(np.int64) % PRIME


def bind_proofs(
    proofs: Sequence[bytes], key: bytes, *, first_chunk: int = 0, topk: int = DEFAULT_TOPK
) -> list[bytes]:
    """Unbound proofs (the reference's bytes) of chunks ``first_chunk ..`` of row ``key``, bound:
    each coefficient plus its mask, mod PRIME; the modulus is unchanged. Raises ``ValueError`` on
    a malformed proof: these are the caller's own."""
    return _shift([proofs], [key], first_chunk, topk, 1)[0]


def unbind_proofs(
    proofs: Sequence[bytes], key: bytes, *, first_chunk: int = 0, topk: int = DEFAULT_TOPK
) -> list[bytes]:
    """The inverse of ``bind_proofs``: the reference's bytes under bound proofs (interop tests)."""
    return _shift([proofs], [key], first_chunk, topk, -1)[0]


def bind_rows(
    rows: Sequence[Sequence[bytes]], keys: Sequence[bytes], *, topk: int = DEFAULT_TOPK
) -> list[list[bytes]]:
    """``[bind_proofs(proofs, key) for proofs, key in zip(rows, keys)]`` in one table: for a
    prover that builds many rows' chunks in one call (``node.engine.proofs``), where binding
    row by row would cost a tenth of the proving."""
    if len(rows) != len(keys):
        raise ValueError("need one key per row")
    return _shift(rows, keys, 0, topk, 1)


def _shift(
    rows: Sequence[Sequence[bytes]], keys: Sequence[bytes], first: int, topk: int, sign: int
) -> list[list[bytes]]:
    """Every row's proofs with its masks (of chunks ``first ..``) added (sign 1) or removed (-1)."""
    size = proof_size(topk)
    flat = [proof for proofs in rows for proof in proofs]
    if any(not isinstance(proof, bytes) or len(proof) != size for proof in flat):
        raise ValueError(f"cannot bind a proof that is not {size} bytes")
    masks = [chunk_masks(key, len(proofs), topk, first=first) for proofs, key in zip(rows, keys, strict=True) if proofs]
    if not masks:
        return [[] for _ in rows]
    table = np.frombuffer(b"".join(flat), dtype=">u2").reshape(len(flat), topk + 1).astype(np.int64)
    if not ((table[:, 0] >= topk) & (table[:, 0] <= PRIME)).all() or (table[:, 1:] >= PRIME).any():
        raise ValueError("cannot bind a proof with a bad modulus or a coefficient outside the field")
    table[:, 1:] = (table[:, 1:] + sign * np.concatenate(masks)) % PRIME
    blob = table.astype(">u2").tobytes()
    out, start = [], 0
    for proofs in rows:
        out.append([blob[(start + i) * size : (start + i + 1) * size] for i in range(len(proofs))])
        start += len(proofs)
    return out


def _check_key(key: object) -> None:
    if key is not None and not (isinstance(key, bytes) and 1 <= len(key) <= 0xFFFF):
        raise ValueError("key must be None or 1 to 65535 bytes")


_MEASURED_REASONS = frozenset({"ok", "exp_mismatch", "mantissa_mean", "mantissa_median"})


def rejudge(verdict: ChunkVerdict, limits: Thresholds) -> ChunkVerdict:
    """The verdict a measured chunk gets under other ``limits`` (a validator judging one
    measurement against two bounds); a chunk that was never measured stays rejected."""
    if verdict.reason not in _MEASURED_REASONS:
        return verdict
    return _judge(verdict.exp_mismatches, verdict.mant_err_mean, verdict.mant_err_median, limits)


def _unmeasured(reason: str, topk: int) -> ChunkVerdict:
    return ChunkVerdict(topk, NOT_MEASURED, NOT_MEASURED, False, reason)


def _judge(exp_mm: int, mean: float, median: float, limits: Thresholds) -> ChunkVerdict:
    if exp_mm > limits.max_exp_mismatches:
        reason = "exp_mismatch"
    elif mean > limits.max_mant_err_mean:
        reason = "mantissa_mean"
    elif median > limits.max_mant_err_median:
        reason = "mantissa_median"
    else:
        reason = "ok"
    return ChunkVerdict(exp_mm, mean, median, reason == "ok", reason)


def _as_bf16(hidden: torch.Tensor, chunk_size: int, topk: int) -> torch.Tensor:
    """Validate the local arguments and return ``hidden`` as a contiguous CPU bf16 tensor."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError("hidden must be a 2-D torch.Tensor [tokens, hidden]")
    if not hidden.is_floating_point():
        raise ValueError(f"hidden must be floating point, got {hidden.dtype}")
    if not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError("chunk_size must be a positive int")
    if not (isinstance(topk, int) and 1 <= topk <= PRIME):
        raise ValueError(f"topk must be an int in [1, {PRIME}]")
    tokens, width = hidden.shape
    if tokens:
        smallest = min(tokens % chunk_size or chunk_size, chunk_size) * width
        if smallest < topk:
            raise ValueError(f"a chunk of {smallest} values cannot hold top-{topk}")
        if chunk_size * width >= 2**31:
            raise ValueError("chunks of 2**31 values or more are not supported (u32 indices)")
    return hidden.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()


def _chunk_views(rows: torch.Tensor, chunk_size: int) -> list[torch.Tensor]:
    """The full chunks as one [chunks, chunk_size * hidden] view, then the short tail chunk."""
    tokens, width = rows.shape
    full = tokens // chunk_size
    views = []
    if full:
        views.append(rows[: full * chunk_size].view(full, chunk_size * width))
    if tokens % chunk_size:
        views.append(rows[full * chunk_size :].reshape(1, -1))
    return views


def _chunk_topk_positions(rows: torch.Tensor, chunk_size: int, topk: int) -> np.ndarray:
    """Flat positions (within each chunk) of the top-k magnitudes: [chunks, topk] int64."""
    parts = [_topk_positions(view, topk) for view in _chunk_views(rows, chunk_size)]
    if not parts:
        return np.empty((0, topk), dtype=np.int64)
    return np.concatenate(parts)


def _gather_bits(rows: torch.Tensor, chunk_size: int, positions: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (as int64 in [0, 65535]) at ``positions`` of each chunk."""
    parts = []
    start = 0
    for view in _chunk_views(rows, chunk_size):
        flat = view.view(torch.int16).numpy().view(np.uint16)
        count = view.shape[0]
        parts.append(np.take_along_axis(flat, positions[start : start + count], axis=1))
        start += count
    return np.concatenate(parts).astype(np.int64)


def _topk_positions(chunks: torch.Tensor, k: int) -> np.ndarray:
    """Indices of the k largest |values| per row of a contiguous bf16 [rows, n] tensor.

    The same set as ``chunks.abs().topk(k).indices`` row by row (torch's CPU kernel), ties
    included. Rows short enough for torch's nth_element path, or holding NaN, go to torch whole.
    For the others, the heap that torch runs only ever admits an element strictly greater than
    its current minimum, the k-th largest value of the prefix. Group maxima of the prefix give a
    lower bound for that minimum; elements not above the bound of their region are never
    admitted, and leaving them out changes nothing in the heap. The survivors, in order and
    padded past 64k elements with -1 (never admitted either), go through ``torch.topk``.
    """
    count, n = chunks.shape
    head = _STRETCH * -(-k // _LANES)  # the first stretches whose groups number at least k
    if n < _HEAP_ROW_FACTOR * k or n < 4 * head:
        return chunks.abs().topk(k).indices.numpy()
    mag = chunks.view(torch.int16).numpy() & np.int16(_MAG_MASK)
    stretches = n // _STRETCH
    groups = (
        torch.from_numpy(mag[:, : stretches * _STRETCH])
        .reshape(count, stretches, _STRETCH // _LANES, _LANES)
        .amax(dim=2)
        .reshape(count, stretches * _LANES)
        .numpy()
    )
    has_nan = groups.max(axis=1) > _NAN_FLOOR
    if n > stretches * _STRETCH:
        has_nan |= mag[:, stretches * _STRETCH :].max(axis=1) > _NAN_FLOOR
    out = np.empty((count, k), dtype=np.int64)
    if has_nan.any():
        out[has_nan] = chunks[torch.from_numpy(has_nan)].abs().topk(k).indices.numpy()
        keep = ~has_nan
        if not keep.any():
            return out
        mag, groups = mag[keep], groups[keep]
        out[keep] = _heap_topk(mag, groups, k, head)
        return out
    return _heap_topk(mag, groups, k, head)


def _heap_topk(mag: np.ndarray, groups: np.ndarray, k: int, head: int) -> np.ndarray:
    """The prefiltered heap selection of ``_topk_positions`` on NaN-free magnitude rows."""
    count, n = mag.shape
    mask = np.empty((count, n), dtype=bool)
    mask[:, :head] = True
    best = groups[:, :0]
    used = 0
    start = head
    while start < n:
        # Regions [start, 2 * start): bound = k-th largest group maximum before `start`.
        upto = (start // _STRETCH) * _LANES
        pool = np.concatenate([best, groups[:, used:upto]], axis=1)
        best = np.partition(pool, pool.shape[1] - k, axis=1)[:, -k:]
        used = upto
        end = min(2 * start, n)
        np.greater(mag[:, start:end], best[:, :1], out=mask[:, start:end])
        start = end
    flat = np.flatnonzero(mask)
    ends = np.searchsorted(flat, np.arange(1, count + 1) * n)
    starts = np.concatenate(([0], ends[:-1]))
    counts = ends - starts
    width = max(int(counts.max()), _HEAP_ROW_FACTOR * k)
    # Survivor j of row r (j counted from the row's first survivor) goes to r * width + j.
    slots = np.arange(flat.size) + np.repeat(np.arange(count) * width - starts, counts)
    compact = np.full(count * width, -1, dtype=np.int16)
    compact[slots] = mag.reshape(-1)[flat]
    chosen = torch.from_numpy(compact.reshape(count, width)).topk(k).indices.numpy()
    return flat[starts[:, None] + chosen] - (np.arange(count) * n)[:, None]


def _injective_moduli(positions: np.ndarray) -> np.ndarray:
    """Per row, the largest m <= PRIME under which the positions have distinct residues.

    As the reference, it tries m = 65497, 65496, ... in order; m < k can never work. Almost every
    row succeeds within a few tries, so candidates are tested in growing blocks.
    """
    count, k = positions.shape
    moduli = np.zeros(count, dtype=np.int64)
    todo = np.arange(count)
    top, block = PRIME, 1
    while todo.size:
        if top < k:
            raise RuntimeError("no injective modulus")  # would need >= 65370 colliding moduli
        candidates = np.arange(top, max(top - block, k - 1), -1)
        residues = np.sort(positions[todo, None, :] % candidates[None, :, None], axis=-1)
        works = (np.diff(residues, axis=-1) != 0).all(axis=-1)
        found = works.any(axis=1)
        moduli[todo[found]] = candidates[works[found].argmax(axis=1)]
        todo = todo[~found]
        top -= candidates.size
        block = min(block * 8, 512)
    return moduli


def _parse_proofs(
    proofs: Sequence[object], topk: int
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Split well-formed proofs into moduli [n] and coefficients [n, topk]; name the problems."""
    size = proof_size(topk)
    problems: list[str | None] = []
    table = np.zeros((len(proofs), topk + 1), dtype=np.int64)
    for i, proof in enumerate(proofs):
        if not isinstance(proof, (bytes, bytearray, memoryview)):
            problems.append("malformed_type")
            continue
        raw = bytes(proof)
        if len(raw) != size:
            problems.append("malformed_length")
            continue
        table[i] = np.frombuffer(raw, dtype=">u2")
        problems.append(None)
    moduli, coeffs = table[:, 0], table[:, 1:]
    for i in range(len(proofs)):
        if problems[i] is None:
            if not topk <= moduli[i] <= PRIME:
                problems[i] = "bad_modulus"
            elif coeffs[i].max() >= PRIME:
                problems[i] = "coefficient_out_of_field"
    return moduli, coeffs, problems


def _figures(expected: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row: sign/exponent mismatches, mean and upper median of the other mantissa errors."""
    mismatch = (expected >> _SIGN_EXP_SHIFT) != (actual >> _SIGN_EXP_SHIFT)
    errors = np.abs((expected & _MANT_MASK) - (actual & _MANT_MASK))
    compared = (~mismatch).sum(axis=1)
    total = np.where(mismatch, 0, errors).sum(axis=1)
    ranked = np.sort(np.where(mismatch, _MANT_MASK + 1, errors), axis=1)
    measured = compared > 0
    mean = np.full(expected.shape[0], NOT_MEASURED)
    median = np.full(expected.shape[0], NOT_MEASURED)
    mean[measured] = total[measured] / compared[measured]
    rows = np.flatnonzero(measured)
    median[measured] = ranked[rows, compared[measured] // 2]
    return mismatch.sum(axis=1), mean, median


# ---- arithmetic in GF(PRIME), batched over rows, exact in float64 ------------------------------


def _reduce(a: np.ndarray) -> np.ndarray:
    """``a mod PRIME`` for integer-valued float64 |a| < 2**50; gives PRIME for some multiples.

    ``floor(a / p)`` computed as ``floor(a * (1/p))`` is exact except just below a multiple of
    ``p``, where it yields ``p`` instead of 0: a representative of the same class, harmless in
    further products (all stay far below 2**53). ``_exact`` finishes the job where it matters.
    """
    return a - np.floor(a * _INV_PRIME) * PRIME


def _exact(a: np.ndarray) -> np.ndarray:
    r = _reduce(a)
    r[r >= PRIME] -= PRIME
    return r


_INVERSES: np.ndarray | None = None


def _inverse_table() -> np.ndarray:
    """Multiplicative inverses of 0..PRIME-1 (0 maps to 0), by Fermat, built once on first use."""
    global _INVERSES
    if _INVERSES is None:
        base = np.arange(PRIME, dtype=np.int64)
        result = np.ones(PRIME, dtype=np.int64)
        exponent = PRIME - 2
        while exponent:
            if exponent & 1:
                result = result * base % PRIME
            base = base * base % PRIME
            exponent >>= 1
        _INVERSES = result.astype(np.float64)
    return _INVERSES


def _powers(x: np.ndarray, count: int) -> np.ndarray:
    """[rows, count, n]: x^0 .. x^(count-1) mod PRIME for x of shape [rows, n], by doubling."""
    out = np.empty((x.shape[0], count, x.shape[1]))
    out[:, 0] = 1.0
    filled, step = 1, x
    while filled < count:
        take = min(filled, count - filled)
        out[:, filled : filled + take] = _reduce(out[:, :take] * step[:, None, :])
        filled += take
        step = _reduce(step * step)
    return out


def _power_basis(x: np.ndarray, degrees: int) -> tuple[np.ndarray, np.ndarray]:
    """x^b (b < 16) and x^(16a) (16a < degrees), so that x^(16a+b) is one product away."""
    low = _powers(x, _POWER_SPLIT)
    x16 = _reduce(low[:, -1] * x)
    high = _powers(x16, -(-degrees // _POWER_SPLIT))
    return low, high


def _split(coeffs: np.ndarray, blocks: int) -> np.ndarray:
    """[rows, d] coefficients as [rows, blocks, 16], zero-padded: c[16a + b] at [a, b]."""
    padded = np.zeros((coeffs.shape[0], blocks * _POWER_SPLIT))
    padded[:, : coeffs.shape[1]] = coeffs
    return padded.reshape(coeffs.shape[0], blocks, _POWER_SPLIT)


def _eval_with_basis(coeffs: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """f(x) = sum_a x^(16a) sum_b c[16a+b] x^b: one batched product, then a short sum."""
    inner = _reduce(np.matmul(_split(coeffs, high.shape[1]), low))  # [rows, blocks, n]
    return _exact(_reduce(inner * high).sum(axis=1))


def _polymul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Products of polynomial pairs [..., L] x [..., L] -> [..., 2L-1] (sums < 2**53: exact)."""
    length = a.shape[-1]
    padded = np.zeros(a.shape[:-1] + (3 * length - 2,))
    padded[..., length - 1 : 2 * length - 1] = a
    windows = sliding_window_view(padded, length, axis=-1)  # [i, j] = a[i + j - (L-1)]
    return _reduce(np.einsum("...ij,...j->...i", windows, b[..., ::-1]))


def _vanishing(x: np.ndarray) -> np.ndarray:
    """Coefficients of Pi(X) = prod_j (X - x_j), [rows, n+1], by a product tree."""
    rows, n = x.shape
    polys = np.stack([_reduce(-x), np.ones_like(x)], axis=-1)  # [rows, n, 2]
    while polys.shape[1] > 1:
        if polys.shape[1] % 2:
            one = np.zeros((rows, 1, polys.shape[2]))
            one[..., 0] = 1.0
            polys = np.concatenate([polys, one], axis=1)
        polys = _polymul(polys[:, 0::2], polys[:, 1::2])
    return polys[:, 0, : n + 1]


def _interpolate(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Coefficients (lowest first) of the polynomial of degree < n through (x_i, y_i) mod PRIME.

    Lagrange in barycentric form: f(X) = sum_i v_i Pi(X)/(X - x_i) with v_i = y_i / Pi'(x_i).
    Synthetic division gives coefficient j of Pi(X)/(X - x_i) as sum_{l>j} pi_l x_i^(l-j-1), so
    f_j = sum_m pi_(j+1+m) S_m with the weighted power sums S_m = sum_i v_i x_i^m.
    """
    rows, n = xs.shape
    x = xs.astype(np.float64)
    y = _reduce(ys.astype(np.float64))
    low, high = _power_basis(x, n)
    pi = _vanishing(x)
    slope = _eval_with_basis(_reduce(pi[:, 1:] * np.arange(1, n + 1)), low, high)  # Pi'(x_i)
    v = _reduce(y * _inverse_table()[slope.astype(np.int64)])
    # S_(16a+b) = sum_i (v_i x_i^b) x_i^(16a): [rows, 16, n] @ [rows, n, blocks]
    sums = _reduce(np.matmul(_reduce(low * v[:, None, :]), high.transpose(0, 2, 1)))
    power_sums = sums.transpose(0, 2, 1).reshape(rows, -1)[:, :n]
    shifted = np.zeros((rows, 2 * n - 1))
    shifted[:, :n] = pi[:, 1:]
    hankel = sliding_window_view(shifted, n, axis=-1)  # [rows, n, n]: pi_(1+j+m)
    return _exact(np.einsum("rjm,rm->rj", hankel, power_sums)).astype(np.int64)


def _evaluate(coeffs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """f(x) mod PRIME for each row's polynomial [rows, d] at that row's points [rows, n]."""
    low, high = _power_basis(xs.astype(np.float64), coeffs.shape[1])
    return _eval_with_basis(coeffs.astype(np.float64), low, high).astype(np.int64)
