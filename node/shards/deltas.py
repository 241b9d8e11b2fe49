"""Policy deltas on disk: the publisher makes one from two checkpoint files, a follower turns its
complete base and a delta body into the next step's complete checkpoint (specs/deltas.md).

Both run in a worker thread (they read and hash whole checkpoints). The follower's result is
accepted only when every one of its shards hashes to the signed manifest's: a delta, however it
was made, can never make a node hold bytes the trainer did not sign.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from intellect_node.node.shards.checkpoint import hash_bytes
from intellect_node.node.shards.copy_ahead import take_copy
from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.protocol.codec import Signed
from intellect_node.protocol.deltas import (
    DELTA_FORMAT,
    apply_delta,
    decode_delta,
    delta_hash,
    encode_delta,
    same_layout,
)
from intellect_node.protocol.errors import InvalidValue, Rejected
from intellect_node.protocol.lora import LORA_FORMAT, Adapter, decode_adapter, merge_into
from intellect_node.protocol.manifest import DTYPE_SIZES, MIN_DELTA_SIZE, CheckpointManifest, DeltaRef, TensorEntry

log = logging.getLogger(__name__)


class DeltaFailed(Exception):
    """The delta could not give the signed checkpoint; ``reason`` is the status counter to bump."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def make_delta(base: Checkpoint, result_path: Path, manifest: CheckpointManifest, max_fraction: float,
               smaller_than: int | None = None) -> tuple[DeltaRef, bytes] | None:
    """The delta from ``base`` (complete, held) to the file at ``result_path`` described by
    ``manifest``; None where the layouts differ or the body would be over ``max_fraction`` of the
    checkpoint (the step then travels in full), or not below ``smaller_than`` bytes (the adapter
    the publisher already holds for the step: encoding stops as soon as it cannot beat it)."""
    if base.manifest.total_size != manifest.total_size or not same_layout(base.manifest.tensors, manifest.tensors):
        return None
    limit = int(max_fraction * manifest.total_size)
    with open(base.data_path, "rb") as old, open(result_path, "rb") as new:
        with mmap.mmap(old.fileno(), 0, access=mmap.ACCESS_READ) as old_map, \
                mmap.mmap(new.fileno(), 0, access=mmap.ACCESS_READ) as new_map:
            body = encode_delta(manifest.tensors, old_map, new_map, max_raw=limit,
                                max_body=None if smaller_than is None else smaller_than - 1)
    if body is None or not MIN_DELTA_SIZE <= len(body) <= limit:
        return None
    ref = DeltaRef(format=DELTA_FORMAT, base_step=base.step, base_hash=base.manifest.checkpoint_hash,
                   size=len(body), hash=delta_hash(body))
    return ref, body


def adapter_delta(base: Checkpoint, body: bytes, manifest: CheckpointManifest) -> DeltaRef | None:
    """The reference to an adapter the trainer wrote beside its merged checkpoint, where its base
    is held complete here with the same layout (the checkpoint is ``merge(base, adapter)``)."""
    if base.manifest.total_size != manifest.total_size or not same_layout(base.manifest.tensors, manifest.tensors):
        return None
    if not MIN_DELTA_SIZE <= len(body) <= manifest.total_size:
        return None
    return DeltaRef(format=LORA_FORMAT, base_step=base.step, base_hash=base.manifest.checkpoint_hash,
                    size=len(body), hash=delta_hash(body))


def usable_base(store: ShardStore, manifest: CheckpointManifest) -> Checkpoint | None:
    """The complete checkpoint here that ``manifest``'s delta applies to, if any."""
    ref = manifest.delta
    if ref is None:
        return None
    base = store.checkpoints.get(ref.base_step)
    if base is None or not base.complete or base.manifest.checkpoint_hash != ref.base_hash:
        return None
    if base.manifest.total_size != manifest.total_size or not same_layout(base.manifest.tensors, manifest.tensors):
        return None
    return base


