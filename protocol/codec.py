"""Bytes <-> signed, schema-checked messages.

The order of checks is the point: size first (no work on oversize input), then the envelope's
fixed layout, type, signature and validity window (``intellect_node.crypto.envelope``), then
msgpack with strict options and the bounds the type's schema allows (``bounded_msgpack``: lengths,
objects, depth, checked before a Python object is built), then the message's schema, then the
binding between content and signer. Each failure is a
``intellect_node.protocol.errors.Rejected`` subclass; nothing else escapes ``decode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import msgpack

from intellect_node.crypto.envelope import OpenedEnvelope, open_envelope, seal
from intellect_node.crypto.identity import Identity
from intellect_node.protocol.bounded_msgpack import record_limits, unpack
from intellect_node.protocol.errors import (
    NewerVersion,
    Oversize,
    UnsupportedVersion,
)
from intellect_node.protocol.messages import Message

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = frozenset({PROTOCOL_VERSION})

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Signed(Generic[M]):
    """A decoded message together with the envelope facts that were checked to accept it."""

    message: M
    envelope: OpenedEnvelope

    @property
    def signer_peer_id(self) -> str:
        return self.envelope.signer_peer_id


def encode(message: Message, identity: Identity, *, lifetime_s: float, timestamp_ms: int | None = None) -> bytes:
    """Sign and frame ``message``; refuses to produce what a receiver would reject as oversize."""
    if not 0 < lifetime_s <= message.MAX_LIFETIME_S:
        raise ValueError(f"lifetime {lifetime_s} s outside (0, {message.MAX_LIFETIME_S}] for {message.TYPE}")
    message.check_signer(identity.peer_id)
    body = msgpack.packb(message.to_wire(), use_bin_type=True)
    data = seal(identity, message.TYPE, PROTOCOL_VERSION, body, lifetime_s=lifetime_s, timestamp_ms=timestamp_ms)
    if len(data) > message.MAX_SIZE:
        raise ValueError(f"{message.TYPE} is {len(data)} bytes, over its limit of {message.MAX_SIZE}")
    return data


def decode(data: bytes, accept: type[M] | tuple[type[M], ...], *, now_ms: int | None = None,
           max_size: int | None = None) -> Signed[M]:
    """Decode ``data`` as one of the ``accept`` types or raise the specific ``Rejected`` reason.

    ``max_size``: the channel's own bound, for a channel that carries types this reader does not
    accept (a gossip topic): up to it, a type not accepted is ``unknown_type``, not ``oversize``."""
    accepted = accept if isinstance(accept, tuple) else (accept,)
    if max_size is None:
        max_size = max(cls.MAX_SIZE for cls in accepted)
    if len(data) > max_size:
        raise Oversize(f"{len(data)} bytes, at most {max_size} accepted here")
    by_type = {cls.TYPE: cls for cls in accepted}
    envelope = open_envelope(data, max_lifetimes_s={t: cls.MAX_LIFETIME_S for t, cls in by_type.items()}, now=now_ms)
    cls = by_type[envelope.message_type]
    if len(data) > cls.MAX_SIZE:
        raise Oversize(f"{len(data)} bytes, at most {cls.MAX_SIZE} for {cls.TYPE}")
    if envelope.protocol_version > max(SUPPORTED_VERSIONS):
        raise NewerVersion(f"protocol version {envelope.protocol_version}, "
                           f"newest spoken here {max(SUPPORTED_VERSIONS)}")
    if envelope.protocol_version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(f"protocol version {envelope.protocol_version}, "
                                 f"supported {sorted(SUPPORTED_VERSIONS)}")
    body = unpack(envelope.body, record_limits(cls, cls.MAX_SIZE), f"{cls.TYPE} body")
    message = cls.from_wire(body)
    message.check_signer(envelope.signer_peer_id)
    return Signed(message=message, envelope=envelope)


def read_signed(path: Path, kind: type[M]) -> tuple[bytes, Signed[M]]:
    """The envelope stored in the file at ``path`` and its decoding as ``kind``. No more than
    ``kind.MAX_SIZE`` + 1 bytes are read, whatever the file's size (``decode``'s size check comes
    after the read); ``OSError`` when the file cannot be read."""
    with path.open("rb") as handle:
        envelope = handle.read(kind.MAX_SIZE + 1)
    if len(envelope) > kind.MAX_SIZE:
        raise Oversize(f"larger than a {kind.TYPE}'s {kind.MAX_SIZE:,} bytes")
    return envelope, decode(envelope, kind)
