"""Turning assigned tasks into a signed-ready RolloutBatch: compute only, no network.

Everything a worker puts in a batch is either derived from public values (task, length target,
sampling seed: ``intellect_node.protocol.assignment``) or measured by the engine (tokens, logprobs, hidden
states, from which the TOPLOC proofs are built), so a validator holding the same checkpoint can
recompute and check every group. Runs in a worker thread: it blocks for the whole generation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from intellect_node.node.engine.base import Engine, SamplingParams, encode_prompt
from intellect_node.node.engine.proofs import build_completion_proofs
from intellect_node.node.tasks.schema import Task, with_length_target
from intellect_node.node.tasks.verify import task_reward
from intellect_node.protocol.assignment import length_target, sampling_seed, task_index
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import (
    CompletionRecord,
    RolloutBatch,
    RolloutGroup,
    pack_logprobs,
    pack_tokens,
    proof_key,
)


@dataclass(frozen=True)
class BuiltBatch:
    batch: RolloutBatch
    generated_tokens: int
    seconds: float


def build_batch(engine: Engine, tokenizer: object, tasks: Sequence[Task], *, run_id: str, worker: str, step: int,
                manifest_hash: bytes, first_counter: int, settings: RolloutShape) -> BuiltBatch:
    """Generate the groups for counters ``first_counter ..`` of (worker, step) and pack them.

    All groups go to the engine in one call (each prompt with its own counter's seed): the
    per-call cost of a decode loop is paid once per batch, not once per group."""
    started = time.perf_counter()
    counters = range(first_counter, first_counter + settings.groups_per_batch)
    chosen = [tasks[task_index(run_id, worker, step, counter, len(tasks), beacon=manifest_hash)]
              for counter in counters]
    targets = [length_target(run_id, worker, step, counter, settings.length_targets, beacon=manifest_hash)
               for counter in counters]
    prompts = [encode_prompt(tokenizer, with_length_target(task, target).prompt)
               for task, target in zip(chosen, targets, strict=True)]
    params = SamplingParams(temperature=settings.temperature, top_p=settings.top_p, max_tokens=settings.max_tokens,
                            prompt_seeds=tuple(sampling_seed(run_id, worker, step, counter) for counter in counters))
    generations = engine.generate(prompts, settings.group_size, params)
    groups = []
    generated = 0
    for counter, task, target, prompt_ids, completions in zip(counters, chosen, targets, prompts, generations,
                                                              strict=True):
        packed_prompt = pack_tokens(prompt_ids)
        keys = [proof_key(manifest_hash, step, packed_prompt, pack_tokens(c.token_ids)) for c in completions]
        proofs = build_completion_proofs([c.hidden_states for c in completions], keys)
        records = []
        for completion, completion_proofs in zip(completions, proofs, strict=True):
            text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            records.append(CompletionRecord(
                token_ids=pack_tokens(completion.token_ids),
                logprobs=pack_logprobs(completion.logprobs),
                finish_reason=completion.finish_reason,
                proofs=tuple(completion_proofs),
                reward=float(task_reward(task, text)),
            ))
            generated += len(completion.token_ids)
        groups.append(RolloutGroup(counter=counter, task_id=task.problem_id, length_target=target,
                                   prompt_ids=packed_prompt, completions=tuple(records)))
    batch = RolloutBatch(
        run_id=run_id, worker=worker, policy_step=step, manifest_hash=manifest_hash, engine=engine.name,
        sampling=settings.sampling,
        groups=tuple(groups),
    )
    return BuiltBatch(batch=batch, generated_tokens=generated, seconds=time.perf_counter() - started)
