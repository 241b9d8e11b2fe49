"""A LoRA trainer's step as the overlay ships it: the adapter body and the merged checkpoint.

The policy a LoRA run's workers generate with is defined by the wire, not by the trainer's
modules: ``merge(base, adapter)`` as protocol/lora.py computes it, on the base checkpoint the
trainer published first. So the trainer builds each step's file the way every follower will, from
the same base bytes and the same adapter body, through the same merge code; the follower's
result then hashes to what the trainer signed, bit for bit, on any machine.
"""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from intellect_node.node.home.durable import fsync_file
from intellect_node.node.roles.trainer.config import LoraConfig
from intellect_node.node.roles.trainer.lora import lora_modules
from intellect_node.node.shards.deltas import merge_adapter
from intellect_node.node.shards.store import Checkpoint
from intellect_node.protocol.lora import decode_adapter, encode_adapter


def adapter_body(model: nn.Module, config: LoraConfig, base: Checkpoint) -> bytes:
    """The ``lora/v1`` body of ``model``'s adapters, addressed to ``base``'s tensor index (each
    wrapped module ``m`` adapts the base's ``m.weight``)."""
    names = {entry.name for entry in base.manifest.tensors}
    matrices: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, module in lora_modules(model).items():
        weight = f"{name}.weight"
        if weight not in names:
            raise ValueError(f"the base checkpoint has no {weight!r} for the adapter of {name!r}")
        with torch.no_grad():
            matrices[weight] = (module.lora_A.detach().float().cpu().numpy(),
                                module.lora_B.detach().float().cpu().numpy())
    return encode_adapter(base.manifest.tensors, config.rank, config.scaling, matrices)


def write_merged(base: Checkpoint, body: bytes, path: Path) -> None:
    """``merge(base, adapter)`` written to ``path`` and fsynced: what every follower will build."""
    adapter = decode_adapter(body, base.manifest.tensors)
    shutil.copyfile(base.data_path, path)
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, base.manifest.total_size, access=mmap.ACCESS_WRITE) as mapped:
            view = memoryview(mapped)
            try:
                merge_adapter(adapter, base.manifest.tensors, view)
            finally:
                view.release()
            mapped.flush()
    finally:
        os.close(fd)
    fsync_file(path)


def round_frozen_weights(model: nn.Module, dtype: torch.dtype) -> None:
    """Round every frozen weight to the policy dtype (and back): the trainer's base is then the
    published base exactly, so its forward is the workers' up to the adapter's own rounding."""
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.requires_grad and parameter.is_floating_point():
                parameter.copy_(parameter.to(dtype).to(parameter.dtype))
