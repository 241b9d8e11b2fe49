"""METAGENE-1's numbers for the inner optimizer recipe (node/diloco/recipe.py), plus its z-loss.

lr 6e-4 after 2,000 warm-up steps, cosine to 4e-5 at the last step; weight decay 0.1 on matrices
(embeddings included; RMSNorm gains are not decayed); betas (0.9, 0.95);
gradient clip 1.0; z-loss 2e-4. ``warmup_steps`` and ``total_steps`` scale down for short runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from intellect_node.node.diloco.recipe import Recipe
from intellect_node.node.metagene.loss import Z_LOSS_WEIGHT


@dataclass(frozen=True)
class MetageneRecipe(Recipe):
    lr: float = 6e-4
    min_lr: float = 4e-5
    warmup_steps: int = 2000
    total_steps: int = 100_000
    z_loss: float = Z_LOSS_WEIGHT
