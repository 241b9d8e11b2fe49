"""The weight broadcast's signed messages: checkpoint manifests and shard complaints.

A ``CheckpointManifest`` names every byte of one checkpoint: the safetensors file is cut into
fixed-size shards and the manifest carries each shard's blake3 hash, so a shard taken from any
untrusted peer is checked before it is kept, served or loaded. Only the run's trainer may sign one;
which key that is comes from configuration, so ``authorize_manifest`` takes it as an argument.

Cross-field rules (shard count, tensor ranges, the checkpoint hash) are checked in
``__post_init__``, so a manifest that decodes is internally consistent and one that is built
locally can never be signed inconsistent. specs/shardcast.md is the normative description.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import ClassVar

import blake3

from intellect_node.protocol.errors import InvalidValue, Rejected
from intellect_node.protocol.keys import _digest
from intellect_node.protocol.messages import PEER_ID_PATTERN, RUN_ID_PATTERN, Message
from intellect_node.protocol.schema import (
    Bytes,
    Int,
    ListOf,
    Nested,
    Optional,
    Record,
    Str,
    wire,
)

HASH_SIZE = 32
MIN_SHARD_SIZE = 1 << 16  # 64 KiB: smaller shards make the manifest, not the transfer, the cost
MAX_SHARD_SIZE = 1 << 30
MAX_TOTAL_SIZE = 1 << 44  # 16 TiB
MAX_SHARDS = 1 << 14
MAX_TENSORS = 1 << 14
MAX_STEP = 2**40
SAFETENSORS_HEADER_LEN = 8  # u64 little-endian header length before the JSON header
# Tensor names are HF-style dotted names. They never become paths here, but a name with a path
# separator or ".." is refused anyway: a loader elsewhere might use one as a file name.
TENSOR_NAME_PATTERN = r"(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.\-]{0,255}"
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
_ROOT_DOMAIN = b"intellect-node/checkpoint/v1\x00"


class UnauthorizedSigner(Rejected):
    """A manifest signed by a key other than the run's configured trainer."""

    reason = "unauthorized_signer"


class BadShard(Rejected):
    """Shard bytes whose hash differs from the signed manifest's."""

    reason = "bad_shard"


def checkpoint_hash(shard_size: int, total_size: int, shard_hashes: tuple[bytes, ...]) -> bytes:
    """The 32-byte name of the whole checkpoint: blake3 over the sizes and every shard hash.

    It covers every byte of the file (each shard hash does), and unlike a hash of the file it is
    computed without a second pass over gigabytes; rollouts and verdicts quote it.
    """
    hasher = blake3.blake3(_ROOT_DOMAIN)
    hasher.update(struct.pack(">QQ", shard_size, total_size))
    for digest in shard_hashes:
        hasher.update(digest)
    return hasher.digest()


@dataclass(frozen=True)
class TensorEntry(Record):
    """Where one tensor lies in the safetensors file: absolute byte offset of its data."""

    name: str = wire(Str(256, pattern=TENSOR_NAME_PATTERN))
    dtype: str = wire(Str(8, choices=frozenset(DTYPE_SIZES)))
    shape: tuple[int, ...] = wire(ListOf(Int(0, MAX_TOTAL_SIZE), max_items=8))
    offset: int = wire(Int(SAFETENSORS_HEADER_LEN, MAX_TOTAL_SIZE))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


DELTA_FORMATS = frozenset({"sparse/v2", "lora/v1"})
MIN_DELTA_SIZE = 18  # protocol.deltas.HEAD_SIZE: a body is at least its head
MAX_DELTA_SIZE = 1 << 32


@dataclass(frozen=True)
class DeltaRef(Record):
    """The delta that turns the base step's checkpoint into this one (specs/deltas.md section 2)."""

    format: str = wire(Str(16, choices=DELTA_FORMATS))
    base_step: int = wire(Int(0, MAX_STEP))
    base_hash: bytes = wire(Bytes(HASH_SIZE, HASH_SIZE))
    size: int = wire(Int(MIN_DELTA_SIZE, MAX_DELTA_SIZE))
    hash: bytes = wire(Bytes(HASH_SIZE, HASH_SIZE))


