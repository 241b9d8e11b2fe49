"""METAGENE-1's optimisation recipe: AdamW, linear warm-up, cosine decay to a floor, clipping.

lr 6e-4 after 2,000 warm-up steps, cosine to 4e-5 at the last step; weight decay 0.1 on matrices
(embeddings included; RMSNorm gains are not decayed); betas (0.9, 0.95);
gradient clip 1.0; z-loss 2e-4. ``warmup_steps`` and ``total_steps`` scale down for short runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from intellect_node.node.metagene.loss import Z_LOSS_WEIGHT


@dataclass(frozen=True)
class Recipe:
    lr: float = 6e-4
    min_lr: float = 4e-5
    warmup_steps: int = 2000
    total_steps: int = 100_000
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    z_loss: float = Z_LOSS_WEIGHT

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_steps < self.total_steps:
            raise ValueError("need 0 <= warmup_steps < total_steps")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError("need 0 <= min_lr <= lr")

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
