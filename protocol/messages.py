"""Message types. Each is a strict ``Record`` with a type name, a size cap and a lifetime cap.

specs/wire.md lists every field with its bounds; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from intellect_node.protocol.errors import SignerMismatch
from intellect_node.protocol.schema import (
    Float,
    Int,
    ListOf,
    Nested,
    Optional,
    Record,
    Str,
    wire,
)

PEER_ID_PATTERN = r"[1-9A-HJ-NP-Za-km-z]{32,64}"  # base58btc
RUN_ID_PATTERN = r"[a-z0-9][a-z0-9._-]{0,63}"
ROLES = frozenset({"bootstrap", "inference", "trainer", "validator", "diloco", "seeder"})
ACCELERATORS = frozenset({"cpu", "cuda", "rocm", "mps", "xpu"})
MAX_BYTES = 2**50  # a petabyte: larger than any memory or disk a node can report


@dataclass(frozen=True)
class Message(Record):
    """A record that travels inside a signed envelope."""

    TYPE: ClassVar[str]
    MAX_SIZE: ClassVar[int]  # bytes of the whole envelope, checked before any decoding
    MAX_LIFETIME_S: ClassVar[float]

    def check_signer(self, signer_peer_id: str) -> None:
        """Refuse a message whose content names a peer other than the one that signed it."""


@dataclass(frozen=True)
class Hardware(Record):
    accelerator: str = wire(Str(8, choices=ACCELERATORS))
    accelerator_name: str = wire(Str(128))
    accelerator_count: int = wire(Int(0, 1024))
    accelerator_memory_bytes: int = wire(Int(0, MAX_BYTES))  # per device
    cpu_cores: int = wire(Int(1, 65536))
    ram_bytes: int = wire(Int(0, MAX_BYTES))
    disk_free_bytes: int = wire(Int(0, MAX_BYTES))


@dataclass(frozen=True)
class NodeAdvert(Message):
    """What a node is and offers; stored in the DHT and repeated on the run's members topic."""

    TYPE: ClassVar[str] = "node_advert"
    MAX_SIZE: ClassVar[int] = 8192
    MAX_LIFETIME_S: ClassVar[float] = 3600.0

    peer_id: str = wire(Str(64, pattern=PEER_ID_PATTERN))
    run_id: str = wire(Str(64, pattern=RUN_ID_PATTERN))
    roles: tuple[str, ...] = wire(ListOf(Str(16, choices=ROLES), max_items=len(ROLES), unique=True))
    addrs: tuple[str, ...] = wire(ListOf(Str(256, pattern=r"/[ -~]*"), max_items=16, unique=True))
    hardware: Hardware = wire(Nested(Hardware))
    throughput_tokens_per_s: float | None = wire(Optional(Float(0.0, 1e12)))
    software_version: str = wire(Str(32, pattern=r"[0-9A-Za-z.+_-]+"))
    policy_step: int | None = wire(Optional(Int(0, 2**40)))

    def check_signer(self, signer_peer_id: str) -> None:
        if self.peer_id != signer_peer_id:
            raise SignerMismatch("advert names a peer id other than its signer")
