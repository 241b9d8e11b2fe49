"""Rewards, group advantages and the online filter of INTELLECT-2's GRPO.

The task reward comes from the verifier (recomputed by the trainer's own checks, never the
worker's claim); the length reward steers completion length toward the target stated in the
prompt. Advantages are normalized within each group (the n completions of one prompt), so a group
whose completions all scored the same teaches nothing and is filtered out before it takes a slot
in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from intellect_node.node.roles.trainer.config import RewardConfig

ADVANTAGE_EPS = 1e-6


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

