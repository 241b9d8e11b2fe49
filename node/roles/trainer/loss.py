"""The GRPO objective with INTELLECT-2's two-sided clipping, per token.

For a token with advantage A and probability ratio r = pi_theta / pi_old:

    objective = min(min(r, delta) * A, clip(r, 1 - eps, 1 + eps) * A)

The usual PPO clip alone bounds the objective for A > 0 only; with A < 0 a large r makes
``r * A`` unboundedly negative and one stale, off-policy token can dominate a step. Capping r at
delta (4) first bounds that side too, which matters when rollouts come from policies up to
``async_level`` steps old. The loss is the negated objective, plus an optional k3 KL estimate to a
reference policy and minus an optional entropy bonus, summed over completion tokens and divided by
the caller's normalizer (token count, or a constant), so micro-batches add up to the same
gradient as one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from intellect_node.node.roles.trainer.config import LossConfig


@dataclass
class LossTerms:
    """Sums over the masked tokens (not yet normalized), for the step's metrics."""

    loss: torch.Tensor  # normalized, differentiable
    clipped_tokens: float
    ratio_sum: float
    entropy_sum: float
    kl_sum: float


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              normalizer: float, config: LossConfig, *, entropy: torch.Tensor | None = None,
              ref_logprobs: torch.Tensor | None = None) -> LossTerms:
    """``logprobs``, ``old_logprobs``, ``mask`` (and ``entropy``, ``ref_logprobs``): [rows, tokens];
    ``advantages``: [rows], broadcast over each row's tokens."""
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)[:, None]
    ratio = torch.exp(logprobs - old_logprobs)
    capped = torch.clamp(ratio, max=config.ratio_cap) * adv
    clipped = torch.clamp(ratio, 1 - config.clip_eps, 1 + config.clip_eps) * adv
    objective = torch.minimum(capped, clipped)
    per_token = -objective
    with torch.no_grad():  # tokens whose chosen term does not depend on the ratio: no gradient
        took_clip = clipped < capped
        outside = (ratio < 1 - config.clip_eps) | (ratio > 1 + config.clip_eps)
        no_grad = (took_clip & outside) | (~took_clip & (ratio > config.ratio_cap))
    kl_sum = 0.0
    if ref_logprobs is not None and config.kl_coef:
        log_ref_ratio = ref_logprobs - logprobs
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1  # k3: unbiased, always >= 0
        per_token = per_token + config.kl_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    entropy_sum = 0.0
    if entropy is not None:
        if config.entropy_coef:
            per_token = per_token - config.entropy_coef * entropy
        entropy_sum = float((entropy.detach() * mask).sum())
    loss = (per_token * mask).sum() / normalizer
    return LossTerms(loss=loss, clipped_tokens=float((no_grad.to(mask.dtype) * mask).sum()),
                     ratio_sum=float((ratio.detach() * mask).sum()), entropy_sum=entropy_sum, kl_sum=kl_sum)
