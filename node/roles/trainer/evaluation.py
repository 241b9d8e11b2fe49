"""Held-out greedy accuracy: the number that says whether the run is learning.

The held-out tasks are generated from their own seed, disjoint from every training and task-set
seed, and carry a length target the way workers' prompts do (cycling through the targets), so the
score measures the policy on the prompts it is trained on, never on prompts it has seen.
"""

from __future__ import annotations

from collections.abc import Sequence

from intellect_node.node.engine.base import Engine, SamplingParams, encode_prompt
from intellect_node.node.tasks.schema import Task, with_length_target
from intellect_node.node.tasks.toy import generate_toy_tasks
from intellect_node.node.tasks.verify import task_reward
from intellect_node.protocol.rollout_shape import DEFAULT_LENGTH_TARGETS

EVAL_SEED = 9_000_001


def held_out_tasks(count: int = 200, kinds: Sequence[str] = ("add", "reverse")) -> list[Task]:
    """Evaluation prompts of ``kinds``; of a small-model kind, only problems no training set holds
    (``toy.is_held_out``)."""
    return generate_toy_tasks(EVAL_SEED, count, kinds, split="held_out")


def greedy_accuracy(engine: Engine, tokenizer: object, tasks: Sequence[Task], max_tokens: int = 64,
                    length_targets: Sequence[int] = DEFAULT_LENGTH_TARGETS) -> float:
    """Share of ``tasks`` solved by the engine's greedy completion."""
    if not tasks:
        raise ValueError("no evaluation tasks")
    prompts = [encode_prompt(tokenizer, with_length_target(task, length_targets[i % len(length_targets)]).prompt)
               for i, task in enumerate(tasks)]
    outputs = engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_tokens=max_tokens), capture_hidden=False)
    solved = 0
    for task, (completion,) in zip(tasks, outputs, strict=True):
        text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)  # type: ignore[attr-defined]
        solved += task_reward(task, text) > 0
    return solved / len(tasks)
