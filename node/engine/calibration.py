"""The tolerances of an engine pair, measured: what a run spec's ``EnginePair`` says about honest
numerics when one engine (or precision) generates and another judges.

Why measured and not chosen: a validator must never take a claimant's word for how noisy its
engine is (specs/validation.md), and a tolerance chosen by hand either refuses honest bf16
workers or hands cheaters every near tie. The run's authority has honest completions generated
on one engine (their claimed log-probabilities and TOPLOC proofs as a worker sends them) judged by
the other's prefill with replays, and derives (specs/sampling.md section 4):

- ``margin_noise``: the scale (of the flip test's Student-t curve, ``flip_chance``) at which the
  flip test's expectation equals the flips seen
  (``noise_of_flips``: the honest flip rate, matched on the positions' own gaps), times
  ``NOISE_SAFETY``;
- ``sampling_slack``: ``SLACK_SAFETY`` times the deepest honest flip, and at least the depth an
  honest token exceeds with chance ``UNIT_FALSE_REJECT``, by the flip test's own t2 curve at the
  pair's ``margin_noise`` (``honest_depth``) and by the tail fit below, capped at the wire's bound;
- ``logprob_atol`` and the TOPLOC thresholds: their largest honest figures times
  ``LOGPROB_SAFETY`` / ``TOPLOC_SAFETY``, at least their tail fits' values, never below the
  torch/torch pair's; ``logprob_atol`` also at least ``honest_depth`` (capped at the wire's 10): a
  claimed token's logprob error is a difference of the same logits' errors as a flip's depth, and
  the flip test's curve bounds its measured tail too (bench/HISTORY.md, issue 50).

Why tail fits: the errors between precisions are heavy-tailed (bench/HISTORY.md, "Cross-engine
tolerances": a slack from the deepest flip of 512 groups missed flips among the next 1,000), so the
maximum of a calibration set does not bound a run's worth of honest tokens. For flip depths the law
is known: the flip test's t2 curve, fitted to the flips' count, predicts the depth tail too (a
power law, ``depth ** -2``), and an exponential fit to the deepest flips of 512 groups undershot it:
slack 0.689 where 16,000 groups held flips at -2.17 and -6.37 (bench/HISTORY.md, issue 50). A pair
whose honest depths reach past the wire's bound gets the bound (``MAX_SLACK``), and its judge
proves a sampling cheat by the count of tokens past the proof bound, not by one of them
(specs/sampling.md section 4, "The bounds"). ``tail_quantile``
extrapolates peaks over a threshold with an exponential tail (the mean excess of the largest
``TAIL_POINTS`` figures), which rests on several points instead of the one largest. Few points,
because the extreme tail is the heavy part: fitted to the 50 largest of 18,600 bf16/fp32 positions
the exponential still undershot the deepest of 73,600 (scratch analysis in bench/HISTORY.md).

A pair is only as good as its calibration set: the figures name how many positions they rest on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from intellect_node.crypto.toploc import Thresholds, verify_proofs
from intellect_node.node.engine.base import PrefillResult
from intellect_node.protocol.rollouts import CompletionRecord, unpack_logprobs
from intellect_node.protocol.run_spec import TORCH_TORCH, EnginePair
from intellect_node.protocol.sampling import MAX_SLACK, flip_chance

NOISE_SAFETY = 1.5
SLACK_SAFETY = 2.0
LOGPROB_SAFETY = 3.0
TOPLOC_SAFETY = 2.0
TAIL_POINTS = 10  # the largest figures a tail fit rests on: few, so the fit follows the heaviest part
# the chance that one honest token (or TOPLOC chunk) exceeds a tolerance taken from a tail fit:
# a group of 8 completions of 64 tokens then crosses one with a chance near 5e-6
UNIT_FALSE_REJECT = 1e-8
# Loose enough that every honest chunk is measured (a chunk over a limit still reports its figures).
MEASURING = Thresholds(max_exp_mismatches=10**6, max_mant_err_mean=1e9, max_mant_err_median=1e9)


@dataclass(frozen=True)
class PairFigures:
    """What the judging engine saw of honest completions from the generating one."""

    positions: int
    flips: int  # tokens that were not the judging engine's exact choice
    noise: float  # noise_of_flips: score units, as the slack
    worst_margin: float  # the most negative margin of an honest token (0 when none flipped)
    max_logprob_error: float
    max_exp_mismatches: int
    max_mant_err_mean: float
    max_mant_err_median: float
    # tail fits (``tail_quantile``) of the same figures at UNIT_FALSE_REJECT; 0: nothing to fit
    depth_tail: float = 0.0  # flip depth (score units, positive)
    logprob_tail: float = 0.0
    exp_mismatches_tail: float = 0.0
    mant_err_mean_tail: float = 0.0
    mant_err_median_tail: float = 0.0

    def summary(self) -> str:
        """One line of the figures, for people (``intellect-node calibrate``, bench/cross_engine.py)."""
        return (f"{self.positions} positions, {self.flips} flips (noise {self.noise:.3g}), deepest flip "
                f"{self.worst_margin:.3g}, logprob error {self.max_logprob_error:.3g}, TOPLOC "
                f"{self.max_exp_mismatches}/{self.max_mant_err_mean:.3g}/{self.max_mant_err_median:.3g}; tail fits: "
                f"depth {self.depth_tail:.3g}, logprob {self.logprob_tail:.3g}, TOPLOC "
                f"{self.exp_mismatches_tail:.3g}/{self.mant_err_mean_tail:.3g}/{self.mant_err_median_tail:.3g}")

    @staticmethod
    def worst_of(figures: Sequence[PairFigures]) -> PairFigures:
        """One set of figures that every one of ``figures`` stays within (a pair covering several
        precisions: the run spec names engines, not precisions)."""
        largest = {field.name: max(getattr(f, field.name) for f in figures) for field in dataclasses.fields(PairFigures)
                   if field.name not in ("positions", "flips", "worst_margin")}
        return PairFigures(positions=sum(f.positions for f in figures), flips=sum(f.flips for f in figures),
                           worst_margin=min(f.worst_margin for f in figures), **largest)


def noise_of_flips(gaps: np.ndarray, flips: int) -> float:
    """The scale with ``sum(flip_chance(gaps, scale)) == flips`` (bisection; the expectation grows
    with the scale), 0 when nothing flipped."""
    if flips <= 0 or gaps.size == 0:
        return 0.0

    def expected(sigma: float) -> float:
        return float(flip_chance(gaps, sigma).sum())

    low, high = 1e-9, 1.0
    while expected(high) < flips and high < 1e6:
        high *= 2
    for _ in range(100):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if expected(middle) < flips else (low, middle)
    return high


def honest_depth(margin_noise: float, exceed: float = UNIT_FALSE_REJECT) -> float:
    """The flip depth (score units) one honest token exceeds with chance ``exceed`` under the flip
    test's curve (``flip_chance``: ``P(T > depth / margin_noise)``, T Student's t with 2 degrees of
    freedom), inverted in closed form: ``flip_chance`` is ``1 / (r (r + x))`` with ``r**2 = x**2 + 2``,
    which equals ``exceed`` where ``r**2 = 1 / (2 exceed (1 - exceed))``. 0 for no noise."""
    if margin_noise <= 0:
        return 0.0
    return margin_noise * math.sqrt(max(0.0, 1.0 / (2.0 * exceed * (1.0 - exceed)) - 2.0))


def tail_quantile(samples: np.ndarray, exceed: float = UNIT_FALSE_REJECT, points: int = TAIL_POINTS) -> float:
    """The value one sample exceeds with chance ``exceed``: within the data, its empirical quantile;
    beyond it, peaks over the threshold of the ``points`` largest with an exponential tail
    (threshold + mean excess * ln(tail fraction / exceed)). 0 for no samples."""
    if samples.size == 0:
        return 0.0
    ordered = np.sort(samples.astype(np.float64))
    n = ordered.size
    if exceed * n >= 1:
        return float(ordered[min(n - 1, math.ceil((1 - exceed) * n))])
    points = min(points, n - 1)
    if points < 1:
        return float(ordered[-1])
    threshold = ordered[n - points - 1]
    mean_excess = float((ordered[n - points:] - threshold).mean())
    return float(threshold + mean_excess * math.log((points / n) / exceed))


def measure_pair(claims: Sequence[CompletionRecord], judged: Sequence[PrefillResult],
                 keys: Sequence[bytes]) -> PairFigures:
    """Figures of honest ``claims`` (as a worker delivered them) against the judging engine's
    prefill of the same completions, with replays, in the same order; ``keys`` are the claims'
    proof keys (``protocol.rollouts.proof_key``), with which their proofs were bound."""
    if len(keys) != len(claims):
        raise ValueError("need one proof key per claimed completion")
    if len(claims) != len(judged) or any(r.sampling_margins is None or r.sampling_gaps is None for r in judged):
        raise ValueError("need one prefill with replays per claimed completion")
    margins = np.concatenate([r.sampling_margins for r in judged]) if judged else np.zeros(0)
    gaps = np.concatenate([r.sampling_gaps for r in judged]) if judged else np.zeros(0)
    flips = int(np.count_nonzero(margins < 0))
    errors, chunks = [], []
    for claim, result, key in zip(claims, judged, keys, strict=True):
        if len(result.logprobs):
            errors.append(np.abs(unpack_logprobs(claim.logprobs) - result.logprobs.float().numpy()))
        chunks.extend(verify_proofs(result.hidden_states, list(claim.proofs), key=key, thresholds=MEASURING))
    logprob_errors = np.concatenate(errors) if errors else np.zeros(0)
    exp_mismatches = np.array([c.exp_mismatches for c in chunks], dtype=np.float64)
    mant_means = np.array([c.mant_err_mean for c in chunks], dtype=np.float64)
    mant_medians = np.array([c.mant_err_median for c in chunks], dtype=np.float64)
    return PairFigures(positions=int(margins.size), flips=flips, noise=noise_of_flips(gaps, flips),
                       worst_margin=float(min(0.0, margins.min())) if margins.size else 0.0,
                       max_logprob_error=float(logprob_errors.max(initial=0.0)),
                       max_exp_mismatches=int(exp_mismatches.max(initial=0)),
                       max_mant_err_mean=float(mant_means.max(initial=0.0)),
                       max_mant_err_median=float(mant_medians.max(initial=0.0)),
                       depth_tail=tail_quantile(np.maximum(0.0, -margins)) if flips else 0.0,
                       logprob_tail=tail_quantile(logprob_errors), exp_mismatches_tail=tail_quantile(exp_mismatches),
                       mant_err_mean_tail=tail_quantile(mant_means), mant_err_median_tail=tail_quantile(mant_medians))


def calibrated_pair(worker: str, validator: str, figures: PairFigures, base: EnginePair = TORCH_TORCH) -> EnginePair:
    """The ``EnginePair`` for these figures; never tighter than ``base`` (the exact pair's)."""
    noise = max(base.margin_noise, NOISE_SAFETY * figures.noise)
    slack = min(MAX_SLACK, max(base.sampling_slack, SLACK_SAFETY * -figures.worst_margin, figures.depth_tail,
                               honest_depth(NOISE_SAFETY * figures.noise)))
    return dataclasses.replace(
        base, worker=worker, validator=validator, margin_noise=noise, sampling_slack=slack,
        logprob_atol=min(10.0, max(base.logprob_atol, LOGPROB_SAFETY * figures.max_logprob_error,
                                   figures.logprob_tail, honest_depth(NOISE_SAFETY * figures.noise))),
        toploc_max_exp_mismatches=min(4096, max(base.toploc_max_exp_mismatches,
                                                math.ceil(TOPLOC_SAFETY * figures.max_exp_mismatches),
                                                math.ceil(figures.exp_mismatches_tail))),
        toploc_max_mant_err_mean=max(base.toploc_max_mant_err_mean, TOPLOC_SAFETY * figures.max_mant_err_mean,
                                     figures.mant_err_mean_tail),
        toploc_max_mant_err_median=max(base.toploc_max_mant_err_median, TOPLOC_SAFETY * figures.max_mant_err_median,
                                       figures.mant_err_median_tail))
