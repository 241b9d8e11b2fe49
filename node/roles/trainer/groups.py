"""A verified GRPO group as the trainer keeps it: tokens, recomputed task rewards, provenance.

Held in memory and, until trained on, durably on disk (``intellect_node.node.roles.trainer.pool``), so it has a plain
msgpack form. Token ids stay the worker's exact ids: the trainer must score the very tokens that
were sampled, never a re-tokenization of their text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainingGroup:
    key: str  # "<batch digest>:<counter>", unique in the run
    worker: str
    policy_step: int
    task_id: str
    length_target: int | None
    prompt: tuple[int, ...]
    completions: tuple[tuple[int, ...], ...]
    task_rewards: tuple[float, ...]  # recomputed by the trainer's checks, one per completion
    # the sampling policy's, per token, from the trainer's own verification prefill; empty for an
    # adopted verdict the worker's claims its trusted validators vouched for (check 14); empty: the
    # learner recomputes them
    logprobs: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.task_rewards) or not self.completions:
            raise ValueError(f"group {self.key}: {len(self.completions)} completions, {len(self.task_rewards)} rewards")
        if any(not c for c in self.completions):
            raise ValueError(f"group {self.key}: an empty completion (the wire format has at least one token)")
        if self.logprobs and [len(c) for c in self.completions] != [len(lp) for lp in self.logprobs]:
            raise ValueError(f"group {self.key}: logprobs do not match the completions' lengths")

    @property
    def counter(self) -> int:
        """The worker's counter of this group in its step (the key's suffix)."""
        return int(self.key.rpartition(":")[2])

    @property
    def lengths(self) -> list[int]:
        return [len(c) for c in self.completions]

    def to_wire(self) -> dict[str, Any]:
        return {"key": self.key, "worker": self.worker, "policy_step": self.policy_step, "task_id": self.task_id,
                "length_target": self.length_target, "prompt": list(self.prompt),
                "completions": [list(c) for c in self.completions], "task_rewards": list(self.task_rewards),
                "logprobs": [list(lp) for lp in self.logprobs]}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> TrainingGroup:
        return cls(key=str(data["key"]), worker=str(data["worker"]), policy_step=int(data["policy_step"]),
                   task_id=str(data["task_id"]),
                   length_target=None if data["length_target"] is None else int(data["length_target"]),
                   prompt=tuple(int(t) for t in data["prompt"]),
                   completions=tuple(tuple(int(t) for t in c) for c in data["completions"]),
                   task_rewards=tuple(float(r) for r in data["task_rewards"]),
                   logprobs=tuple(tuple(float(x) for x in lp) for lp in data["logprobs"]))
