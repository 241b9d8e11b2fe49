"""The GRPO learner sharded with FSDP2 (``fully_shard``) over the processes of one torch.distributed group.

Every process holds 1/N of the weights, gradients and AdamW moments, sees the same groups and
runs ``GRPOLearner.step`` itself; what differs from one process is overridden here, nothing else
(specs/trainer_sharding.md):

- scoring goes through one FSDP root forward (``_Scorer``): ``token_logprobs`` calls the decoder and
  the head directly, so the policy's own forward, and a root's hooks on it, never run. Each decoder
  layer is its own FSDP group, gathered only while it computes; the root group holds the rest
  (embeddings, final norm, and the head, which is the same parameter when embeddings are tied:
  one parameter in one group, gathered for the whole forward);
- each mini-batch's rows are split in contiguous runs across ranks; the loss keeps the whole
  mini-batch's normalizer, so the per-rank gradients add up to the one-process gradient, and the
  reduce-scatter sums (divide factor 1) instead of FSDP's default average;
- every rank runs the same number of micro-batch passes (a rank short of rows runs a fully
  masked placeholder), because each pass is a sequence of collectives;
- metric sums are all-reduced; the gradient norm is the whole model's (``GRPOLearner._clip_gradients``).

``state_dict`` and ``load_state_dict`` are collective and use GRPOLearner's own format with full
tensors (rank 0 holds it, the others get ``{}``), so a state saved by N processes loads into M,
and into a plain ``GRPOLearner``, and back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from intellect_node.node.roles.trainer.config import LossConfig, OptimConfig, RewardConfig
from intellect_node.node.roles.trainer.learner import GRPOLearner, _pack, _Row, _Tensors, token_logprobs


class _Scorer(nn.Module):
    """The one forward FSDP sees: ``token_logprobs`` of the policy, prompt KV sharing included."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, tensors: _Tensors, with_entropy: bool,
                entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        chosen, entropy = token_logprobs(self.policy, tensors, with_entropy, entropy_grad)
        # a copy, not the gather's view: FSDP warns that an in-place op on a returned view would
        # drop its pre-backward hook, and the copy is [rows, width] floats
        return chosen.clone(), entropy


def shard(policy: nn.Module, mesh: DeviceMesh) -> _Scorer:
    """Shard ``policy`` in place (each decoder layer, then the root around it) and return the root.

    Gradients are reduced by a plain sum: the rows are split, not replicated, so the sum over
    ranks is the gradient (FSDP's default would divide it by the number of ranks). Sum-only
    collectives also suit gloo, which has neither AVG nor PREMUL_SUM."""
    for layer in policy.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    root = fully_shard(_Scorer(policy), mesh=mesh)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


