"""A steering forger: an adversarial worker that generates honestly, then changes tokens where the
validator's replay tolerance lets it, to make completions end with an answer it chose
(specs/sampling.md section 4, "Steering"). Used by tests/test_steering.py and bench/steering.py.

The forger runs the validator's own engine and weights (fp32 torch, the same numerics), so it sees
every race score the validator will see: for each candidate completion it runs the validator's
prefill with replays and keeps only candidates whose every token stays within the pair's slack, the
answer-span rule and the flip test, both per group and over its own history. What it sends is then
re-proven with the real proof builder (logprobs and TOPLOC proofs of its own prefill), so only the
sampling replay stands between it and acceptance.

Two ways to steer a completion toward the answer ``A``:

- ``answer``: keep an honest prefix, then write ``A`` (with or without a leading space) and an
  end-of-sequence token, at whichever prefix length needs the fewest flips: the answer tokens and
  the early stop are flipped in directly.
- ``reroll``: flip one token before the answer, then let honest sampling (the same seeds) run to the
  end, keeping a flip whose honest continuation happens to end with ``A``: a re-draw of the rest of
  the completion, chosen among every admissible flip.

Two budgets: ``greedy`` forges every completion it can while each group stays under the group's own
flip bound (the per-worker history then catches it); ``stealthy`` also keeps its summed flips at or
below their honest expectation, which no history test at any level refuses.

Each forger adapts to the answer-span rule it is judged by: ``span_depth`` is the deepest flip that
rule lets through in a final answer span (0: the validator's rule, none), and every group reports
the shallowest depth at which it could have been steered (``depth_needed``), so one run measures a
forger's reach against every softer rule at once (bench/steering.py).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from intellect_node.node.engine.base import PrefillResult, derive_seed
from intellect_node.node.engine.proofs import build_completion_proofs
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.roles.validator.answer_span import answer_span_flip, answer_span_start, span_flip_depth
from intellect_node.protocol.assignment import sampling_seed
from intellect_node.protocol.rollouts import (
    CompletionRecord,
    RolloutBatch,
    RolloutGroup,
    pack_logprobs,
    pack_tokens,
    proof_key,
    unpack_tokens,
)
from intellect_node.protocol.run_spec import EnginePair, RunSpec
from intellect_node.protocol.sampling import (
    FLIP_SUSPECT,
    Replay,
    choose,
    flip_chance,
    gumbel,
    poisson_at_least,
    position_key,
)

# The widest pair calibrated so far: vLLM bf16 judged by torch on an H200 (bench/HISTORY.md, "Second
# run"), margin noise as issue 50 states it, as a ``[[run.engines]]`` table of a node's config.
LOOSEST_PAIR = """
[[run.engines]]
worker = "torch"
validator = "torch"
toploc_max_exp_mismatches = 59
toploc_max_mant_err_mean = 7.32
toploc_max_mant_err_median = 6.0
logprob_atol = 6.55
sampling_slack = 2.0
margin_noise = 0.036
"""
STRATEGIES = ("answer", "reroll")
BUDGETS = ("greedy", "stealthy")
REROLL_ALTERNATIVES = 3  # admissible tokens tried per position by ``reroll`` (the best-scoring ones)


def loosest_pair() -> EnginePair:
    """``LOOSEST_PAIR`` for torch on both ends, checked by the wire's rules as a node's config checks it."""
    return EnginePair.from_wire(tomllib.loads(LOOSEST_PAIR)["run"]["engines"][0], "[[run.engines]] #1")


def wrong_answer(answer: str) -> str:
    """A chosen wrong answer of the same length: the last digit moved by one."""
    return answer[:-1] + str((int(answer[-1]) + 1) % 10)


def final_word(text: str) -> str:
    """The toy verifier's answer: the last whitespace-separated word, less trailing punctuation."""
    words = text.split()
    return words[-1].rstrip(".!,;:") if words else ""


@dataclass(frozen=True)
class Candidate:
    """One completion the forger could send instead of the honest one."""

    tokens: list[int]
    judged: PrefillResult  # the validator's prefill with replays, which the forger runs itself

    @property
    def flips(self) -> int:
        assert self.judged.sampling_margins is not None
        return int(np.count_nonzero(self.judged.sampling_margins < 0))


@dataclass
class SteeredGroup:
    counter: int
    forged: int  # completions changed to end with the chosen answer (their honest one did not)
    could: int  # completions for which the forger found an admissible candidate at all
    flips: int
    expected: float
    # the honest completions' chance of a flip in their answer spans under the pair's noise (the
    # flip test's curve): what the answer-span rule costs an honest worker of this pair, per group
    honest_span_expected: float
    # the shallowest answer-span flip depth at which one of its completions could be steered within
    # the slack (inf: at none): a rule letting flips this deep through loses the group, budgets aside
    depth_needed: float = float("inf")


