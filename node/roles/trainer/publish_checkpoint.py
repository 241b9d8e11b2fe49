"""A trained step handed to the shard overlay: ``<publish_dir>/step-N.safetensors`` (and its adapter).

The overlay signs and broadcasts whatever file appears in the publish directory, and after a
restart takes such a file as complete without hashing it again, so the file is written aside,
fsynced and renamed in whole. Full weights are rounded to the policy dtype (tied embeddings once,
as ``save_pretrained`` does); a LoRA step after the frozen base ships as ``merge(base, adapter)``
exactly as followers build it, with the adapter beside it. This lives apart from
``TrainerService`` so the service keeps the loop and this module the file layout the overlay reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from intellect_node.node.home.durable import fsync_file, rename_durably, write_durably
from intellect_node.node.roles.trainer.config import LoraConfig
from intellect_node.node.roles.trainer.lora import merged_weights
from intellect_node.node.roles.trainer.lora_publish import adapter_body, write_merged
from intellect_node.node.shards.checkpoint import write_safetensors

if TYPE_CHECKING:
    from intellect_node.node.roles.trainer.learner import GRPOLearner
    from intellect_node.node.roles.trainer.ranks import LeadLearner
    from intellect_node.node.shards.store import ShardStore


def write_checkpoint(learner: GRPOLearner | LeadLearner, step: int, publish_dir: Path, dtype: torch.dtype,
                     store: ShardStore, *, lora: LoraConfig | None, lora_base_step: int | None,
                     tied_embeddings: bool) -> int | None:
    """Write ``step``'s weights into ``publish_dir``; returns the step whose checkpoint is the
    adapters' frozen base from now on (a full LoRA step becomes it)."""
    publish_dir.mkdir(parents=True, exist_ok=True)
    staging = publish_dir / f".writing-{step}"
    if lora is not None and lora_base_step is not None and step > lora_base_step:
        # an adapter step: the file is merge(base, adapter) exactly as followers build it, and the
        # adapter goes beside it (written before the hand-over rename, so the overlay finds both)
        base = store.checkpoints.get(lora_base_step)
        if base is None or not base.complete:
            raise RuntimeError(f"LoRA base step {lora_base_step} is not held by this trainer's overlay")
        body = adapter_body(learner.inference_model(), lora, base)
        write_merged(base, body, staging)
        write_durably(publish_dir / f"step-{step}.base-{lora_base_step}.lora", body)
    else:
        tied = {"lm_head.weight"} if tied_embeddings else set()
        weights = merged_weights(learner.inference_model()) if lora else learner.weights()
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items() if k not in tied}
        write_safetensors(tensors, staging)
        # the overlay takes a published file as complete without re-hashing it after a restart: torn
        # by a power loss, its bytes would not match the signed manifest and peers would ban this trainer
        fsync_file(staging)
        if lora is not None:
            lora_base_step = step  # the frozen base every later adapter applies to
    rename_durably(staging, publish_dir / f"step-{step}.safetensors")
    return lora_base_step
