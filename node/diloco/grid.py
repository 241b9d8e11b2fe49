"""The shared int grid: why the group average is bit-identical on every member.

hivemind hands each member ``local + (average - local)``, whose fp32 rounding differs between
members, so averaging floats directly never gives equal states. Instead every member contributes
integers ``q`` on a grid the whole group shares (per chunk of ``layout.CHUNK`` elements, a
power-of-two scale ``2^E``, E the group's maximum so nobody clips); integer sums below 2^24 are exact
in fp32 in any order, and each member recovers the exact sum ``S = round(r * n)`` from whatever
hivemind returned. The average ``S * 2^E / n`` is then the same function of the same integers
everywhere. specs/diloco.md section 4 states every step; ``Q`` (the levels) is the compression.

Sparse compressions (``topk<k>``, SparseLoCo-style) use the same grid with ``Q = 2`` and keep only
the ``k`` largest ``|x|`` of each chunk (codes -2, -1, 1, 2; everything else is zero, carried in the
error-feedback residual): integer sums over the union of the members' indices are exact just the
same (section 4a). Why the shared exponent is a clipped median and not the maximum, and why every
received part is checked (``contribution_error``): a member must not be able to scale the grid, or
its own values on it, to steer the average (section 8).
"""

from __future__ import annotations

import hashlib
import struct

import torch
import torch.nn.functional as F

from intellect_node.node.diloco.layout import CHUNK

HEADROOM = 1  # the shared exponent is at most the group's lower median + this (section 8)
MIN_EXPONENT, MAX_EXPONENT = -126, 127
EXACT_LIMIT = 2**23  # n * Q must stay below this for round(r * n) to recover S exactly


def agreement(run_digest: bytes, levels: int, k: int) -> bytes:
    """What the members of a round sign and compare (the gather payload's ``layout``): the run
    digest bound to the grid, so members on another compression never share a round."""
    return hashlib.sha256(b"intellect-node/diloco-grid/v2\0" + run_digest + struct.pack(">HH", levels, k)).digest()


def max_group(levels: int) -> int:
    """The largest group whose sums this grid recovers exactly."""
    return (EXACT_LIMIT - 1) // levels


def _chunked(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x, (0, (-x.numel()) % CHUNK)).view(-1, CHUNK)


def _expand(exponents: torch.Tensor, n: int) -> torch.Tensor:
    """Per-element scale 2^E (fp64) from per-chunk exponents."""
    return torch.ldexp(torch.ones(exponents.numel(), dtype=torch.float64),
                       exponents.to(torch.float64)).repeat_interleave(CHUNK)[:n]


def exponents(x: torch.Tensor, levels: int) -> torch.Tensor:
    """Per-chunk E (int8) with ``max|x| <= levels * 2^E``: the smallest such E within the clamp."""
    if x.dtype != torch.float32 or x.dim() != 1:
        raise ValueError("exponents need a flat fp32 vector")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("the pseudo-gradient holds NaN or infinity; refusing to average it")
    peak = _chunked(x).abs().amax(dim=1).to(torch.float64)
    e = torch.ceil(torch.log2(peak / levels)).nan_to_num(MIN_EXPONENT, MAX_EXPONENT, MIN_EXPONENT)
    e = e.clamp(MIN_EXPONENT, MAX_EXPONENT)
    # log2 may round either way at a boundary: fix up so the bound holds exactly (it is local anyway)
    e = torch.where(peak > levels * torch.ldexp(torch.ones_like(e), e), e + 1, e).clamp(MIN_EXPONENT, MAX_EXPONENT)
    return e.to(torch.int8)


