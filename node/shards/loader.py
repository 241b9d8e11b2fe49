"""Tensors of a verified checkpoint as views into one mmapped file: no second copy in memory.

The mapping is private copy-on-write: tensors are writable (an engine may modify them in place)
without ever changing the file other nodes are served from, and untouched pages stay shared with
the page cache. Offsets come from the signed manifest, which was checked against every byte.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch

from intellect_node.protocol.manifest import CheckpointManifest

TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16, "I16": torch.int16, "F16": torch.float16, "BF16": torch.bfloat16,
    "U32": torch.uint32, "I32": torch.int32, "F32": torch.float32,
    "U64": torch.uint64, "I64": torch.int64, "F64": torch.float64,
}


def load_tensors(path: Path, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path``, in manifest order, as views of one mapping.

    The tensors keep the mapping alive; it is unmapped when the last of them is freed.
    """
    with open(path, "rb") as f:
        if f.seek(0, 2) != manifest.total_size:
            raise ValueError(f"{path} is not the {manifest.total_size}-byte file the manifest describes")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    tensors: dict[str, torch.Tensor] = {}
    for entry in manifest.tensors:
        dtype = TORCH_DTYPES[entry.dtype]
        count = entry.nbytes // dtype.itemsize
        if count == 0:
            tensors[entry.name] = torch.empty(entry.shape, dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=entry.offset)
        tensors[entry.name] = flat.view(entry.shape)
    return tensors
