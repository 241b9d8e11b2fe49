"""Signed envelopes: who said it, what kind of message it is, when, and until when it holds.

The layout is fixed binary rather than msgpack so that the signature can be checked before a single
byte of the body is parsed, and so that the signature covers the exact bytes on the wire: a
re-encoding of the same values (msgpack allows several) can never pass as the signed message.
specs/wire.md is the normative description.

    envelope = MAGIC (4) | signer public key (32) | signature (64) | signed payload
    payload  = type length u8 | type (ascii) | protocol version u16 | timestamp ms u64
               | expiry ms u64 | body (msgpack; parsed by ``intellect_node.protocol.codec``)
    signature = Ed25519(DOMAIN | signer public key | payload)
"""

from __future__ import annotations

import hashlib
import re
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from intellect_node.crypto.identity import (
    PUBLIC_KEY_SIZE,
    SIGNATURE_SIZE,
    Identity,
    peer_id_from_public_key,
    verify_signature,
)

MAGIC = b"INE\x01"
DOMAIN = b"intellect-node/envelope/v1\x00"
HEADER_SIZE = len(MAGIC) + PUBLIC_KEY_SIZE + SIGNATURE_SIZE
_FIXED = struct.Struct(">HQQ")  # protocol version, timestamp ms, expiry ms
_TYPE_NAME = re.compile(rb"^[a-z][a-z0-9_.]{0,63}$")
MAX_CLOCK_SKEW_S = 30.0


class Rejected(Exception):
    """Input from the network that was refused. ``reason`` is a stable, countable label."""

    reason: ClassVar[str] = "rejected"


class MalformedEnvelope(Rejected):
    reason = "malformed"


class BadSignature(Rejected):
    reason = "bad_signature"


class Expired(Rejected):
    reason = "expired"


class FromTheFuture(Rejected):
    reason = "from_future"


class BadLifetime(Rejected):
    reason = "bad_lifetime"


class UnknownMessageType(Rejected):
    reason = "unknown_type"


@dataclass(frozen=True)
class OpenedEnvelope:
    """An envelope whose signature and validity window have been checked; the body is still raw."""

    message_type: str
    protocol_version: int
    signer: bytes
    timestamp_ms: int
    expiry_ms: int
    body: bytes
    digest: bytes  # sha256 of the whole envelope: the identity used for de-duplication

    @property
    def signer_peer_id(self) -> str:
        return peer_id_from_public_key(self.signer)


def now_ms() -> int:
    return int(time.time() * 1000)


def seal(identity: Identity, message_type: str, protocol_version: int, body: bytes, *,
         lifetime_s: float, timestamp_ms: int | None = None) -> bytes:
    """Sign ``body`` as a message of ``message_type`` valid for ``lifetime_s`` from now."""
    type_bytes = message_type.encode("ascii")
    if not _TYPE_NAME.match(type_bytes):
        raise ValueError(f"invalid message type name {message_type!r}")
    issued = now_ms() if timestamp_ms is None else timestamp_ms
    expiry = issued + int(lifetime_s * 1000)
    payload = bytes([len(type_bytes)]) + type_bytes + _FIXED.pack(protocol_version, issued, expiry) + body
    signature = identity.sign(DOMAIN + identity.public_key + payload)
    return MAGIC + identity.public_key + signature + payload


def open_envelope(data: bytes, *, max_lifetimes_s: Mapping[str, float], now: int | None = None,
                  max_skew_s: float = MAX_CLOCK_SKEW_S) -> OpenedEnvelope:
    """Check layout, type, signature and validity window; raise a ``Rejected`` subclass otherwise.

    ``max_lifetimes_s`` names the message types acceptable here with the longest validity each may
    claim; any other type is refused before the (comparatively costly) signature check.
    """
    if len(data) < HEADER_SIZE + 1 or not data.startswith(MAGIC):
        raise MalformedEnvelope("not an intellect-node envelope (bad magic or too short)")
    signer = data[len(MAGIC) : len(MAGIC) + PUBLIC_KEY_SIZE]
    signature = data[len(MAGIC) + PUBLIC_KEY_SIZE : HEADER_SIZE]
    payload = data[HEADER_SIZE:]
    type_len = payload[0]
    type_end = 1 + type_len
    if len(payload) < type_end + _FIXED.size:
        raise MalformedEnvelope("payload shorter than its fixed fields")
    type_bytes = payload[1:type_end]
    if not _TYPE_NAME.match(type_bytes):
        raise MalformedEnvelope("message type name is not [a-z][a-z0-9_.]*")
    message_type = type_bytes.decode("ascii")
    max_lifetime_s = max_lifetimes_s.get(message_type)
    if max_lifetime_s is None:
        raise UnknownMessageType(f"message type {message_type!r} is not accepted here")
    if not verify_signature(signer, signature, DOMAIN + signer + payload):
        raise BadSignature("signature does not verify for the named signer")
    version, issued, expiry = _FIXED.unpack_from(payload, type_end)
    current = now_ms() if now is None else now
    if issued > current + int(max_skew_s * 1000):
        raise FromTheFuture(f"timestamp is {(issued - current) / 1000:.1f} s ahead of this node's clock")
    if expiry <= issued or expiry - issued > int(max_lifetime_s * 1000):
        raise BadLifetime(f"lifetime {(expiry - issued) / 1000:.1f} s is outside (0, {max_lifetime_s:g}] s")
    if expiry <= current:
        raise Expired(f"expired {(current - expiry) / 1000:.1f} s ago")
    return OpenedEnvelope(
        message_type=message_type,
        protocol_version=version,
        signer=signer,
        timestamp_ms=issued,
        expiry_ms=expiry,
        body=payload[type_end + _FIXED.size :],
        digest=hashlib.sha256(data).digest(),
    )
