"""One GRPO update from a batch of verified groups: the compute half of the trainer, no I/O.

The "old" policy of the ratio is selectable (``OptimConfig.old_policy``):

- ``behavior`` (default): the logprobs of the policy that sampled the tokens, as the trainer's
  own verification prefill of that checkpoint recomputed them, or, for a group adopted from
  trusted verdicts, the worker's claims that those validators bounded to their own recomputation
  (check 14); a row without any falls back to ``recompute``. With rollouts up to ``async_level``
  steps old, the clip then bounds how far the
  trained policy may drift from the one that produced the data, which keeps a fast-moving policy
  stable: measured on the tiny model at lr 5e-4, two steps of lag with ``recompute`` took
  held-out accuracy from 0.24 to 0.03 in 10 steps, while without lag it rose to 0.34.
- ``recompute``: the current weights at the start of the step (INTELLECT-2's recipe, made for a
  learning rate so small that a policy barely moves in two steps); the ratio then measures only
  this step's own optimizer steps.

The rows are split into ``optimizer_steps`` mini-batches, one AdamW step each, and every
mini-batch into micro-batches of at most ``micro_batch_rows`` rows, whose gradients add up to the
mini-batch's because the loss is normalized by the mini-batch's token count (or a constant).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import DynamicCache

from intellect_node.node.engine.chunked_head import chunked_token_logprobs
from intellect_node.node.roles.trainer.config import LossConfig, OptimConfig, RewardConfig
from intellect_node.node.roles.trainer.groups import TrainingGroup
from intellect_node.node.roles.trainer.loss import grpo_loss
from intellect_node.node.roles.trainer.rewards import group_advantages, total_rewards


@dataclass(frozen=True)
class _Row:
    prompt: Sequence[int]
    completion: Sequence[int]
    advantage: float
    logprobs: Sequence[float] = ()  # the sampling policy's, one per completion token


@dataclass
class _Tensors:
    """A micro-batch: each distinct prompt once (left-padded), the completions right-padded.

    Scores are laid out like ``completion_ids``: [rows, completion width]."""

    prompt_ids: torch.Tensor  # [prompts, prompt width], left-padded
    prompt_mask: torch.Tensor
    prompt_of_row: torch.Tensor  # [rows]: which prompt each row continues
    completion_ids: torch.Tensor  # [rows, width], right-padded
    mask: torch.Tensor  # [rows, width]: 1.0 on completion tokens
    behavior: torch.Tensor  # [rows, width]: the sampling policy's logprobs there, 0 elsewhere
    has_behavior: torch.Tensor  # [rows] bool: whether the row came with them

    def to(self, device: torch.device) -> _Tensors:
        """The same micro-batch on ``device`` (packed on the CPU; the model may be on a GPU)."""
        return _Tensors(*(getattr(self, f.name).to(device) for f in fields(self)))


def _pack(rows: Sequence[_Row], pad_id: int) -> _Tensors:
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of_row = [distinct.setdefault(tuple(r.prompt), len(distinct)) for r in rows]
    prompt_width = max(len(p) for p in distinct)
    prompt_ids = torch.full((len(distinct), prompt_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(distinct), prompt_width), dtype=torch.long)
    for i, prompt in enumerate(distinct):
        prompt_ids[i, prompt_width - len(prompt):] = torch.tensor(prompt)
        prompt_mask[i, prompt_width - len(prompt):] = 1
    width = max(len(r.completion) for r in rows)
    completion_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width))
    behavior = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        completion_ids[i, : len(row.completion)] = torch.tensor(row.completion)
        mask[i, : len(row.completion)] = 1.0
        if row.logprobs:
            behavior[i, : len(row.completion)] = torch.tensor(row.logprobs)
    has_behavior = torch.tensor([bool(row.logprobs) for row in rows])
    return _Tensors(prompt_ids, prompt_mask, torch.tensor(prompt_of_row), completion_ids, mask, behavior, has_behavior)


def token_logprobs(model: nn.Module, tensors: _Tensors, with_entropy: bool,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each completion token (and the policy's entropy there), [rows, width].

    A GRPO group's rows share their prompt, which is most of each row's tokens on short tasks:
    the prompts run once, their KV cache is repeated for the rows that continue them, and only
    the completions run per row (measured: a step 1.9x faster on the demo's batch, the same loss
    and gradient to float32 rounding). Uniform left padding shifts a prompt's positions, which
    rotary attention does not see (it depends on relative positions only).
    The entropy carries a gradient only when asked (an entropy bonus): as a metric it would
    otherwise keep a [rows, width, vocab] graph alive for nothing."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    cache = DynamicCache(config=model.config)
    prompt_states = decoder(input_ids=tensors.prompt_ids, attention_mask=tensors.prompt_mask,
                            past_key_values=cache, use_cache=True).last_hidden_state
    rows = tensors.prompt_of_row
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)
    attention = torch.cat([tensors.prompt_mask.index_select(0, rows), tensors.mask.long()], dim=1)
    completion_states = decoder(input_ids=tensors.completion_ids, attention_mask=attention, past_key_values=cache,
                                use_cache=True).last_hidden_state
    # the state before completion token j: the prompt's last for j = 0, completion token j - 1's after
    states = torch.cat([prompt_states[:, -1:].index_select(0, rows), completion_states[:, :-1]], dim=1)
    # the head a few rows at a time: never rows x vocab float32 logits (and their graph) at once
    chosen, entropy = chunked_token_logprobs(head, states, tensors.completion_ids, with_entropy=with_entropy)
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return chosen, entropy


class GRPOLearner:
    def __init__(self, model: nn.Module, pad_id: int, *, optim: OptimConfig = OptimConfig(),
                 loss: LossConfig = LossConfig(), rewards: RewardConfig = RewardConfig(),
                 reference: nn.Module | None = None, seed: int = 0) -> None:
        if loss.kl_coef and reference is None:
            raise ValueError("a KL coefficient needs a reference model")
        self.model = model
        self.pad_id = pad_id
        self.optim_config = optim
        self.loss_config = loss
        self.reward_config = rewards
        self.reference = reference
        self.seed = seed
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=optim.betas,
                                           weight_decay=optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, optim.lr_factor)
        self.updates = 0  # rollout steps taken, the step of the weights this learner holds

    # ---- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "updates": self.updates}

    def weights(self) -> dict[str, torch.Tensor]:
        """The full weights, as a checkpoint publishes them (a sharded learner gathers them)."""
        return {name: value.detach() for name, value in self.model.state_dict().items()}

    def inference_model(self) -> nn.Module:
        """The policy as a plain module to generate with (evaluation)."""
        return self.model

    def bridge(self) -> None:
        """Count a step that trains nothing: the trainer's bridge step (service.py), whose
        checkpoint carries these same weights under the next step number."""
        self.updates += 1

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])

    # ---- one step ----------------------------------------------------------------------------

    def _rows(self, groups: Sequence[TrainingGroup]) -> tuple[list[_Row], dict[str, float]]:
        rows: list[_Row] = []
        task, lengths, length_part, advantages = [], [], [], []
        for group in groups:
            rewards = total_rewards(group.task_rewards, group.lengths, group.length_target, self.reward_config)
            adv = group_advantages(rewards)
            # a group may carry no logprobs: its rows get them recomputed (zip
            # with the empty tuple would silently drop every row of the group)
            behavior = group.logprobs or ((),) * len(group.completions)
            for completion, a, logprobs in zip(group.completions, adv, behavior, strict=True):
                rows.append(_Row(group.prompt, completion, float(a), logprobs))
            task.extend(group.task_rewards)
            lengths.extend(group.lengths)
            length_part.extend((rewards - np.array(group.task_rewards)).tolist())  # the total minus the task part
            advantages.extend(adv.tolist())
        adv_arr = np.array(advantages)
        return rows, {"task_reward": float(np.mean(task)), "length_reward": float(np.mean(length_part)),
                      "completion_tokens_mean": float(np.mean(lengths)), "advantage_mean": float(adv_arr.mean()),
                      "advantage_std": float(adv_arr.std()), "advantage_abs_max": float(np.abs(adv_arr).max())}

    def _mini_batches(self, rows: Sequence[_Row]) -> list[Sequence[_Row]]:
        """The rows of each optimizer step: ``optimizer_steps`` runs of whole micro-batches (fewer
        when there are fewer micro-batches), so one process packs exactly the micro-batches it
        always did, and a sharded learner splits each run's rows without changing its normalizer."""
        size = self.optim_config.micro_batch_rows
        chunks = math.ceil(len(rows) / size)
        parts = min(self.optim_config.optimizer_steps, chunks)
        return [rows[int(ids[0]) * size: (int(ids[-1]) + 1) * size] for ids in np.array_split(np.arange(chunks), parts)]

    def _micro_batches(self, mini: Sequence[_Row]) -> list[tuple[Sequence[_Row], _Tensors]]:
        """The micro-batches this process runs for one mini-batch: all of its rows here; a
        sharded learner's share of them."""
        size = self.optim_config.micro_batch_rows
        device = next(self.model.parameters()).device
        return [(mini[i: i + size], _pack(mini[i: i + size], self.pad_id).to(device))
                for i in range(0, len(mini), size)]

    def _score(self, tensors: _Tensors, with_entropy: bool,
               entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The policy's token logprobs; a sharded learner routes this through its FSDP root."""
        return token_logprobs(self.model, tensors, with_entropy, entropy_grad)

    def _score_reference(self, tensors: _Tensors) -> torch.Tensor:
        assert self.reference is not None
        return token_logprobs(self.reference, tensors, with_entropy=False)[0]

    def _sum_over_processes(self, values: list[float]) -> list[float]:
        """Metric sums over every process's rows: one process holds them all."""
        return values

    def _behavior(self, tensors: _Tensors, recompute: bool) -> torch.Tensor:
        """The sampling policy's logprobs; rows without them get the current
        weights' (recomputed here, never taken from the worker). ``recompute`` is decided over
        the whole mini-batch, so that every process of a sharded learner runs the same passes."""
        if not recompute:
            return tensors.behavior
        recomputed = self._score(tensors, with_entropy=False)[0]
        return torch.where(tensors.has_behavior[:, None], tensors.behavior, recomputed)

    def _clip_gradients(self) -> float:
        """Clip to ``grad_clip`` by the norm over the whole model. With sharded parameters the
        norm is a partial one per process until ``full_tensor`` reduces it, so every process
        clips (or skips) with the same global norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(total, DTensor):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, self.optim_config.grad_clip, total)
        return float(total)

    def step(self, groups: Sequence[TrainingGroup]) -> dict[str, float]:
        """Train on ``groups`` (already filtered); returns the step's metrics (the service adds
        staleness, timing and counts)."""
        if not groups:
            raise ValueError("a step needs at least one group")
        rng = np.random.default_rng([self.seed, self.updates])
        groups = [groups[i] for i in rng.permutation(len(groups))]  # rows of a group stay together
        rows, metrics = self._rows(groups)
        minis = self._mini_batches(rows)
        micro = [self._micro_batches(mini) for mini in minis]
        self.model.eval()  # dropout off: old and new logprobs must come from the same function
        with torch.no_grad():
            if self.optim_config.old_policy == "recompute":
                old = [[self._score(tensors, with_entropy=False)[0] for _, tensors in batches] for batches in micro]
            else:
                old = [[self._behavior(tensors, recompute=not all(r.logprobs for r in mini)) for _, tensors in batches]
                       for mini, batches in zip(minis, micro, strict=True)]
            ref = ([[self._score_reference(tensors) for _, tensors in batches] for batches in micro]
                   if self.reference is not None and self.loss_config.kl_coef else None)
        tokens = float(sum(len(r.completion) for r in rows))
        totals = {"clipped": 0.0, "ratio": 0.0, "kl": 0.0, "loss": 0.0, "entropy": 0.0}
        grad_norms, skipped = [], 0
        for m, (mini, batches) in enumerate(zip(minis, micro, strict=True)):
            if self.loss_config.normalization == "token":
                normalizer = float(sum(len(r.completion) for r in mini))
            else:
                normalizer = float(len(mini) * self.optim_config.max_tokens)
            self.optimizer.zero_grad(set_to_none=True)
            for c, (chunk, tensors) in enumerate(batches):
                logprobs, entropy = self._score(tensors, with_entropy=True,
                                                entropy_grad=bool(self.loss_config.entropy_coef))
                advantages = torch.tensor([r.advantage for r in chunk], device=tensors.mask.device)
                terms = grpo_loss(logprobs, old[m][c], advantages, tensors.mask,
                                  normalizer, self.loss_config, entropy=entropy,
                                  ref_logprobs=ref[m][c] if ref is not None else None)
                terms.loss.backward()
                totals["clipped"] += terms.clipped_tokens
                totals["ratio"] += terms.ratio_sum
                totals["kl"] += terms.kl_sum
                totals["loss"] += float(terms.loss.detach())
                totals["entropy"] += terms.entropy_sum
            norm = self._clip_gradients()
            if not math.isfinite(norm):  # one bad batch must not poison the weights
                self.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            grad_norms.append(norm)
            self.optimizer.step()
            self.scheduler.step()
        # the gradients are not needed until the next step's first zero_grad: a full fine-tuning's
        # would double the weights' memory meanwhile, and every copy of the policy would carry them
        self.optimizer.zero_grad(set_to_none=True)
        totals = dict(zip(totals, self._sum_over_processes(list(totals.values())), strict=True))
        self.updates += 1
        metrics.update({
            "loss": totals["loss"], "clip_fraction": totals["clipped"] / tokens, "ratio_mean": totals["ratio"] / tokens,
            "kl": totals["kl"] / tokens, "grad_norm": float(np.mean(grad_norms)) if grad_norms else float("nan"),
            "skipped_updates": float(skipped), "entropy": totals["entropy"] / tokens, "tokens": tokens,
            "rows": float(len(rows)), "groups": float(len(groups)), "lr": float(self.scheduler.get_last_lr()[0]),
        })
        return metrics
