"""Which tasks a model can take: a prompt and the run's whole completion must fit its positions.

Why it is checked before a node starts: a task is assigned by the beacon, not chosen, so a worker
given one whose prompt leaves fewer than ``max_tokens`` positions cannot generate it, and the same
counter is assigned again after every restart (seen: a worker on math word problems with the
256-position tiny model restarted its generation forever). Every role of a run loads the same
tasks and model, so one check refuses the configuration everywhere, naming the tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from intellect_node.node.engine.base import encode_prompt
from intellect_node.node.tasks.schema import Task, with_length_target

# the length instructions differ only in their number (a few digits), so their prompts' token counts differ
# by less than this: a prompt this far inside the limit with one instruction fits with all of them
INSTRUCTION_SLACK = 16


def prompt_tokens(task: Task, tokenizer: Any, target: int) -> int:
    """Tokens of ``task``'s prompt as a worker sends it, with the length instruction for ``target``."""
    return len(encode_prompt(tokenizer, with_length_target(task, target).prompt))


def unfit_tasks(tasks: Sequence[Task], tokenizer: Any, positions: int, max_tokens: int,
                length_targets: Sequence[int]) -> list[tuple[str, int]]:
    """``(problem_id, prompt tokens)`` of each task whose prompt leaves fewer than ``max_tokens`` of
    the model's ``positions`` (the engines refuse such a prompt: torch_engine.generate)."""
    unfit = []
    for task in tasks:
        tokens = prompt_tokens(task, tokenizer, max(length_targets))
        if tokens + max_tokens + INSTRUCTION_SLACK > positions:  # near the limit: each instruction, exactly
            tokens = max(prompt_tokens(task, tokenizer, target) for target in length_targets)
            if tokens + max_tokens > positions:
                unfit.append((task.problem_id, tokens))
    return unfit