def build_from_delta(store: ShardStore, signed: Signed[CheckpointManifest], envelope: bytes, base: Checkpoint,
                     body: bytes) -> Checkpoint:
    """Step ``signed``'s checkpoint, complete, from ``base`` and ``body`` (whose hash the caller
    checked against the manifest). ``DeltaFailed`` leaves nothing behind: the caller fetches in full."""
    manifest = signed.message
    checkpoint = store.begin(signed, envelope, durable=False)
    try:
        change, changed = _decoded(manifest, body)
        checkpoint.on_copy_ahead = _place_base(store, base, checkpoint)
        _write_checked(checkpoint, change)
        store.write_delta(checkpoint, body)
        for index in range(manifest.shard_count):
            checkpoint.verified[index] = 1
        store.finalize(checkpoint)
    except BaseException:
        store.discard(checkpoint)
        raise
    log.info("step %d from step %d's checkpoint and a %d-byte delta (%d elements changed)",
             manifest.step, base.step, len(body), changed)
    return checkpoint


Change = Callable[[memoryview], object]  # writes the result's elements into the base's whole file


def _decoded(manifest: CheckpointManifest, body: bytes) -> tuple[Change, int]:
    """The body as a change to the base's bytes, and the number of elements it changes."""
    try:
        if manifest.delta is not None and manifest.delta.format == LORA_FORMAT:
            adapter = decode_adapter(body, manifest.tensors)
            changed = sum(manifest.tensors[index].nbytes // DTYPE_SIZES[manifest.tensors[index].dtype]
                          for index in adapter.modules)
            return partial(merge_adapter, adapter, manifest.tensors), changed
        records = decode_delta(body, manifest.tensors, manifest.total_size)
        return partial(apply_delta, records), sum(len(record.positions) for record in records)
    except Rejected as exc:
        raise DeltaFailed("delta_refused", f"the trainer's delta for step {manifest.step} is refused: "
                                           f"{exc.reason}: {exc}") from None


def merge_adapter(adapter: Adapter, tensors: Sequence[TensorEntry], target: memoryview) -> int:
    """Each targeted weight of the base replaced by its exact merge with the adapter, in
    ``target``: a writable buffer holding the base's whole file. Returns the elements merged."""
    changed = 0
    for index, (a, b) in adapter.modules.items():
        entry = tensors[index]
        count = entry.nbytes // DTYPE_SIZES[entry.dtype]
        stored = np.frombuffer(target, dtype=np.float32 if entry.dtype == "F32" else np.uint16, count=count,
                               offset=entry.offset)
        try:
            merge_into(stored, a, b, adapter.scaling, entry.dtype)
        except InvalidValue as exc:
            raise DeltaFailed("delta_refused", f"the trainer's adapter is refused: {exc}") from None
        changed += count
    return changed


def _place_base(store: ShardStore, base: Checkpoint, checkpoint: Checkpoint) -> bool:
    """The base's bytes as the partial checkpoint's file: a copy made ahead moved in
    (specs/deltas.md 5a; True), else a copy made now (in the kernel)."""
    if take_copy(store, base, checkpoint.data_path):
        return True
    try:
        shutil.copyfile(base.data_path, checkpoint.data_path)
    except OSError as exc:  # the base was pruned meanwhile: fetch in full
        raise DeltaFailed("delta_no_base", f"base step {base.step} is gone: {exc}") from None
    return False


def _write_checked(checkpoint: Checkpoint, change: Change) -> None:
    """The result in the partial checkpoint's file, which holds the base's bytes: the change
    written through one mapping, and every shard hashed from that same mapping, its pages already
    in place, against the signed manifest. No msync: ``store.finalize``'s fsync writes the pages
    out after the step is complete (a restart hashes it again if that did not finish). (Reading
    each shard's window of the base and writing it back with pread and pwrite cost 1.5-2.5x the
    system time with 4 followers at once on 2 cores.)"""
    manifest = checkpoint.manifest
    fd = os.open(checkpoint.data_path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != manifest.total_size:
            raise DeltaFailed("delta_mismatch", f"base file is not {manifest.total_size} bytes")
        failure: DeltaFailed | None = None
        with mmap.mmap(fd, manifest.total_size, access=mmap.ACCESS_WRITE) as mapped:
            view = memoryview(mapped)
            try:
                change(view)
                for index in range(manifest.shard_count):
                    if hash_bytes(view[slice(*manifest.shard_range(index))]) != manifest.shard_hashes[index]:
                        failure = DeltaFailed("delta_mismatch", f"step {manifest.step}: shard {index} after the delta "
                                                                "does not match the signed manifest (a trainer fault)")
                        break
            except DeltaFailed as exc:  # raised from here, its traceback's views would keep the mapping open
                failure = DeltaFailed(exc.reason, str(exc))
            finally:
                view.release()
        if failure is not None:
            raise failure
    finally:
        os.close(fd)
