"""Measure each task's solve rate with a model, so that the offline filter has data to act on.

INTELLECT-2 filtered its tasks by the base model's pass rate before training (keeping 0.1-0.8):
tasks always or never solved give GRPO groups with zero advantage. The published data carries
rates measured with a 7B model; for our own task sets (toy tasks, new files) this computes them
with whatever model the run starts from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from intellect_node.node.engine.base import Engine, SamplingParams, encode_prompt
from intellect_node.node.tasks.schema import Task
from intellect_node.node.tasks.verify import task_reward


def measure_solve_rates(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[Task],
    samples: int = 8,
    params: SamplingParams | None = None,
) -> list[Task]:
    """The tasks with ``solve_rate`` set to the fraction of ``samples`` sampled completions that
    pass the task's verifier (temperature 1 by default, as in RL)."""
    if samples < 1:
        raise ValueError("samples must be >= 1")
    params = params or SamplingParams(temperature=1.0, max_tokens=64, seed=0)
    prompts = [encode_prompt(tokenizer, t.prompt) for t in tasks]
    groups = engine.generate(prompts, n=samples, params=params, capture_hidden=False)
    measured = []
    for task, group in zip(tasks, groups, strict=True):
        texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group]
        rate = sum(task_reward(task, text) for text in texts) / samples
        measured.append(dataclasses.replace(task, solve_rate=rate))
    return measured
