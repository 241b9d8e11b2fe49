"""Verifying an untrusted rollout batch: compute only, no network (runs in a worker thread).

A validator re-does exactly what ``intellect_node.node.roles.inference.builder`` did, except the sampling: it recomputes
the assignment (task, length target), the prompt tokens, and with one batched prefill of prompt +
completion on the claimed checkpoint the hidden states (TOPLOC) and the raw-model logprobs, then
checks termination and recomputes rewards. One prefill costs a fraction of the token-by-token
generation it checks, which is what makes validation cheap. The trainer reuses ``verify_batch``.
specs/validation.md is normative; the checks run in its order and the first failure names a
group's reason.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from intellect_node.crypto.toploc import Thresholds, verify_proofs
from intellect_node.node.engine.base import Engine, encode_prompt
from intellect_node.node.roles.inference.builder import DEFAULT_LENGTH_TARGETS
from intellect_node.node.tasks.schema import Task, with_length_target
from intellect_node.node.tasks.verify import task_reward
from intellect_node.protocol import codec
from intellect_node.protocol.assignment import length_target, task_index
from intellect_node.protocol.rollouts import (
    RolloutBatch,
    RolloutGroup,
    unpack_logprobs,
    unpack_tokens,
)

SeenCounters = MutableMapping[tuple[str, int], set[int]]


@dataclass(frozen=True)
class Tolerances:
    """How far a recomputation may differ from the worker's claims.

    Same engine: the validator runs the worker's kernels (modulo batch shape), so TOPLOC mantissa
    errors stay near 0 and logprobs agree to float32 noise; tight limits catch 1% weight noise.
    Other engine (vLLM worker, torch validator): the INTELLECT-2 TOPLOC defaults and a looser
    logprob bound absorb bf16 kernel differences.
    """

    same_engine_toploc: Thresholds = Thresholds(max_exp_mismatches=38, max_mant_err_mean=2.0,
                                                max_mant_err_median=2.0)
    cross_engine_toploc: Thresholds = Thresholds()
    same_engine_logprob_atol: float = 1e-3
    cross_engine_logprob_atol: float = 0.1


@dataclass(frozen=True)
class GroupResult:
    counter: int
    reason: str | None  # None: accepted
    rewards: tuple[float, ...] = ()  # recomputed task rewards, one per completion, when accepted
    detail: str = ""


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


@dataclass
class _Pending:
    """A group that passed the cheap checks and waits for the prefill."""

    group: RolloutGroup
    task: Task
    prompt: list[int]
    completions: list[list[int]] = field(default_factory=list)


def batch_precheck(batch: RolloutBatch, *, run_id: str, newest_step: int, async_window: int,
                   checkpoint_step_of: Callable[[bytes], int | None]) -> str | None:
    """The batch-wide reason (checks 1-3) or None; the service uses it to defer unknown checkpoints."""
    if batch.run_id != run_id:
        return "wrong_run"
    if not newest_step - async_window <= batch.policy_step <= newest_step:
        return "stale_step"
    if checkpoint_step_of(batch.manifest_hash) != batch.policy_step:
        return "unknown_checkpoint"
    return None


def verify_batch(
    signed_batch: codec.Signed[RolloutBatch], *, engine: Engine, tokenizer: object, tasks: Sequence[Task],
    run_id: str, checkpoint_step_of: Callable[[bytes], int | None], newest_step: int, async_window: int,
    seen_counters: SeenCounters, tolerances: Tolerances = Tolerances(),
    length_targets: Sequence[int] = DEFAULT_LENGTH_TARGETS,
) -> BatchVerdict:
    """Judge every group of ``signed_batch``; the caller has loaded its checkpoint into ``engine``.

    ``seen_counters`` is updated: every counter of a batch past the batch-wide checks becomes seen
    for (worker, step), accepted or not, so the same counter never passes twice.
    """
    batch = signed_batch.message
    reason = batch_precheck(batch, run_id=run_id, newest_step=newest_step, async_window=async_window,
                            checkpoint_step_of=checkpoint_step_of)
    if reason is not None:
        return BatchVerdict(batch.worker, batch.policy_step,
                            tuple(GroupResult(g.counter, reason) for g in batch.groups), 0)
    results: dict[int, GroupResult] = {}
    pending: list[_Pending] = []
    seen = seen_counters.setdefault((batch.worker, batch.policy_step), set())
    for group in batch.groups:
        failure, task, prompt = _cheap_checks(batch, group, tasks, tokenizer, seen, length_targets)
        seen.add(group.counter)
        if failure is not None:
            results[group.counter] = GroupResult(group.counter, failure)
        else:
            pending.append(_Pending(group, task, prompt,
                                    [unpack_tokens(c.token_ids).tolist() for c in group.completions]))
    same = batch.engine == engine.name
    thresholds = tolerances.same_engine_toploc if same else tolerances.cross_engine_toploc
    atol = tolerances.same_engine_logprob_atol if same else tolerances.cross_engine_logprob_atol
    prefilled = _prefill(engine, pending)
    rows = 0
    for item, recomputed in zip(pending, prefilled):
        if recomputed is None:
            results[item.group.counter] = GroupResult(item.group.counter, "bad_tokens")
            continue
        rows += len(recomputed)
        results[item.group.counter] = _judge_group(batch, item, recomputed, engine, tokenizer, thresholds, atol)
    return BatchVerdict(batch.worker, batch.policy_step,
                        tuple(results[g.counter] for g in batch.groups), rows)


def _cheap_checks(batch: RolloutBatch, group: RolloutGroup, tasks: Sequence[Task], tokenizer: object,
                  seen: set[int], length_targets: Sequence[int]) -> tuple[str | None, Task, list[int]]:
    """Checks 4-7: assignment, replay, prompt; no model needed."""
    task = tasks[task_index(batch.run_id, batch.worker, batch.policy_step, group.counter, len(tasks))]
    if group.task_id != task.problem_id:
        return "wrong_task", task, []
    target = length_target(batch.run_id, batch.worker, batch.policy_step, group.counter, length_targets)
    if group.length_target != target:
        return "wrong_length_target", task, []
    if group.counter in seen:
        return "replayed_counter", task, []
    prompt = encode_prompt(tokenizer, with_length_target(task, target).prompt)
    if unpack_tokens(group.prompt_ids).tolist() != prompt:
        return "wrong_prompt", task, []
    return None, task, prompt


def _prefill(engine: Engine, pending: list[_Pending]) -> list[list | None]:
    """One batched prefill of every pending completion; None for a group the engine refuses
    (token ids outside the vocabulary, too long), found by retrying group by group."""
    prompts = [item.prompt for item in pending for _ in item.completions]
    completions = [c for item in pending for c in item.completions]
    if not completions:
        return []
    try:
        flat = engine.prefill(prompts, completions)
    except ValueError:
        out: list[list | None] = []
        for item in pending:
            try:
                out.append(engine.prefill([item.prompt] * len(item.completions), item.completions))
            except ValueError:
                out.append(None)
        return out
    out, start = [], 0
    for item in pending:
        out.append(flat[start:start + len(item.completions)])
        start += len(item.completions)
    return out


def _judge_group(batch: RolloutBatch, item: _Pending, recomputed: list, engine: Engine, tokenizer: object,
                 thresholds: Thresholds, atol: float) -> GroupResult:
    """Checks 9-11 for each completion, then the recomputed rewards."""
    counter = item.group.counter
    eos = set(engine.eos_token_ids)
    rewards = []
    for j, (record, tokens, again) in enumerate(zip(item.group.completions, item.completions, recomputed)):
        verdicts = verify_proofs(again.hidden_states, list(record.proofs), thresholds=thresholds)
        bad = [v for v in verdicts if not v.ok]
        if bad:
            return GroupResult(counter, "toploc", detail=f"completion {j}: {bad[0]}")
        error = float(np.max(np.abs(unpack_logprobs(record.logprobs) - again.logprobs.to(torch.float32).numpy())))
        if not error <= atol:
            return GroupResult(counter, "logprobs", detail=f"completion {j}: error {error:.3g} > {atol}")
        problem = termination_problem(tokens, record.finish_reason, eos, batch.sampling.max_tokens)
        if problem:
            return GroupResult(counter, "termination", detail=f"completion {j}: {problem}")
        rewards.append(float(task_reward(item.task, tokenizer.decode(tokens, skip_special_tokens=True))))
    return GroupResult(counter, None, tuple(rewards))


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
