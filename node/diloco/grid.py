"""The shared int grid: why the group average is bit-identical on every member.

hivemind hands each member ``local + (average - local)``, whose fp32 rounding differs between
members, so averaging floats directly never gives equal states. Instead every member contributes
integers ``q`` on a grid the whole group shares (per chunk of ``layout.CHUNK`` elements, a
power-of-two scale ``2^E``, E the group's maximum so nobody clips); integer sums below 2^24 are exact
in fp32 in any order, and each member recovers the exact sum ``S = round(r * n)`` from whatever
hivemind returned. The average ``S * 2^E / n`` is then the same function of the same integers
everywhere. specs/diloco.md section 4 states every step; ``Q`` (the levels) is the compression.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from intellect_node.node.diloco.layout import CHUNK

# fp16: the largest grid IEEE binary16 holds exactly (every integer up to 2048), so its integers
# travel in 2 bytes as OpenDiLoCo's fp16 all-reduce does, yet sum exactly (packing.py, tag 5)
LEVELS = {"int4": 7, "int8": 127, "fp16": 2047, "int16": 32767}
MIN_EXPONENT, MAX_EXPONENT = -126, 127
EXACT_LIMIT = 2**23  # n * Q must stay below this for round(r * n) to recover S exactly


def levels_for(compression: str) -> int:
    try:
        return LEVELS[compression]
    except KeyError:
        raise ValueError(f"unknown compression {compression!r}; choose one of {', '.join(LEVELS)}") from None


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
    """The group's grid: the elementwise maximum of every member's exponents."""
    return torch.stack(all_exponents).amax(dim=0)


def quantize(x: torch.Tensor, shared: torch.Tensor, levels: int) -> torch.Tensor:
    """This member's contribution: integers in [-levels, levels] as fp32 (exact)."""
    scaled = x.to(torch.float64) / _expand(shared, x.numel())
    return torch.round(scaled).clamp(-levels, levels).to(torch.float32)


def recover_sums(returned: torch.Tensor, group_size: int) -> torch.Tensor:
    """The exact integer sums from hivemind's averaged fp32 values over ``group_size`` members."""
    return torch.round(returned.to(torch.float64) * group_size).to(torch.int32)


def average(sums: torch.Tensor, shared: torch.Tensor, group_size: int) -> torch.Tensor:
    """``S * 2^E / n`` in fp64, rounded once to fp32: the same bits on every member."""
    return (sums.to(torch.float64) * _expand(shared, sums.numel()) / group_size).to(torch.float32)


def residual(x: torch.Tensor, q: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """Error feedback: what the grid dropped from ``x``, added to the next round's pseudo-gradient."""
    return (x.to(torch.float64) - q.to(torch.float64) * _expand(shared, x.numel())).to(torch.float32)
