"""Verifiable sampling: the token at each position is a public function of the seed and the model.

TOPLOC and the logprob check prove that a checkpoint's activations match the submitted tokens,
not that the checkpoint chose them. Making the choice itself a deterministic function of
(public per-completion seed, position, the model's distribution under the run's temperature and
top-p) lets any validator replay every token from its own prefill logits: a greedy, best-of-N,
edited or cheap-model completion fails the replay at its first forged token.

The design is a Gumbel-max (exponential) race whose noise comes from a counter-based generator
keyed by SHA-256 of the seed and position and hashed per token id with splitmix64, in integer
arithmetic, so torch, vLLM, CPU and GPU draw the same noise bit for bit. specs/sampling.md defines
it and records the measurement that chose it over inverse-CDF (bench/sampling.py): the race keeps
the exact token under logit noise that makes an inverse-CDF sampler change a third of its tokens.
The validator accepts a token whose score is within a slack (logit units) of the best score.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from intellect_node.protocol.compiled import CompiledOn

KEY_DOMAIN = b"intellect-node/sampling/race-key/v1"
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_CHUNK_ELEMENTS = 1 << 22  # scores computed at once by a verifier: 32 MiB of float64
# on a GPU 8x more (256 MiB): small chunks there cost a launch and a sync each (an H200 replayed
# 65,536 positions of a 49,152-token vocabulary at 38,580 positions/s in 4M-element chunks)
_GPU_CHUNK_ELEMENTS = 1 << 25
# A group whose flips are this unlikely under the engine pair's honest noise is refused (and, being
# a sampling failure, proven): at 1e-9 an honest worker of 10^6 groups is refused with chance 1e-3.
FLIP_ALPHA = 1e-9
# A group whose flips are this unlikely, but not FLIP_ALPHA-unlikely, is set aside as inconclusive
# (specs/validation.md, "Two bounds"): a forger steering a few near ties per group earns nothing from
# such a group, where an honest group lands here with at most this chance (the curve is calibrated
# with a safety factor, so less).
FLIP_SUSPECT = 1e-4
MAX_SLACK = 2.0  # score units; a run spec's sampling_slack is at most this
# The top-p cut moves by the slack in mass units, at most this much: a slack wide enough for bf16
# margins (about 1) would otherwise admit the whole tail of the distribution at a top-p position.
MAX_MASS_SLACK = 0.1


@dataclass(frozen=True)
class Replay:
    """What a verifier needs to replay one completion: its seed and the run's sampling settings."""

    seed: int
    temperature: float
    top_p: float
    slack: float  # logit units: how far below the best score an honest token may fall

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError("verifiable sampling needs a temperature > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.slack <= MAX_SLACK:
            raise ValueError(f"slack must be in [0, {MAX_SLACK}]")


def position_key(seed: int, position: int) -> int:
    """The 64-bit key of ``position`` (0 = first completion token) of completion ``seed``: the
    first 8 bytes, big-endian, of SHA-256(domain || u64be(seed) || u64be(position))."""
    digest = hashlib.sha256(KEY_DOMAIN + struct.pack(">QQ", seed, position)).digest()
    return int.from_bytes(digest[:8], "big")


def _signed(value: int) -> int:
    """A u64 as the int64 with the same bits (torch has no general uint64 arithmetic)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right_into(x: torch.Tensor, bits: int, out: torch.Tensor) -> torch.Tensor:
    """Logical right shift of int64 bit patterns, written into ``out``."""
    torch.bitwise_right_shift(x, bits, out=out)
    return out.bitwise_and_((1 << (64 - bits)) - 1)


def key_tensor(keys: Sequence[int]) -> torch.Tensor:
    """Position keys as an int64 tensor (the same bits), on the CPU: what ``gumbel`` and ``choose`` take
    from an engine that moves them to its device itself (without waiting for the device)."""
    return torch.tensor([_signed(key) for key in keys], dtype=torch.int64)


def gumbel(keys: Sequence[int] | torch.Tensor, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gumbel noise [len(keys), vocab] in float64. For key k and token id t:
    z = splitmix64(k XOR t) (the finalizer with its golden-ratio increment, all mod 2**64),
    u = ((z >> 11) + 0.5) * 2**-53 in (0, 1), noise = -log(-log(u)). ``keys`` as ints, or as
    ``key_tensor`` gives them."""
    k = (keys if isinstance(keys, torch.Tensor) else key_tensor(keys)).to(device)[:, None]
    # in place on two buffers: a verifier's [rows, vocab] int64 temporaries are most of its replay cost
    z = torch.arange(vocab, dtype=torch.int64, device=device)[None, :] ^ k
    z += _signed(_GOLDEN)  # int64 addition and multiplication wrap like uint64
    shifted = torch.empty_like(z)
    z ^= _shift_right_into(z, 30, shifted)
    z *= _signed(_MIX1)
    z ^= _shift_right_into(z, 27, shifted)
    z *= _signed(_MIX2)
    z ^= _shift_right_into(z, 31, shifted)
    u = _shift_right_into(z, 11, shifted).double().add_(0.5).mul_(2.0**-53)
    return u.log_().neg_().log_().neg_()


def _race(logits: torch.Tensor, keys: Sequence[int] | torch.Tensor, temperature: float, top_p: float,
          mass_slack: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Race scores logits / T + Gumbel [rows, vocab], and the top-p sets (bool, same shape) with
    the cut at ``top_p - mass_slack`` and at ``top_p + mass_slack`` (the narrowest and the widest
    sets honest numeric noise can produce; both the exact set when the slack is 0). Top-p below 1
    only: at 1 every token competes (``_full_choice``, ``_full_replay``)."""
    scaled = logits.double() / temperature
    scores = gumbel(keys, logits.shape[-1], logits.device).add_(scaled)
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of strictly better tokens

    def kept(cut: float) -> torch.Tensor:
        inside = before < cut
        inside[:, 0] = True  # the most likely token is always kept
        return torch.zeros_like(inside).scatter_(-1, order, inside)

    return scores, kept(top_p - mass_slack), kept(top_p + mass_slack)


def sample(logits: torch.Tensor, seeds: Sequence[int], positions: Sequence[int], temperature: float,
           top_p: float) -> torch.Tensor:
    """One token per row: the argmax of logits / T + Gumbel(position_key(seed, position)) over
    the top-p set (the smallest prefix of the tokens sorted by probability, descending, ties by
    lower id, whose mass reaches ``top_p``: a token is in it when the mass before it is below
    ``top_p``). Picks token i with probability q_i, the top-p-renormalized softmax(logits / T)."""
    return choose(logits, [position_key(s, p) for s, p in zip(seeds, positions, strict=True)], temperature, top_p)


def choose(logits: torch.Tensor, keys: Sequence[int] | torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``sample`` with the rows' position keys already derived (ints, or ``key_tensor``'s int64 bits):
    an engine that samples a whole batch per step hashes the keys once per row and runs the race
    for every row in one call, on the logits' device."""
    if top_p >= 1:
        return _FULL_CHOICE(logits.device, logits, _keys_on(keys, logits.device), temperature)
    scores, kept, _ = _race(logits, keys, temperature, top_p)
    return scores.masked_fill(~kept, -math.inf).argmax(dim=-1)


def _keys_on(keys: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    return (keys if isinstance(keys, torch.Tensor) else key_tensor(keys)).to(device)


def _full_scores(logits: torch.Tensor, keys: torch.Tensor, temperature: float) -> torch.Tensor:
    """Every token's race score, logits / T + Gumbel (top-p 1: all of them compete)."""
    return gumbel(keys, logits.shape[-1], logits.device).add_(logits.double() / temperature)


def _full_choice(logits: torch.Tensor, keys: torch.Tensor, temperature: float) -> torch.Tensor:
    """The race's winner per row over the whole vocabulary (top-p 1)."""
    return _full_scores(logits, keys, temperature).argmax(dim=-1)


def _full_replay(logits: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor,
                 temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the claimed token's margin and the race's gap over the whole vocabulary (top-p 1):
    two max reductions instead of masks, a scatter and a top-k, so compiled it is one pass."""
    scores = _full_scores(logits, keys, temperature)
    own = scores.gather(-1, tokens[:, None])[:, 0]
    best, at = scores.max(dim=-1)
    second = scores.scatter(-1, at[:, None], -math.inf).max(dim=-1).values
    return own - torch.where(at == tokens, second, best), best - second


# compiled on a GPU, where the eager race is a verifier's whole cost (protocol/compiled.py)
_FULL_CHOICE = CompiledOn(_full_choice)
_FULL_REPLAY = CompiledOn(_full_replay)


def margins(logits: torch.Tensor, tokens: torch.Tensor, replay: Replay) -> np.ndarray:
    """Per position, the claimed token's race score minus the best other score (>= 0: it is the
    sampler's choice; the verifier accepts >= -slack), from a verifier's logits [positions,
    vocab]. Competitors are the tokens kept with the top-p cut lowered by ``slack`` (mass units:
    logit noise of size d moves cumulative mass by at most about d); a claimed token outside the
    set with the cut raised by ``slack`` gets -inf."""
    return _replay(logits, tokens, [position_key(replay.seed, p) for p in range(len(tokens))], replay).margins


@dataclass(frozen=True)
class TokenReplay:
    """A verifier's replay of a completion's tokens: per position the claimed token's ``margins``
    (as ``margins``) and the ``gaps`` of the verifier's own race there (its best score minus its
    second best, over the same competitors): how close a position was to a tie, which is what
    honest numeric noise can flip (``flip_test``)."""

    margins: np.ndarray
    gaps: np.ndarray


def margins_of_rows(logits: torch.Tensor, tokens: torch.Tensor, replays: Sequence[Replay],
                    counts: Sequence[int]) -> list[TokenReplay]:
    """The replays of several completions at once: their logits and tokens concatenated in order,
    ``counts[i]`` positions for ``replays[i]``. Completions with the same sampling settings race in
    one call, which on short completions costs a fraction of one call each."""
    if len(replays) != len(counts) or sum(counts) != len(tokens):
        raise ValueError("need one replay and one position count per completion, covering every token")
    bounds = np.cumsum([0, *counts])
    results: list[TokenReplay] = [TokenReplay(np.zeros(0), np.zeros(0))] * len(replays)
    settings: dict[tuple[float, float, float], list[int]] = {}
    for i, replay in enumerate(replays):
        settings.setdefault((replay.temperature, replay.top_p, replay.slack), []).append(i)
    for members in settings.values():
        index = torch.tensor([p for i in members for p in range(bounds[i], bounds[i + 1])], dtype=torch.long)
        keys = [position_key(replays[i].seed, p) for i in members for p in range(counts[i])]
        joined = _replay(logits.index_select(0, index.to(logits.device)), tokens[index], keys, replays[members[0]])
        at = 0
        for i in members:
            results[i] = TokenReplay(joined.margins[at:at + counts[i]], joined.gaps[at:at + counts[i]])
            at += counts[i]
    return results


def _replay(logits: torch.Tensor, tokens: torch.Tensor, keys: Sequence[int], replay: Replay) -> TokenReplay:
    """Margins and gaps of the positions with race ``keys``, in row chunks to bound memory."""
    budget = _GPU_CHUNK_ELEMENTS if logits.device.type == "cuda" else _CHUNK_ELEMENTS
    rows = max(1, budget // max(1, logits.shape[-1]))
    margin_parts, gap_parts = [], []
    for start in range(0, len(tokens), rows):
        part = logits[start:start + rows]
        index = tokens[start:start + rows].to(device=logits.device, dtype=torch.long)[:, None]
        if replay.top_p >= 1:
            margin, gap = _FULL_REPLAY(logits.device, part, index[:, 0], _keys_on(keys[start:start + rows],
                                                                                logits.device), replay.temperature)
        else:
            margin, gap = _masked_replay(part, index, keys[start:start + rows], replay)
        margin_parts.append(margin.cpu().numpy())
        gap_parts.append(gap.nan_to_num(nan=math.inf).cpu().numpy())
    if not margin_parts:
        return TokenReplay(np.zeros(0), np.zeros(0))
    return TokenReplay(np.concatenate(margin_parts), np.concatenate(gap_parts))


def _masked_replay(part: torch.Tensor, index: torch.Tensor, keys: Sequence[int],
                   replay: Replay) -> tuple[torch.Tensor, torch.Tensor]:
    """Margins and gaps of a top-p race: competitors inside the narrowest set, the claimed token
    -inf outside the widest."""
    scores, narrowest, widest = _race(part, keys, replay.temperature, replay.top_p, min(replay.slack, MAX_MASS_SLACK))
    own = scores.gather(-1, index)[:, 0].masked_fill(~widest.gather(-1, index)[:, 0], -math.inf)
    competing = scores.masked_fill(~narrowest, -math.inf)
    best_other = competing.scatter(-1, index, -math.inf).max(dim=-1).values
    top = competing.topk(min(2, competing.shape[-1]), dim=-1).values
    gap = top[:, 0] - top[:, 1] if top.shape[-1] > 1 else torch.full_like(top[:, 0], math.inf)
    return own - best_other, gap


def first_failure(margin: np.ndarray, slack: float) -> int | None:
    """The first position whose margin is below -slack, or None when every token replays."""
    bad = np.nonzero(~(margin >= -slack))[0]
    return int(bad[0]) if bad.size else None


@dataclass(frozen=True)
class FlipTest:
    """How often the claimed tokens were not the verifier's exact choice (``flips``: margin < 0,
    yet within the slack), against how often honest noise of the engine pair flips positions
    this close to a tie (``expected``), and the chance of at least that many flips under honest
    noise (``p_value``, Poisson upper tail)."""

    flips: int
    expected: float
    p_value: float


def flip_chance(gaps: np.ndarray, margin_noise: float) -> np.ndarray:
    """specs/sampling.md section 4: the chance that honest noise flips a position whose race gap is
    ``g``: ``P(T > g / margin_noise)`` for ``T`` Student's t with 2 degrees of freedom, ``margin_noise``
    the engine pair's calibrated scale of the error in a race margin (score units, as the slack).

    Why t with 2 degrees of freedom and not a Gaussian: the error between precisions is heavy-
    tailed. Measured bf16 against fp32 (111,000 positions), the honest flip rate falls as about
    ``g ** -2`` (0.04 at gaps 0.05-0.1, 0.002 at 0.3-0.5, 0.0004 at 0.5-1), which this curve follows
    with one scale, where a Gaussian fitted to the same flips puts a flip at gap 0.35 at 1e-11 and
    refused honest groups as cheats. In closed form, stable for large ``x = g / margin_noise``:
    ``1 / (r * (r + x))`` with ``r = sqrt(x**2 + 2)``; 0 where the gap is infinite, 0.5 at a tie."""
    if margin_noise <= 0:
        return np.zeros(np.shape(gaps))
    x = np.minimum(np.asarray(gaps, dtype=np.float64), 1e150) / margin_noise
    r = np.sqrt(x * x + 2.0)
    return 1.0 / (r * (r + x))


def flip_test(replays: Sequence[TokenReplay], margin_noise: float) -> FlipTest:
    """specs/sampling.md section 4: summed over the positions, ``flip_chance`` of each position's
    race gap is the honest expectation of flips; a worker steering near ties flips more."""
    margins = np.concatenate([r.margins for r in replays]) if replays else np.zeros(0)
    gaps = np.concatenate([r.gaps for r in replays]) if replays else np.zeros(0)
    flips = int(np.count_nonzero(margins < 0))
    expected = float(flip_chance(gaps, margin_noise).sum()) if gaps.size else 0.0
    return FlipTest(flips, expected, poisson_at_least(flips, expected))


def poisson_at_least(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean): the regularized lower incomplete gamma function P(k, mean),
    accurate in relative terms far into the tail (a p-value of 1e-30 is not lost to 1 - (1 - x))
    and constant-time in k (a worker's flips summed over its history)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    return float(torch.special.gammainc(torch.tensor(float(k), dtype=torch.float64),
                                        torch.tensor(float(mean), dtype=torch.float64)))