@dataclass
class SteeringForger:
    """An adversarial worker of one identity; ``history`` mirrors the validator's flip ledger for it."""

    engine: TorchEngine
    tokenizer: object
    spec: RunSpec
    pair: EnginePair
    worker: str
    strategy: str = "answer"
    budget: str = "greedy"
    knows_span_rule: bool = True  # False: a forger of the rules before the answer span's (it flips there too)
    span_depth: float = 0.0  # the deepest answer-span flip the rule it adapts to lets through (score units)
    history: list[float] = field(default_factory=lambda: [0, 0.0])  # [flips, expected]

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES or self.budget not in BUDGETS:
            raise ValueError(f"strategy in {STRATEGIES}, budget in {BUDGETS}")
        self.eos = set(self.engine.eos_token_ids)

    def steer(self, batch: RolloutBatch, answer_of: Callable[[str], str]) -> tuple[RolloutBatch, list[SteeredGroup]]:
        """``batch`` (honestly built) with each group steered toward ``answer_of(task_id)``."""
        groups, report = [], []
        for group in batch.groups:
            steered, summary = self._steer_group(batch, group, answer_of(group.task_id))
            groups.append(steered)
            report.append(summary)
        return dataclasses.replace(batch, groups=tuple(groups)), report

    def _replays(self, batch: RolloutBatch, group: RolloutGroup) -> list[Replay]:
        seed = sampling_seed(batch.run_id, batch.worker, batch.policy_step, group.counter)
        return [Replay(derive_seed(seed, j), self.spec.temperature, self.spec.top_p, self.pair.sampling_slack)
                for j in range(len(group.completions))]

    def _steer_group(self, batch: RolloutBatch, group: RolloutGroup,
                     answer: str) -> tuple[RolloutGroup, SteeredGroup]:
        prompt = unpack_tokens(group.prompt_ids).tolist()
        honest = [unpack_tokens(c.token_ids).tolist() for c in group.completions]
        replays = self._replays(batch, group)
        judged = self.engine.prefill([prompt] * len(honest), honest, replays)
        chosen: dict[int, Candidate] = {}
        needed = float("inf")
        for j, tokens in enumerate(honest):
            if final_word(self._text(tokens)) == answer:
                continue  # already there: nothing to steer
            candidates = self._candidates(prompt, tokens, replays[j], answer)
            needed = min([needed] + [span_flip_depth(c.tokens, c.judged.sampling_margins, self.tokenizer)
                                     for c in candidates])
            admissible = [c for c in candidates if self._admissible(c)]
            if admissible:
                chosen[j] = min(admissible, key=lambda c: c.flips)
        could = len(chosen)
        noise = self.pair.margin_noise
        span = float(sum(flip_chance(r.sampling_gaps[answer_span_start(t, self.tokenizer):], noise).sum()
                         for t, r in zip(honest, judged, strict=True)))
        kept = self._within_budget(judged, chosen)
        flips, expected = self._figures(judged, kept)
        self.history[0] += flips
        self.history[1] += expected
        if not kept:
            return group, SteeredGroup(group.counter, 0, could, flips, expected, span, needed)
        records = list(group.completions)
        for j, candidate in kept.items():
            records[j] = self._record(batch, group, candidate)
        return (dataclasses.replace(group, completions=tuple(records)),
                SteeredGroup(group.counter, len(kept), could, flips, expected, span, needed))

    def _text(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def _admissible(self, candidate: Candidate) -> bool:
        """What the answer-span rule it adapts to lets through: no flip deeper than ``span_depth``
        in the final answer span (the slack is ``_candidates``' business)."""
        return not (self.knows_span_rule and answer_span_flip(
            candidate.tokens, candidate.judged.sampling_margins, self.tokenizer, self.span_depth) is not None)

    def _candidates(self, prompt: list[int], honest: list[int], replay: Replay, answer: str) -> list[Candidate]:
        """The candidates ending with ``answer`` that the validator's per-completion checks let
        through: every margin within the pair's slack (not even inconclusive)."""
        proposals = (self._answer_proposals(honest, answer) if self.strategy == "answer"
                     else self._reroll_proposals(prompt, honest, replay))
        proposals = [p for p in proposals if p != honest and self._fits(p) and final_word(self._text(p)) == answer]
        if not proposals:
            return []
        judged = self.engine.prefill([prompt] * len(proposals), proposals, [replay] * len(proposals))
        return [c for c in map(Candidate, proposals, judged)
                if bool(np.all(c.judged.sampling_margins >= -self.pair.sampling_slack))]

    def _fits(self, tokens: list[int]) -> bool:
        """A completion the termination check accepts: EOS only last, or exactly max_tokens long."""
        if not tokens or any(t in self.eos for t in tokens[:-1]) or len(tokens) > self.spec.max_tokens:
            return False
        return tokens[-1] in self.eos or len(tokens) == self.spec.max_tokens

    def _answer_proposals(self, honest: list[int], answer: str) -> list[list[int]]:
        eos = self.engine.eos_token_ids[0]
        ends = [self.tokenizer.encode(text, add_special_tokens=False) for text in (answer, " " + answer)]
        usable = len(honest) - (1 if honest and honest[-1] in self.eos else 0)
        return [honest[:i] + end + [eos] for i in range(usable + 1) for end in ends]

    def _reroll_proposals(self, prompt: list[int], honest: list[int], replay: Replay) -> list[list[int]]:
        """For each position, the best-scoring other tokens within the slack, each continued honestly."""
        with torch.inference_mode():
            ids = torch.tensor([prompt + honest[:-1]], dtype=torch.long, device=self.engine.device)
            hidden = self.engine.model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1:]
            logits = self.engine.head(hidden)
        keys = [position_key(replay.seed, p) for p in range(len(honest))]
        scores = gumbel(keys, logits.shape[-1], logits.device).add_(logits.double() / replay.temperature)
        prefixes = []
        for i, row in enumerate(scores):
            best = float(row.max())
            order = torch.argsort(row, descending=True).tolist()
            alternatives = [t for t in order[:REROLL_ALTERNATIVES + 1]
                            if t != honest[i] and float(row[t]) >= best - self.pair.sampling_slack]
            prefixes += [honest[:i] + [t] for t in alternatives[:REROLL_ALTERNATIVES]]
        return self._continue(prompt, prefixes, replay)

    def _continue(self, prompt: list[int], prefixes: list[list[int]], replay: Replay) -> list[list[int]]:
        """Each prefix sampled on honestly (the completion's own seed, position by position) to its end."""
        rows = [list(p) for p in prefixes]
        pad = self.engine.pad_id
        with torch.inference_mode():
            while True:
                live = [r for r in rows if len(r) < self.spec.max_tokens and not (r and r[-1] in self.eos)]
                if not live:
                    return rows
                width = max(len(prompt) + len(r) for r in live)
                ids = torch.full((len(live), width), pad, dtype=torch.long, device=self.engine.device)
                mask = torch.zeros_like(ids)
                for k, r in enumerate(live):
                    seq = prompt + r
                    ids[k, width - len(seq):] = torch.tensor(seq, device=self.engine.device)
                    mask[k, width - len(seq):] = 1
                out = self.engine.model.model(input_ids=ids, attention_mask=mask,
                                              position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
                logits = self.engine.head(out.last_hidden_state[:, -1])
                keys = [position_key(replay.seed, len(r)) for r in live]
                for r, token in zip(live, choose(logits, keys, replay.temperature, replay.top_p).tolist(), strict=True):
                    r.append(token)

    def _figures(self, honest: list[PrefillResult], kept: dict[int, Candidate]) -> tuple[int, float]:
        """The group's flips and their honest expectation, as the validator's flip test counts them."""
        results = [kept[j].judged if j in kept else r for j, r in enumerate(honest)]
        flips = sum(int(np.count_nonzero(r.sampling_margins < 0)) for r in results)
        expected = float(sum(flip_chance(r.sampling_gaps, self.pair.margin_noise).sum() for r in results))
        return flips, expected

    def _within_budget(self, honest: list[PrefillResult], chosen: dict[int, Candidate]) -> dict[int, Candidate]:
        """The forged completions it sends: fewest flips first, while the group stays under the
        group's flip bounds (and, ``stealthy``, its summed flips at most their expectation)."""
        kept: dict[int, Candidate] = {}
        for j, candidate in sorted(chosen.items(), key=lambda item: item[1].flips):
            trial = {**kept, j: candidate}
            flips, expected = self._figures(honest, trial)
            if poisson_at_least(flips, expected) < 10 * FLIP_SUSPECT:
                continue
            if self.budget == "stealthy" and self.history[0] + flips > self.history[1] + expected:
                continue
            kept = trial
        return kept

    def _record(self, batch: RolloutBatch, group: RolloutGroup, candidate: Candidate) -> CompletionRecord:
        """The forged completion re-proven as an honest worker proves its own: logprobs and TOPLOC
        proofs of the forger's prefill, bound to this row's proof key."""
        tokens = candidate.tokens
        key = proof_key(batch.manifest_hash, batch.policy_step, group.prompt_ids, pack_tokens(tokens))
        proofs = build_completion_proofs([candidate.judged.hidden_states], [key])[0]
        return CompletionRecord(token_ids=pack_tokens(tokens), reward=0.0,
                                logprobs=pack_logprobs(candidate.judged.logprobs.numpy()),
                                finish_reason="stop" if tokens[-1] in self.eos else "length", proofs=tuple(proofs))