def shared_exponents(all_exponents: list[torch.Tensor]) -> torch.Tensor:
    """The group's grid, per chunk: the members' maximum, but at most their lower median plus
    ``HEADROOM``, so no minority of members can raise the scale everyone's values are bounded by
    (a member above it clips, and its error feedback keeps what was clipped)."""
    stacked = torch.stack(all_exponents).to(torch.int16)
    lower_median = stacked.sort(dim=0).values[(len(all_exponents) - 1) // 2]
    return torch.minimum(stacked.amax(dim=0), lower_median + HEADROOM).to(torch.int8)


def _top_k_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """True at the ``k`` largest ``|x|`` of each chunk (ties: the lower index, the same on every run).

    Why not a stable sort: the k-th largest value and one cumulative count of the values tied with
    it give the same mask at a quarter of the time (it runs twice per round, on the training core)."""
    magnitude = _chunked(x.abs())
    kth = torch.topk(magnitude, k, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    above = magnitude > kth
    tied = magnitude == kth
    room = k - above.sum(dim=1, keepdim=True)
    return (above | (tied & (tied.cumsum(dim=1) <= room))).view(-1)[:x.numel()]


def quantize(x: torch.Tensor, shared: torch.Tensor, levels: int, k: int = 0) -> torch.Tensor:
    """This member's contribution: integers in [-levels, levels] as fp32 (exact); with ``k``, only
    the ``k`` largest ``|x|`` of each chunk are kept (the rest is zero and stays in the residual)."""
    scaled = x.to(torch.float64) / _expand(shared, x.numel())
    q = torch.round(scaled).clamp(-levels, levels).to(torch.float32)
    return q * _top_k_mask(x, k) if k else q


def contribution_error(part: torch.Tensor, weight: float, levels: int, k: int) -> str | None:
    """Why a member's part (as a reducer receives it) is not an honest grid contribution, or None.
    Parts start on chunk boundaries (section 4a), so each ``CHUNK`` of the part is one grid chunk."""
    if weight != 1.0:
        return f"weight {weight!r}, every member weighs 1"
    if not bool(torch.isfinite(part).all()) or not bool((part == part.round()).all()):
        return "values that are not grid integers"
    peak = float(part.abs().max()) if part.numel() else 0.0
    if peak > levels:
        return f"a value of magnitude {peak:g}, over the grid's {levels}"
    if k:
        most = int((_chunked(part) != 0).sum(dim=1).max()) if part.numel() else 0
        if most > k:
            return f"{most} nonzero values in one chunk, over k = {k}"
    return None


def sums_error(returned: torch.Tensor, group_size: int, levels: int, k: int) -> str | None:
    """Why the values one reducer's replies left in a member's span (hivemind's average, before
    ``recover_sums``) cannot be the average of ``group_size`` honest contributions, or None. Checked
    in fp64 before any integer cast: a NaN, an infinity or a huge value would otherwise become some
    int32 (INT_MIN, whose ``abs`` is itself) that passes a bound. Spans start on chunk boundaries
    (section 4a). A reducer that replies anything else lies about the group's average."""
    scaled = returned.to(torch.float64) * group_size
    if not bool(torch.isfinite(scaled).all()):
        return "sums that are not finite"
    peak = float(scaled.abs().max()) if scaled.numel() else 0.0
    if peak > group_size * levels + 0.5:  # an honest sum rounds to at most n * Q
        return f"a sum of magnitude {peak:g}, over {group_size} members x {levels} levels"
    if k:
        most = int((_chunked(torch.round(scaled)) != 0).sum(dim=1).max()) if scaled.numel() else 0
        if most > group_size * k:
            return f"{most} nonzero sums in one chunk, over {group_size} members x k = {k}"
    return None


def recover_sums(returned: torch.Tensor, group_size: int) -> torch.Tensor:
    """The exact integer sums from hivemind's averaged fp32 values over ``group_size`` members."""
    return torch.round(returned.to(torch.float64) * group_size).to(torch.int32)


def average(sums: torch.Tensor, shared: torch.Tensor, group_size: int) -> torch.Tensor:
    """``S * 2^E / n`` in fp64, rounded once to fp32: the same bits on every member."""
    return (sums.to(torch.float64) * _expand(shared, sums.numel()) / group_size).to(torch.float32)


def residual(x: torch.Tensor, q: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """Error feedback: what the grid dropped from ``x``, added to the next round's pseudo-gradient."""
    return (x.to(torch.float64) - q.to(torch.float64) * _expand(shared, x.numel())).to(torch.float32)
