"""The inner optimizer recipe: AdamW with decay on matrices only, linear warm-up, cosine decay to a
floor, gradient clipping. The outer half of DiLoCo's recipe (Nesterov momentum on the averaged
pseudo-gradient) is ``outer``.

Why here: a DiLoCo peer's H inner steps are this recipe at a constant rate (``constant``: the
outer step does the rest), and a workload's one-machine pretraining is the same recipe with a
schedule (node/metagene/recipe.py holds METAGENE-1's numbers), so both train alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Recipe:
    lr: float
    min_lr: float
    warmup_steps: int
    total_steps: int
    weight_decay: float = 0.1  # matrices (embeddings included); RMSNorm gains are not decayed
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_steps < self.total_steps:
            raise ValueError("need 0 <= warmup_steps < total_steps")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError("need 0 <= min_lr <= lr")

    @classmethod
    def constant(cls, lr: float, weight_decay: float, betas: tuple[float, float]) -> Recipe:
        """A DiLoCo peer's inner recipe (``[diloco] inner_lr``, ``weight_decay``, ``betas``): no warm-up,
        no decay of the rate."""
        return cls(lr=lr, min_lr=lr, warmup_steps=0, total_steps=1, weight_decay=weight_decay, betas=betas)

    def lr_at(self, step: int) -> float:
        """Learning rate at optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - 1 - self.warmup_steps))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, recipe: Recipe) -> torch.optim.AdamW:
    """AdamW with decay on parameters of rank >= 2 only."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=recipe.lr_at(0), betas=recipe.betas)
