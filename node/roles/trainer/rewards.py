"""Rewards, group advantages and the online filter of INTELLECT-2's GRPO.

The task reward comes from the verifier (recomputed by the trainer's own checks, never the
worker's claim); the length reward steers completion length toward the target stated in the
prompt. Advantages are normalized within each group (the n completions of one prompt), so a group
whose completions all scored the same teaches nothing and is filtered out before it takes a slot
in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LENGTH_FORMS = ("absolute", "over", "none")
ADVANTAGE_EPS = 1e-6


@dataclass(frozen=True)
class RewardConfig:
    """``absolute``: -c * |len - target| (INTELLECT-2); ``over``: only length beyond the target
    costs; ``none``: task reward alone."""

    length_coef: float = 0.0003
    length_form: str = "absolute"

    def __post_init__(self) -> None:
        if self.length_form not in LENGTH_FORMS:
            raise ValueError(f"length reward form {self.length_form!r}; choose one of {LENGTH_FORMS}")
        if self.length_coef < 0:
            raise ValueError("length reward coefficient must be >= 0")


def length_reward(length: int, target: int | None, config: RewardConfig) -> float:
    """The length part of the reward; 0 for prompts without a target."""
    if target is None or config.length_form == "none":
        return 0.0
    if config.length_form == "over":
        return -config.length_coef * max(0, length - target)
    return -config.length_coef * abs(length - target)


def total_rewards(task_rewards: Sequence[float], lengths: Sequence[int], target: int | None,
                  config: RewardConfig) -> np.ndarray:
    return np.array([r + length_reward(n, target, config) for r, n in zip(task_rewards, lengths, strict=True)],
                    dtype=np.float64)


def group_advantages(rewards: np.ndarray) -> np.ndarray:
    """(r - mean) / (std + 1e-6) within one group (population std, as INTELLECT-2)."""
    return (rewards - rewards.mean()) / (rewards.std() + ADVANTAGE_EPS)

