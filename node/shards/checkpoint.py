"""A checkpoint file and its manifest: safetensors out of tensors, tensor index and shard hashes in.

The file is plain safetensors (HF-compatible: ``format = pt`` metadata), so what a fetcher
assembles is loadable by any safetensors reader. Shards are byte ranges of that file, not separate
files: serving is ``sendfile`` of a range, loading is an mmap of one file.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import blake3

from intellect_node.protocol.manifest import (
    DTYPE_SIZES,
    SAFETENSORS_HEADER_LEN,
    TENSOR_NAME_PATTERN,
    CheckpointManifest,
    TensorEntry,
    checkpoint_hash,
)

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit


class CheckpointFormatError(ValueError):
    """A local file that cannot be published: not safetensors, or names we refuse to sign."""


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write ``tensors`` as an HF-compatible safetensors file (names checked before writing)."""
    from safetensors.torch import save_file

    for name in tensors:
        _check_name(name)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(path), metadata={"format": "pt"})


def _check_name(name: str) -> None:
    if not re.fullmatch(TENSOR_NAME_PATTERN, name):
        raise CheckpointFormatError(f"tensor name {name[:80]!r} is not a plain dotted name (see specs/shardcast.md)")


def read_tensor_index(path: Path) -> tuple[TensorEntry, ...]:
    """The tensor index of a safetensors file, sorted by offset; absolute data offsets."""
    with open(path, "rb") as f:
        raw = f.read(SAFETENSORS_HEADER_LEN)
        if len(raw) != SAFETENSORS_HEADER_LEN:
            raise CheckpointFormatError(f"{path}: shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if not 2 <= length <= MAX_HEADER_BYTES:
            raise CheckpointFormatError(f"{path}: safetensors header of {length} bytes")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointFormatError(f"{path}: safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CheckpointFormatError(f"{path}: safetensors header is not a map")
    data_start = SAFETENSORS_HEADER_LEN + length
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_name(name)
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointFormatError(f"{path}: tensor {name!r} lacks dtype, shape or data_offsets") from None
        if dtype not in DTYPE_SIZES:
            raise CheckpointFormatError(f"{path}: tensor {name!r} has dtype {dtype!r}")
        entry = TensorEntry(name=name, dtype=dtype, shape=tuple(shape), offset=data_start + begin)
        if end - begin != entry.nbytes:
            raise CheckpointFormatError(f"{path}: tensor {name!r} spans {end - begin} bytes, "
                                        f"its shape needs {entry.nbytes}")
        entries.append(entry)
    return tuple(sorted(entries, key=lambda e: e.offset))


def hash_bytes(data: bytes | memoryview) -> bytes:
    """blake3 of a shard's bytes (every core on it: a shard is megabytes)."""
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()


def hash_range(fd: int, start: int, end: int) -> bytes:
    """blake3 of bytes [start, end) of an open file, read through mmap (no copy into Python)."""
    if end <= start:
        return blake3.blake3().digest()
    page = mmap.ALLOCATIONGRANULARITY
    base = start - start % page
    with mmap.mmap(fd, end - base, access=mmap.ACCESS_READ, offset=base) as mapped:
        view = memoryview(mapped)
        try:
            return hash_bytes(view[start - base:])
        finally:
            view.release()


def hash_shards(path: Path, shard_size: int) -> tuple[bytes, ...]:
    """Each shard's blake3: the file read once, shard by shard."""
    total = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        return tuple(hash_range(fd, start, min(start + shard_size, total)) for start in range(0, total, shard_size))
    finally:
        os.close(fd)


def build_manifest(path: Path, *, run_id: str, step: int, parent_step: int | None,
                   shard_size: int) -> CheckpointManifest:
    """The manifest of a safetensors file already in place (the caller signs it)."""
    tensors = read_tensor_index(path)
    hashes = hash_shards(path, shard_size)
    total = path.stat().st_size
    return CheckpointManifest(
        run_id=run_id, step=step, parent_step=parent_step, shard_size=shard_size, total_size=total,
        shard_hashes=hashes, checkpoint_hash=checkpoint_hash(shard_size, total, hashes), tensors=tensors,
    )