@dataclass(frozen=True)
class CheckpointManifest(Message):
    """One checkpoint of a run: shards, their hashes and the tensor index, signed by the trainer."""

    TYPE: ClassVar[str] = "checkpoint_manifest"
    MAX_SIZE: ClassVar[int] = 512 << 10  # gossip drops messages above about 1 MiB
    MAX_LIFETIME_S: ClassVar[float] = 7 * 86400.0

    run_id: str = wire(Str(64, pattern=RUN_ID_PATTERN))
    step: int = wire(Int(0, MAX_STEP))
    parent_step: int | None = wire(Optional(Int(0, MAX_STEP)))
    shard_size: int = wire(Int(MIN_SHARD_SIZE, MAX_SHARD_SIZE))
    total_size: int = wire(Int(SAFETENSORS_HEADER_LEN + 2, MAX_TOTAL_SIZE))
    shard_hashes: tuple[bytes, ...] = wire(ListOf(Bytes(HASH_SIZE, HASH_SIZE), max_items=MAX_SHARDS))
    checkpoint_hash: bytes = wire(Bytes(HASH_SIZE, HASH_SIZE))
    tensors: tuple[TensorEntry, ...] = wire(ListOf(Nested(TensorEntry), max_items=MAX_TENSORS))
    delta: DeltaRef | None = wire(Optional(Nested(DeltaRef)), default=None)

    def __post_init__(self) -> None:
        if self.parent_step is not None and self.parent_step >= self.step:
            raise InvalidValue(f"parent step {self.parent_step} is not before step {self.step}")
        if len(self.shard_hashes) != self.shard_count:
            raise InvalidValue(f"{len(self.shard_hashes)} shard hashes for {self.shard_count} shards")
        if self.checkpoint_hash != checkpoint_hash(self.shard_size, self.total_size, self.shard_hashes):
            raise InvalidValue("checkpoint hash does not match the shard hashes")
        end = SAFETENSORS_HEADER_LEN
        names: set[str] = set()
        for entry in self.tensors:
            if entry.name in names:
                raise InvalidValue(f"tensor {entry.name!r} listed twice")
            names.add(entry.name)
            if entry.offset < end:
                raise InvalidValue(f"tensor {entry.name!r} overlaps the one before it or the header")
            end = entry.offset + entry.nbytes
            if end > self.total_size:
                raise InvalidValue(f"tensor {entry.name!r} ends at {end}, past the file's {self.total_size} bytes")
        if self.delta is not None:
            if self.parent_step is None:
                raise InvalidValue("a delta for a step without a parent step")
            # a sparse delta goes from the parent; an adapter applies to the frozen base, the parent or older
            if self.delta.format == "sparse/v2" and self.delta.base_step != self.parent_step:
                raise InvalidValue(f"delta base step {self.delta.base_step} is not the parent step {self.parent_step}")
            if self.delta.base_step > self.parent_step:
                raise InvalidValue(f"delta base step {self.delta.base_step} is after parent step {self.parent_step}")
            if self.delta.size > self.total_size:
                raise InvalidValue(f"a {self.delta.size}-byte delta for a {self.total_size}-byte checkpoint")

    @property
    def shard_count(self) -> int:
        return -(-self.total_size // self.shard_size)

    def shard_range(self, index: int) -> tuple[int, int]:
        """[start, end) of shard ``index`` in the checkpoint file."""
        start = index * self.shard_size
        return start, min(start + self.shard_size, self.total_size)


@dataclass(frozen=True)
class ShardComplaint(Message):
    """A signed report that ``accused`` served shard bytes that do not match the manifest.

    Receivers cannot check it (they never saw the bytes), so it only lowers the accused peer's
    rank as a parent; penalties come from a node's own verification, never from hearsay.
    """

    TYPE: ClassVar[str] = "shard_complaint"
    MAX_SIZE: ClassVar[int] = 1024
    MAX_LIFETIME_S: ClassVar[float] = 3600.0

    run_id: str = wire(Str(64, pattern=RUN_ID_PATTERN))
    step: int = wire(Int(0, MAX_STEP))
    checkpoint_hash: bytes = wire(Bytes(HASH_SIZE, HASH_SIZE))
    shard: int = wire(Int(0, MAX_SHARDS - 1))
    accused: str = wire(Str(64, pattern=PEER_ID_PATTERN))
    received_hash: bytes = wire(Bytes(HASH_SIZE, HASH_SIZE))

    def check_signer(self, signer_peer_id: str) -> None:
        if self.accused == signer_peer_id:
            raise InvalidValue("a peer cannot complain about itself")


def authorize_manifest(manifest: CheckpointManifest, signer_peer_id: str, run_id: str, trainer: str | None) -> None:
    """Refuse a manifest of another run, or one not signed by the run's trainer (None: nobody's)."""
    if manifest.run_id != run_id:
        raise InvalidValue(f"manifest for run {manifest.run_id!r}, this node is in {run_id!r}")
    if trainer is None or signer_peer_id != trainer:
        raise UnauthorizedSigner(f"manifest signed by {signer_peer_id}, not this run's trainer")


def shard_key(run_id: str, step: int, index: int) -> str:
    """Provider-record key for "I hold shard ``index`` of ``step``" (32 hex characters)."""
    return _digest("shard", run_id, str(step), str(index))


def manifest_key(run_id: str, step: int) -> str:
    """Provider-record key for "I hold the manifest of ``step``" (32 hex characters)."""
    return _digest("manifest", run_id, str(step))
