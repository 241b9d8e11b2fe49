"""The pretraining loss: next-token cross entropy plus METAGENE-1's z-loss.

Why z-loss: it penalises the squared log-partition ``log Z = logsumexp(logits)``, keeping the
output logits from drifting large, which METAGENE-1 used (weight 2e-4) for stable training. Both
terms are averaged over target tokens (labels != -100), in float32 whatever the logits' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from intellect_node.node.metagene.sequences import IGNORE

Z_LOSS_WEIGHT = 2e-4


@dataclass
class LossParts:
    total: torch.Tensor
    cross_entropy: torch.Tensor
    z_loss: torch.Tensor
    tokens: int


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, z_loss_weight: float = Z_LOSS_WEIGHT) -> LossParts:
    """``logits [.., vocab]`` against ``labels [..]`` (already aligned: label i is the target of
    position i, as ``sequences`` builds them)."""
    keep = labels != IGNORE
    picked = logits[keep].float()
    targets = labels[keep]
    if targets.numel() == 0:
        raise ValueError("no target tokens in the batch")
    log_z = torch.logsumexp(picked, dim=-1)
    cross_entropy = (log_z - picked.gather(-1, targets[:, None]).squeeze(-1)).mean()
    z_loss = log_z.square().mean()
    return LossParts(cross_entropy + z_loss_weight * z_loss, cross_entropy, z_loss, int(targets.numel()))
