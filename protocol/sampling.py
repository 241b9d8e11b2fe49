"""Verifiable sampling: the token at each position is a public function of the seed and the model.

TOPLOC and the logprob check prove that a checkpoint's activations match the submitted tokens,
not that the checkpoint chose them. Making the choice itself a deterministic function of
(public per-completion seed, position, the model's distribution under the run's temperature and
top-p) lets any validator replay every token from its own prefill logits: a greedy, best-of-N,
edited or cheap-model completion fails the replay at its first forged token.

The design is inverse-CDF over the canonical (token id) order with one keyed uniform per
position (specs/sampling.md, including why it beat an exponential race by measurement). The
uniform comes from SHA-256 of the seed and the position, never from a device random generator,
so torch, vLLM, CPU and GPU draw the same number. Computation is in float64; the validator
accepts a token when the uniform falls inside the token's CDF interval widened by a slack that
absorbs honest numeric noise between engines (``margins``).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

UNIFORM_DOMAIN = b"intellect-node/sampling/uniform/v1"
MAX_TOP_P_ALTERNATIVES = 16  # kept-set sizes tried at one position when the top-p cut is within slack


@dataclass(frozen=True)
class Replay:
    """What a verifier needs to replay one completion: its seed and the run's sampling settings."""

    seed: int
    temperature: float
    top_p: float
    slack: float  # CDF units: how far outside its interval an honest uniform may fall

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError("verifiable sampling needs a temperature > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.slack < 0.5:
            raise ValueError("slack must be in [0, 0.5)")


def uniform(seed: int, position: int) -> float:
    """The uniform in [0, 1) of ``position`` (0 = first completion token) of completion ``seed``:
    the first 8 bytes of SHA-256(domain || u64be(seed) || u64be(position)), read big-endian,
    shifted right by 11, times 2**-53 (exactly representable in float64)."""
    digest = hashlib.sha256(UNIFORM_DOMAIN + struct.pack(">QQ", seed, position)).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) * 2.0**-53


def uniforms(seed: int, count: int) -> np.ndarray:
    """``uniform(seed, i)`` for positions 0 .. count-1, as float64."""
    return np.array([uniform(seed, i) for i in range(count)], dtype=np.float64)


def distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The sampling distribution [rows, vocab] in float64: softmax(logits / T), restricted to the
    top-p set and renormalized. The top-p set is the smallest prefix of the tokens sorted by
    probability (descending, ties by lower id first) whose mass reaches ``top_p``: a token is in
    it when the mass of the tokens before it is below ``top_p``."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p < 1:
        probs = _restrict(probs, _kept_counts(probs, top_p)[1], _sorted(probs))
    return probs / probs.sum(dim=-1, keepdim=True)


def sample(logits: torch.Tensor, seeds: Sequence[int], positions: Sequence[int], temperature: float,
           top_p: float) -> torch.Tensor:
    """One token per row: the token whose interval of the cumulative distribution (token id
    order) holds ``uniform(seed, position)``. Tokens outside the top-p set have empty intervals."""
    cdf = torch.cumsum(distribution(logits, temperature, top_p), dim=-1)
    u = torch.tensor([uniform(s, p) for s, p in zip(seeds, positions)], dtype=torch.float64,
                     device=logits.device)
    chosen = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return chosen.clamp(max=logits.shape[-1] - 1)


def margins(logits: torch.Tensor, tokens: torch.Tensor, replay: Replay) -> np.ndarray:
    """How far inside its own CDF interval each claimed token's uniform fell (negative: outside),
    computed from a verifier's logits [positions, vocab] for the completion's ``tokens``.

    A token is honest when its margin is >= -slack. Where the top-p cut lies within ``slack`` of a
    token's cumulative mass, honest engines may disagree on the set; every kept-set size in that
    band is tried and the best margin counts, so the ambiguity costs no honest row.
    """
    probs = torch.softmax(logits.double() / replay.temperature, dim=-1)
    u = torch.from_numpy(uniforms(replay.seed, len(tokens))).to(logits.device)
    if replay.top_p >= 1:
        return _interval_margins(probs, tokens, u).cpu().numpy()
    order = _sorted(probs)
    low, strict, high = _kept_counts(probs, replay.top_p, replay.slack, order)
    result = _interval_margins(_restrict(probs, strict, order), tokens, u)
    for row in torch.nonzero((low != high) & (result < replay.slack)).flatten().tolist():
        lo, hi = int(low[row]), min(int(high[row]), int(low[row]) + MAX_TOP_P_ALTERNATIVES)
        for k in range(lo, hi + 1):
            alternative = _restrict(probs[row:row + 1], torch.tensor([k], device=probs.device),
                                    (order[0][row:row + 1], order[1][row:row + 1]))
            result[row] = torch.maximum(result[row],
                                        _interval_margins(alternative, tokens[row:row + 1], u[row:row + 1])[0])
    return result.cpu().numpy()


def first_failure(margin: np.ndarray, slack: float) -> int | None:
    """The first position whose margin is below -slack, or None when every token replays."""
    bad = np.nonzero(margin < -slack)[0]
    return int(bad[0]) if bad.size else None


def _sorted(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities sorted descending, ties by lower token id (a stable sort keeps id order)."""
    return torch.sort(probs, dim=-1, descending=True, stable=True)


def _kept_counts(probs: torch.Tensor, top_p: float, slack: float = 0.0,
                 order: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """Top-p set sizes per row with the cut at top_p - slack, top_p, top_p + slack."""
    sorted_probs, _ = order if order is not None else _sorted(probs)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    return tuple((before < cut).sum(dim=-1).clamp(min=1) for cut in (top_p - slack, top_p, top_p + slack))


def _restrict(probs: torch.Tensor, kept: torch.Tensor, order: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``probs`` with every token outside the first ``kept`` of the sorted order zeroed."""
    sorted_probs, index = order
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    return torch.zeros_like(probs).scatter_(-1, index, sorted_probs.masked_fill(ranks >= kept[:, None], 0.0))


def _interval_margins(probs: torch.Tensor, tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """min(u - lower edge, upper edge - u) of each token's normalized CDF interval."""
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1]
    index = tokens.to(torch.long)[:, None]
    high = cdf.gather(-1, index)[:, 0] / total
    low = high - probs.gather(-1, index)[:, 0] / total
    return torch.minimum(u - low, high - u)
