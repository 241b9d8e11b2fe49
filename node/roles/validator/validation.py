"""Verifying an untrusted rollout batch: compute only, no network (runs in a worker thread).

A validator re-does what ``intellect_node.node.roles.inference.builder`` did, judged by the run's
signed spec and never by the batch's declarations: it recomputes the assignment (task, length
target), the prompt tokens, and with one batched prefill of prompt + completion on the claimed
checkpoint the hidden states (TOPLOC), the raw-model logprobs and the sampling replay of every
token (``intellect_node.protocol.sampling``), then checks termination and recomputes rewards.
One prefill costs a fraction of the token-by-token generation it checks, which is what makes
validation cheap. The trainer reuses ``verify_batch``.
specs/validation.md is normative; the checks run in its order and the first failure names a
group's reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from intellect_node.crypto.toploc import Thresholds, rejudge, verify_proofs
from intellect_node.node.engine.base import (
    Engine,
    PrefillResult,
    derive_seed,
    encode_prompt,
)
from intellect_node.node.roles.validator.answer_span import answer_span_flip
from intellect_node.node.roles.validator.ledger import JudgeState, group_digest
from intellect_node.node.tasks.schema import Task, with_length_target
from intellect_node.node.tasks.verify import task_reward
from intellect_node.protocol import codec
from intellect_node.protocol.assignment import length_target, sampling_seed, task_index
from intellect_node.protocol.rollouts import (
    RolloutBatch,
    RolloutGroup,
    proof_key,
    unpack_logprobs,
    unpack_tokens,
)
from intellect_node.protocol.run_spec import EnginePair, RunSpec, task_set_digest
from intellect_node.protocol.sampling import (
    FLIP_ALPHA,
    FLIP_SUSPECT,
    MAX_SLACK,
    FlipTest,
    Replay,
    TokenReplay,
    first_failure,
    flip_chance,
    flip_test,
    poisson_at_least,
)
from intellect_node.protocol.verdicts import INCONCLUSIVE, PROOF_FACTOR, UNINFORMATIVE

# reasons under which a group's counter is not credited (batch-wide checks 1-5, counter check 6)
_NOT_CREDITED = frozenset({"wrong_run", "wrong_sampling", "engine_not_allowed", "stale_step", "unknown_checkpoint",
                           "uncommitted", "replayed_counter", "counter_cap", "counter_gap"})


@dataclass(frozen=True)
class RunContext:
    """The signed run spec and the task list it names (checked against its digest once, here)."""

    spec: RunSpec
    tasks: Sequence[Task]

    def __post_init__(self) -> None:
        if task_set_digest(self.tasks) != self.spec.task_set_digest:
            raise ValueError("the task list does not match the run spec's task-set digest")


@dataclass(frozen=True)
class GroupResult:
    counter: int
    reason: str | None  # None: accepted
    rewards: tuple[float, ...] = ()  # recomputed task rewards, one per completion, when accepted
    detail: str = ""
    # recomputed by this validator's prefill, when accepted: what the trainer trains on
    logprobs: tuple[tuple[float, ...], ...] = ()
    min_sampling_margin: float | None = None  # figures for the verify command and calibration
    max_logprob_error: float | None = None
    flips: int = 0  # the group's flip test, when accepted (specs/sampling.md section 4)
    expected_flips: float = 0.0
    # its deep_flip_test when judged under a pair at the wire's slack bound and not proven by it
    deep_flips: int = 0
    expected_deep_flips: float = 0.0


@dataclass(frozen=True)
class BatchVerdict:
    worker: str
    policy_step: int
    groups: tuple[GroupResult, ...]
    completions: int  # rows that went through the prefill (for throughput figures)

    @property
    def accepted(self) -> tuple[GroupResult, ...]:
        return tuple(g for g in self.groups if g.reason is None)

    @property
    def rejected(self) -> tuple[GroupResult, ...]:
        return tuple(g for g in self.groups if g.reason is not None)

    @property
    def credited(self) -> tuple[int, ...]:
        """Counters the judge credited: every judged group's, none refused by a batch-wide or a
        counter check."""
        return tuple(g.counter for g in self.groups if g.reason not in _NOT_CREDITED)


@dataclass
class _Pending:
    """A group that passed the cheap checks and waits for the prefill."""

    group: RolloutGroup
    proof_context: tuple[bytes, int]  # (manifest_hash, policy_step): what each row's proof key names
    task: Task
    prompt: list[int]
    completions: list[list[int]]
    replays: list[Replay]
    duplicate: bool  # its content was seen before in the window (check 11): see _judge_duplicate


def batch_precheck(batch: RolloutBatch, *, spec: RunSpec, validator_engine: str, newest_step: int,
                   checkpoint_step_of: Callable[[bytes], int | None]) -> str | None:
    """The batch-wide reason (checks 1-5) or None; the service uses it to defer unknown checkpoints."""
    if batch.run_id != spec.run_id:
        return "wrong_run"
    if (batch.sampling.temperature, batch.sampling.top_p, batch.sampling.max_tokens) != (
            spec.temperature, spec.top_p, spec.max_tokens):
        return "wrong_sampling"
    if spec.pair(batch.engine, validator_engine) is None:
        return "engine_not_allowed"
    if not newest_step - spec.async_window <= batch.policy_step <= newest_step:
        return "stale_step"
    if checkpoint_step_of(batch.manifest_hash) != batch.policy_step:
        return "unknown_checkpoint"
    return None


def verify_batch(
    signed_batch: codec.Signed[RolloutBatch], *, engine: Engine, tokenizer: object, run: RunContext,
    checkpoint_step_of: Callable[[bytes], int | None], newest_step: int, state: JudgeState,
    uninformative: frozenset[int] = frozenset(),
) -> BatchVerdict:
    """Judge every group of ``signed_batch``; the caller has loaded its checkpoint into ``engine``.

    ``state`` is updated: a counter is credited when its group is judged (accepted or not), and
    every group that reaches the content check enters the content index. ``uninformative`` (check
    17, a trainer that trusts a validator): counters whose task rewards an agreed trusted verdict
    found all equal; they pass the cheap checks and are then ``uninformative`` without the prefill,
    since no trainer learns from them. Nothing here scores or runs tokens before they are verified.
    """
    batch = signed_batch.message
    spec = run.spec
    reason = batch_precheck(batch, spec=spec, validator_engine=engine.name, newest_step=newest_step,
                            checkpoint_step_of=checkpoint_step_of)
    if reason is not None:
        return BatchVerdict(batch.worker, batch.policy_step,
                            tuple(GroupResult(g.counter, reason) for g in batch.groups), 0)
    state.forget_before(newest_step - spec.async_window)
    pair = spec.pair(batch.engine, engine.name)
    assert pair is not None  # batch_precheck
    results: dict[int, GroupResult] = {}
    pending: list[_Pending] = []
    for group in batch.groups:
        failure, task, prompt, duplicate = _cheap_checks(batch, group, run, tokenizer, state)
        if failure is not None:
            results[group.counter] = GroupResult(group.counter, failure)
            continue
        if group.counter in uninformative:
            results[group.counter] = GroupResult(group.counter, UNINFORMATIVE)
            continue
        seed = sampling_seed(batch.run_id, batch.worker, batch.policy_step, group.counter)
        pending.append(_Pending(
            group, (batch.manifest_hash, batch.policy_step), task, prompt,
            [unpack_tokens(c.token_ids).tolist() for c in group.completions],
            [Replay(derive_seed(seed, j), spec.temperature, spec.top_p, pair.sampling_slack)
             for j in range(len(group.completions))], duplicate))
    prefilled = _prefill(engine, pending)
    rows = 0
    for item, recomputed in zip(pending, prefilled, strict=True):
        if recomputed is None:
            results[item.group.counter] = GroupResult(item.group.counter, "bad_tokens")
            continue
        rows += len(recomputed)
        result = _judge_group(item, recomputed, engine, tokenizer, spec, pair)
        result = _judge_duplicate(result) if item.duplicate else result
        results[item.group.counter] = _steady_steering(result, state, batch.worker)
    return BatchVerdict(batch.worker, batch.policy_step,
                        tuple(results[g.counter] for g in batch.groups), rows)


def _steady_steering(result: GroupResult, state: JudgeState, worker: str) -> GroupResult:
    """An accepted group's flips added to the worker's; refused when, summed over its groups, they
    are beyond what its engine pair's noise explains (the flip test over the worker's history).
    Likewise, under a pair at the wire's slack bound, the tokens past the proof bound of every group
    judged within the other proof bounds, set aside or not (``deep_flip_test`` over the history): a
    forger deep in one prefix a group is set aside group by group, and proven after a few."""
    if result.deep_flips or result.expected_deep_flips:
        deep, explained = state.add_flips(worker, result.deep_flips, result.expected_deep_flips, deep=True)
        p_value = poisson_at_least(deep, explained)
        if p_value < FLIP_ALPHA:
            return GroupResult(result.counter, "sampling", detail=(
                f"this worker's groups hold {deep} tokens past the proof bound where the engine pair's noise "
                f"explains {explained:.3g} (p = {p_value:.2g} < {FLIP_ALPHA:g})"))
    if result.reason is not None:
        return result
    flips, expected = state.add_flips(worker, result.flips, result.expected_flips)
    p_value = poisson_at_least(flips, expected)
    if p_value >= FLIP_ALPHA:
        return result
    return GroupResult(result.counter, "sampling", detail=(
        f"this worker's groups hold {flips} tokens that are not the sampler's exact choice where the engine "
        f"pair's noise explains {expected:.3g} (p = {p_value:.2g} < {FLIP_ALPHA:g})"))


def _judge_duplicate(result: GroupResult) -> GroupResult:
    """A group whose content was seen before, after checks 12-16 ran on it with its own seeds.

    Copied work (one's own accepted group under a new counter, or another worker's) carries tokens
    that its new seeds did not sample: it fails a completion check, and the copy is the cheat,
    named ``duplicate_group``. A group that passes every check under its own seeds was sampled by
    this worker: two workers assigned the same task draw the same tokens whenever the policy is
    sharp enough (short answers, a policy that training has made confident), and refusing that
    would ban honest workers. It is accepted: an independent sample that happens to repeat
    another is data like any other; an ``inconclusive`` one stays that (its tokens replayed
    within the proof bounds under its own seeds, which a copy's do not)."""
    if result.reason in (None, INCONCLUSIVE):
        return result
    return GroupResult(result.counter, "duplicate_group",
                       detail=f"content seen before in the window, and not this worker's sampling: {result.reason}"
                              + (f" ({result.detail})" if result.detail else ""))


def _cheap_checks(batch: RolloutBatch, group: RolloutGroup, run: RunContext, tokenizer: object,
                  state: JudgeState) -> tuple[str | None, Task, list[int], bool]:
    """Group checks 6-11: counters, assignment, shape, prompt, content; no model needed. The last
    value says whether the content was seen before (judged after the replay: _judge_duplicate)."""
    spec, tasks = run.spec, run.tasks
    task = tasks[task_index(batch.run_id, batch.worker, batch.policy_step, group.counter, len(tasks),
                            beacon=batch.manifest_hash)]
    counter_problem = state.counter_problem(batch.worker, batch.policy_step, group.counter,
                                            spec.max_groups_per_step)
    if counter_problem is not None:
        return counter_problem, task, [], False
    if group.task_id != task.problem_id:
        return "wrong_task", task, [], False
    target = length_target(batch.run_id, batch.worker, batch.policy_step, group.counter, spec.length_targets,
                           beacon=batch.manifest_hash)
    if group.length_target != target:
        return "wrong_length_target", task, [], False
    if len(group.completions) != spec.group_size:
        return "wrong_group_size", task, [], False
    prompt = encode_prompt(tokenizer, with_length_target(task, target).prompt)
    if unpack_tokens(group.prompt_ids).tolist() != prompt:
        return "wrong_prompt", task, [], False
    digest = group_digest(group.prompt_ids, [c.token_ids for c in group.completions])
    return None, task, prompt, state.content_seen(digest, batch.policy_step)


def _prefill(engine: Engine, pending: list[_Pending]) -> list[list | None]:
    """One batched prefill (with the sampling replay) of every pending completion; None for a
    group the engine refuses (token ids outside the vocabulary, too long), found group by group."""
    prompts = [item.prompt for item in pending for _ in item.completions]
    completions = [c for item in pending for c in item.completions]
    replays = [r for item in pending for r in item.replays]
    if not completions:
        return []
    try:
        flat = engine.prefill(prompts, completions, replays)
    except ValueError:
        out: list[list | None] = []
        for item in pending:
            try:
                out.append(engine.prefill([item.prompt] * len(item.completions), item.completions, item.replays))
            except ValueError:
                out.append(None)
        return out
    out, start = [], 0
    for item in pending:
        out.append(flat[start:start + len(item.completions)])
        start += len(item.completions)
    return out


def _thresholds(pair: EnginePair, factor: float = 1.0) -> Thresholds:
    """The pair's TOPLOC thresholds, times ``factor`` (PROOF_FACTOR: the proof bound)."""
    return Thresholds(max_exp_mismatches=int(factor * pair.toploc_max_exp_mismatches),
                      max_mant_err_mean=factor * pair.toploc_max_mant_err_mean,
                      max_mant_err_median=factor * pair.toploc_max_mant_err_median)


def _judge_group(item: _Pending, recomputed: list[PrefillResult], engine: Engine, tokenizer: object,
                 spec: RunSpec, pair: EnginePair) -> GroupResult:
    """Completion checks 13-16 (TOPLOC, logprobs, termination, sampling) for each completion, the
    group's flip test and the answer span (specs/sampling.md section 4), then the recomputed rewards.

    Each figure meets two bounds (specs/validation.md, "Two bounds"): past PROOF_FACTOR times the
    pair's tolerance it proves a cheat and the group is refused under that check's reason; past
    the tolerance only, in any completion, and the group is ``inconclusive`` unless another
    completion proves a cheat (every completion is checked, so a proof is never hidden behind an
    inconclusive figure). Under a pair at the wire's slack bound a finite sampling margin past the
    proof bound proves nothing alone: ``deep_flip_test`` counts the prefixes ending in one, for the
    group here and for the worker's history in ``_steady_steering``."""
    counter = item.group.counter
    eos = set(engine.eos_token_ids)
    tolerance, proof = _thresholds(pair), _thresholds(pair, PROOF_FACTOR)
    logprob_proof, slack_proof = PROOF_FACTOR * pair.logprob_atol, PROOF_FACTOR * pair.sampling_slack
    # the pair's honest depths reach past what the wire can state: depth proves by count (deep_flip_test)
    counted_depth = pair.sampling_slack >= MAX_SLACK
    logprobs, margin, worst, beyond_tolerance = [], float("inf"), 0.0, []
    for j, (record, tokens, again) in enumerate(zip(item.group.completions, item.completions, recomputed, strict=True)):
        if again.hidden_states.shape[0] != len(tokens):  # the engine's contract: one state per token
            raise RuntimeError(f"prefill gave {again.hidden_states.shape[0]} states for {len(tokens)} tokens")
        key = proof_key(*item.proof_context, item.group.prompt_ids, record.token_ids)
        verdicts = verify_proofs(again.hidden_states, list(record.proofs), key=key, thresholds=proof)
        bad = [(c, v) for c, v in enumerate(verdicts) if not v.ok]
        if bad:
            c, v = bad[0]
            return GroupResult(counter, "toploc", detail=(
                f"completion {j}: chunk {c} of {len(verdicts)} ({len(tokens)} tokens): {v.reason} "
                f"({v.exp_mismatches} sign/exponent mismatches, mantissa mean {v.mant_err_mean:.3g}, "
                f"median {v.mant_err_median:.3g}) against this row's states and its proof key"))
        loose = [(c, v) for c, v in enumerate(rejudge(v, tolerance) for v in verdicts) if not v.ok]
        if loose:
            beyond_tolerance.append(f"completion {j}: TOPLOC chunk {loose[0][0]} {loose[0][1]}")
        ours = again.logprobs.to(torch.float32).numpy()  # engines return CPU tensors (engine.base)
        error = float(np.max(np.abs(unpack_logprobs(record.logprobs) - ours)))
        if not error <= logprob_proof:
            return GroupResult(counter, "logprobs", detail=f"completion {j}: error {error:.3g} > {logprob_proof:.3g}")
        if error > pair.logprob_atol:
            beyond_tolerance.append(f"completion {j}: logprob error {error:.3g} > {pair.logprob_atol:.3g}")
        problem = termination_problem(tokens, record.finish_reason, eos, spec.max_tokens)
        if problem:
            return GroupResult(counter, "termination", detail=f"completion {j}: {problem}")
        assert again.sampling_margins is not None  # asked for by _prefill
        margins = again.sampling_margins
        # a token outside the top-p set (margin -inf) is never honest precision: proven under any pair
        position = first_failure(np.where(np.isfinite(margins), 0.0, margins) if counted_depth else margins,
                                 slack_proof)
        if position is not None:
            return GroupResult(counter, "sampling", detail=(
                f"completion {j}: token {position} (id {tokens[position]}) is not the sampler's choice: "
                f"margin {again.sampling_margins[position]:.3g} < -{slack_proof:.3g}"))
        # the detail names a counted token first (past the proof bound), else the first past the slack
        counted = counted_depth and bool(np.any(margins < -slack_proof))
        position = first_failure(margins, slack_proof if counted else pair.sampling_slack)
        if position is not None:
            beyond_tolerance.append(f"completion {j}: token {position} margin {margins[position]:.3g} < -"
                                    + (f"{slack_proof:.3g} (past the proof bound: counted)" if counted
                                       else f"{pair.sampling_slack:.3g}"))
        logprobs.append(tuple(float(x) for x in ours))
        margin, worst = min(margin, float(np.min(again.sampling_margins))), max(worst, error)
    if not counted_depth:
        return _within_bounds(item, recomputed, tokenizer, pair, beyond_tolerance, logprobs, margin, worst)
    deep = deep_flip_test(item.completions, [TokenReplay(a.sampling_margins, a.sampling_gaps) for a in recomputed],
                          pair)
    if deep.p_value < FLIP_ALPHA:
        return GroupResult(counter, "sampling", detail=(
            f"{deep.flips} of the group's prefixes end in a token past the proof bound (margin < -{slack_proof:.3g}) "
            f"where the engine pair's noise explains {deep.expected:.3g} (p = {deep.p_value:.2g} < {FLIP_ALPHA:g})"))
    return dataclasses.replace(_within_bounds(item, recomputed, tokenizer, pair, beyond_tolerance, logprobs, margin,
                                              worst), deep_flips=deep.flips, expected_deep_flips=deep.expected)


def _within_bounds(item: _Pending, recomputed: list[PrefillResult], tokenizer: object, pair: EnginePair,
                   beyond_tolerance: list[str], logprobs: list[tuple[float, ...]], margin: float,
                   worst: float) -> GroupResult:
    """The verdict of a group whose every completion stayed within the proof bounds: set aside for
    a figure past a tolerance, else the flip test and the answer span, else accepted with its
    recomputed rewards and logprobs (specs/sampling.md section 4)."""
    counter = item.group.counter
    if beyond_tolerance:
        return GroupResult(counter, INCONCLUSIVE, detail=(
            f"past the engine pair's tolerance, not proven: {'; '.join(beyond_tolerance[:3])}"))
    flips = flip_test([TokenReplay(a.sampling_margins, a.sampling_gaps) for a in recomputed], pair.margin_noise)
    proven = flips.p_value < FLIP_ALPHA
    if not proven:  # a proof first; then the answer span (specs/sampling.md section 4, "The answer span")
        for j, (tokens, again) in enumerate(zip(item.completions, recomputed, strict=True)):
            position = answer_span_flip(tokens, again.sampling_margins, tokenizer)
            if position is not None:
                return GroupResult(counter, INCONCLUSIVE, detail=(
                    f"completion {j}: token {position} (id {tokens[position]}) of the final answer span is not the "
                    f"sampler's exact choice (margin {again.sampling_margins[position]:.3g}): a flip where the "
                    f"answer is read"))
    if flips.p_value < FLIP_SUSPECT:
        return GroupResult(counter, "sampling" if proven else INCONCLUSIVE, detail=(
            f"{flips.flips} tokens are not the sampler's exact choice where the engine pair's noise explains "
            f"{flips.expected:.3g} (p = {flips.p_value:.2g} < {FLIP_ALPHA if proven else FLIP_SUSPECT:g})"))
    rewards = [float(task_reward(item.task, tokenizer.decode(tokens, skip_special_tokens=True)))
               for tokens in item.completions]
    return GroupResult(counter, None, tuple(rewards), logprobs=tuple(logprobs),
                       min_sampling_margin=margin, max_logprob_error=worst, flips=flips.flips,
                       expected_flips=flips.expected)


def deep_flip_test(completions: Sequence[Sequence[int]], replays: Sequence[TokenReplay], pair: EnginePair) -> FlipTest:
    """specs/sampling.md section 4, "The bounds", for a pair at the wire's slack bound: how many
    tokens past the proof bound (``PROOF_FACTOR`` times the slack) a group holds, each counted once
    per prefix (the group shares its prompt) and not at all after such a token of its own prefix,
    against how many honest noise explains (``expected``: the sum over every token of
    ``flip_chance`` at the larger of the proof bound and the position's gap, since a competitor must
    overtake the claimed token by both), and the Poisson chance of at least that many.

    Why by prefix: honest precision errors are a property of the state a token is sampled in (bf16
    against fp32 on the tiny model, the last hidden state at an uncertain position a quarter off:
    bench/HISTORY.md, issue 50), so completions that share a prefix and a token flip deep together,
    and every later state reads the diverged one's keys and values."""
    proof = PROOF_FACTOR * pair.sampling_slack
    deep: set[tuple[int, ...]] = set()  # prefixes ending in a token past the proof bound
    expected = 0.0
    for tokens, replay in zip(completions, replays, strict=True):
        expected += float(flip_chance(np.maximum(replay.gaps, proof), pair.margin_noise).sum())
        deep.update(tuple(tokens[:k + 1]) for k in np.nonzero(replay.margins < -proof)[0])
    first = sum(not any(prefix[:n] in deep for n in range(1, len(prefix))) for prefix in deep)
    return FlipTest(first, expected, poisson_at_least(first, expected))


def termination_problem(tokens: Sequence[int], finish_reason: str, eos: set[int], max_tokens: int) -> str:
    """Why the claimed ending is impossible, or "" when it is consistent."""
    if any(t in eos for t in tokens[:-1]):
        return "tokens after an end-of-sequence token"
    if tokens[-1] in eos:
        return "" if finish_reason == "stop" else f"ends with EOS but claims {finish_reason!r}"
    if finish_reason != "length":
        return "claims 'stop' without an end-of-sequence token"
    if len(tokens) != max_tokens:
        return f"claims 'length' with {len(tokens)} of {max_tokens} tokens"
    return ""
