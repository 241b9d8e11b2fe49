"""One entry point from (task, completion text) to a task reward in {0.0, 1.0}.

The trainer and validators call ``task_reward``; the length part of the INTELLECT-2 reward
(``- 0.0003 * |len - target|``) is the trainer's, because it needs token counts, not text.
"""

from __future__ import annotations

from collections.abc import Sequence

from intellect_node.node.tasks.code_verifier import verify_code
from intellect_node.node.tasks.math_verifier import verify_math
from intellect_node.node.tasks.sandbox import SandboxLimits
from intellect_node.node.tasks.schema import Task
from intellect_node.node.tasks.toy import verify_toy


def task_reward(task: Task, completion: str, code_limits: SandboxLimits | None = None) -> float:
    """1.0 when the completion solves ``task`` according to its type's verifier, else 0.0."""
    if task.task_type == "toy":
        ok = verify_toy(completion, task.verification_info)
    elif task.task_type == "math":
        ok = verify_math(completion, task.verification_info)
    elif task.task_type == "code":
        ok = verify_code(completion, task.verification_info, code_limits)
    else:  # Task validates its type, so this is a programming error
        raise ValueError(f"no verifier for task type {task.task_type!r}")
    return 1.0 if ok else 0.0


def teaches_nothing(task_rewards: Sequence[float]) -> bool:
    """GRPO's online filter: a group whose task rewards are all equal (all solved, or none).

    Judged on the task reward, not the total: the length reward is continuous, so a group of
    equally wrong answers of different lengths would otherwise keep a slot only to learn length.
    Its advantages are all zero: no trainer learns from it, which is why a trainer that trusts a
    validator need not verify it (specs/validation.md, check 17).
    """
    return len(set(task_rewards)) <= 1