class ShardedLearner(GRPOLearner):
    """A ``GRPOLearner`` whose model is sharded over ``mesh`` (1-D: every rank of the group).

    Every method that touches the weights is collective: all ranks call it, in the same order,
    with the same groups."""

    def __init__(self, model: nn.Module, pad_id: int, mesh: DeviceMesh, *, optim: OptimConfig = OptimConfig(),
                 loss: LossConfig = LossConfig(), rewards: RewardConfig = RewardConfig(),
                 reference: nn.Module | None = None, seed: int = 0) -> None:
        self.mesh = mesh
        self.rank, self.world = mesh.get_local_rank(), mesh.size()
        self.scorer = shard(model, mesh)  # before the optimizer: it must hold the sharded parameters
        self.reference_scorer = shard(reference, mesh) if reference is not None else None
        super().__init__(model, pad_id, optim=optim, loss=loss, rewards=rewards, reference=reference, seed=seed)

    # ---- the step's seams ------------------------------------------------------------------

    def _score(self, tensors: _Tensors, with_entropy: bool,
               entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.scorer(tensors, with_entropy, entropy_grad)

    def _score_reference(self, tensors: _Tensors) -> torch.Tensor:
        assert self.reference_scorer is not None
        return self.reference_scorer(tensors, False)[0]

    def _micro_batches(self, mini: Sequence[_Row]) -> list[tuple[Sequence[_Row], _Tensors]]:
        """This rank's contiguous run of the mini-batch (runs differ by at most one row, so a
        group's rows mostly stay on one rank and share their prompt's KV cache), padded with
        placeholders to the count of the largest run's micro-batches."""
        start, stop = _run(len(mini), self.world, self.rank)
        batches = super()._micro_batches(mini[start:stop]) if stop > start else []
        largest = math.ceil(len(mini) / self.world)
        count = math.ceil(largest / self.optim_config.micro_batch_rows)
        return batches + [self._placeholder() for _ in range(count - len(batches))]

    def _placeholder(self) -> tuple[Sequence[_Row], _Tensors]:
        """One pad token with its mask off: the pass runs every collective, adds nothing."""
        row = _Row(prompt=(self.pad_id,), completion=(self.pad_id,), advantage=0.0, logprobs=(0.0,))
        tensors = _pack([row], self.pad_id)
        tensors.mask.zero_()
        return [row], tensors

    def _sum_over_processes(self, values: list[float]) -> list[float]:
        total = torch.tensor(values, dtype=torch.float64, device=self.mesh.device_type)
        dist.all_reduce(total, group=self.mesh.get_group())
        return total.tolist()

    # ---- full state, for rank 0 -----------------------------------------------------------

    def _gathered(self, values: dict[Any, Any]) -> dict[Any, Any]:
        """Each sharded tensor gathered whole, one at a time (a rank never holds more than one
        full tensor beyond its shard), kept on CPU by rank 0 only."""
        out = {}
        for key, value in values.items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if self.rank == 0:
                out[key] = full.detach().cpu()
        return out

    def state_dict(self) -> dict[str, Any]:
        """Collective. Rank 0: ``GRPOLearner.state_dict()``'s format with full tensors; others: {}."""
        model = self._gathered(self.model.state_dict())
        optimizer = self.optimizer.state_dict()
        moments = {index: self._gathered(values) for index, values in optimizer["state"].items()}
        if self.rank != 0:
            return {}
        return {"model": model, "optimizer": {"state": moments, "param_groups": optimizer["param_groups"]},
                "scheduler": self.scheduler.state_dict(), "updates": self.updates}

    def weights(self) -> dict[str, torch.Tensor]:
        """Collective: the full weights on rank 0 (what a checkpoint publishes), {} elsewhere."""
        return self._gathered(self.model.state_dict())

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Collective: rank 0 passes a full state (saved with any number of processes), the
        others None; each rank keeps its shard of every tensor. Small values travel as one
        pickled object, tensors are scattered one at a time from rank 0."""
        params = list(self.model.parameters())
        skeleton: list[Any] = [None]
        if self.rank == 0:
            assert state is not None
            moments = {index: {k: None if _param_shaped(v, params[index]) else v for k, v in values.items()}
                       for index, values in state["optimizer"]["state"].items()}
            skeleton = [{"moments": moments, "param_groups": state["optimizer"]["param_groups"],
                         "scheduler": state["scheduler"], "updates": state["updates"]}]
        dist.broadcast_object_list(skeleton, src=self.mesh.mesh[0].item(), group=self.mesh.get_group())
        meta = skeleton[0]
        model_state = {name: self._scattered(state["model"][name] if state else None, like)
                       for name, like in self.model.state_dict().items()}
        self.model.load_state_dict(model_state)
        moments = {index: {k: v if v is not None else
                           self._scattered(state["optimizer"]["state"][index][k] if state else None, params[index])
                           for k, v in values.items()}
                   for index, values in meta["moments"].items()}
        self.optimizer.load_state_dict({"state": moments, "param_groups": meta["param_groups"]})
        self.scheduler.load_state_dict(meta["scheduler"])
        self.updates = int(meta["updates"])

    def _scattered(self, full: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``full`` laid out like ``like`` (sharded as it is, or whole)."""
        if not isinstance(like, DTensor):
            value = full.to(like.device) if full is not None else torch.empty_like(like)
            dist.broadcast(value, src=self.mesh.mesh[0].item(), group=self.mesh.get_group())
            return value
        source = (full.to(device=like.device, dtype=like.dtype) if full is not None
                  else torch.empty(like.shape, dtype=like.dtype, device=like.device))
        return distribute_tensor(source, like.device_mesh, like.placements, src_data_rank=0)


def _run(rows: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [start, stop) of ``rank``: contiguous, the first ``rows % world`` runs one longer."""
    bounds = np.cumsum([0] + [len(part) for part in np.array_split(np.arange(rows), world)])
    return int(bounds[rank]), int(bounds[rank + 1])


def _param_shaped(value: Any, param: torch.Tensor) -> bool:
    """An optimizer moment laid out like its parameter (sharded with it), not a scalar like ``step``."""
    return isinstance(value, torch.Tensor) and value.shape == param.shape and value.dim() > 0
