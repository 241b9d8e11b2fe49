"""Length-prefixed frames for libp2p streams: u32 big-endian length, then that many bytes.

py-libp2p 0.8.1's request/response breaks above about 6.8 MB and has no per-protocol size limit, so
every stream protocol of ours uses these frames. The limit is checked on the 4-byte header, before
a single payload byte is read.
"""

from __future__ import annotations

import hashlib
import struct

import msgpack

from intellect_node.protocol.bounded_msgpack import Limits, unpack
from intellect_node.protocol.errors import (
    InvalidValue,
    Oversize,
    WrongType,
)

HEADER = struct.Struct(">I")
# v2: the request carries a digest of what the caller holds, so a pull answers only what changed
MEMBERS_PROTOCOL = "/ina/members/2.0.0"
MAX_ADVERT = 8192                   # NodeAdvert.MAX_SIZE: one envelope of a request or a response
DIGEST_ENTRY = 8                    # bytes of one envelope's digest (``envelope_digest``)
MAX_DIGEST_ENTRIES = 1024           # a full view (membership.MAX_MEMBERS)
MAX_MEMBERS_REQUEST = MAX_ADVERT + DIGEST_ENTRY * MAX_DIGEST_ENTRIES + 16  # + the array's 7 header bytes
MAX_MEMBERS_RESPONSE = 1 << 20      # a msgpack list of advert envelopes
MAX_MEMBERS_PER_RESPONSE = 512
# [advert, digest]: two binaries (an advert envelope or nothing; digests of 8 bytes), nothing else.
MEMBERS_REQUEST_LIMITS = Limits(max_bytes=MAX_MEMBERS_REQUEST, max_str_len=0,
                                max_bin_len=max(MAX_ADVERT, DIGEST_ENTRY * MAX_DIGEST_ENTRIES),
                                max_array_len=2, max_map_len=0, max_objects=3, max_depth=1)
# A list of advert envelopes (binaries of at most one advert's size), nothing else.
MEMBERS_RESPONSE_LIMITS = Limits(max_bytes=MAX_MEMBERS_RESPONSE, max_str_len=0, max_bin_len=MAX_ADVERT,
                                 max_array_len=MAX_MEMBERS_PER_RESPONSE, max_map_len=0,
                                 max_objects=1 + MAX_MEMBERS_PER_RESPONSE, max_depth=1)


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def frame_length(header: bytes, limit: int) -> int:
    """The payload length announced by ``header``; Oversize when it exceeds ``limit``."""
    (length,) = HEADER.unpack(header)
    if length > limit:
        raise Oversize(f"frame announces {length} bytes, at most {limit} accepted")
    return length


def envelope_digest(envelope: bytes) -> bytes:
    """The 8 bytes that stand for ``envelope`` in a members request: BLAKE2b of its bytes, so a
    re-signed advert (new timestamp, new signature) has a new digest."""
    return hashlib.blake2b(envelope, digest_size=DIGEST_ENTRY).digest()


def encode_members_request(advert: bytes, digests: list[bytes]) -> bytes:
    """``advert``: the caller's own envelope (b"" for a read-only query); ``digests``: the
    ``envelope_digest`` of each advert it holds (none: it gets everything)."""
    return msgpack.packb([advert, b"".join(digests[:MAX_DIGEST_ENTRIES])], use_bin_type=True)


def decode_members_request(payload: bytes) -> tuple[bytes, frozenset[bytes]]:
    """(advert or b"", the digests the caller holds); ``Rejected`` for anything else. At most
    MAX_DIGEST_ENTRIES digests by the binary's bound, so a set of them costs the listener little."""
    value = unpack(payload, MEMBERS_REQUEST_LIMITS, "members request")
    if type(value) is not list or len(value) != 2 or not all(type(item) is bytes for item in value):
        raise WrongType("members request must be an array of two byte strings: advert, digest")
    advert, digest = value
    if len(digest) % DIGEST_ENTRY:
        raise InvalidValue(f"members request digest of {len(digest)} bytes is not a multiple of {DIGEST_ENTRY}")
    return advert, frozenset(digest[i:i + DIGEST_ENTRY] for i in range(0, len(digest), DIGEST_ENTRY))


def encode_envelope_list(envelopes: list[bytes]) -> bytes:
    return msgpack.packb(envelopes[:MAX_MEMBERS_PER_RESPONSE], use_bin_type=True)


def decode_envelope_list(payload: bytes) -> list[bytes]:
    """The envelopes in a members response; each still needs ``intellect_node.protocol.codec.decode``."""
    value = unpack(payload, MEMBERS_RESPONSE_LIMITS, "members response")
    if type(value) is not list or not all(type(item) is bytes for item in value):
        raise WrongType("members response must be a list of byte strings")
    return value

ROLLOUTS_PROTOCOL = "/ina/rollouts/1.0.0"
DIALBACK_PROTOCOL = "/ina/dialback/1.0.0"  # node/swarm/nat/reachability.py
SHARDS_PROTOCOL = "/ina/shards/1.0.0"  # node/shards/stream_wire.py; named here for the stream guard's table
# a batch: stored, duplicate, busy, rejected; a work commitment also late, early, too_many_groups
# or not_judging (specs/rollouts.md)
DELIVERY_STATUSES = frozenset({"stored", "duplicate", "busy", "rejected", "late", "early", "too_many_groups",
                               "not_judging"})
MAX_DELIVERY_REPLY = 1024
MAX_DELIVERY_REASON = 200  # characters
# {"status": ..., "reason": ...}: one map of two short strings.
DELIVERY_REPLY_LIMITS = Limits(max_bytes=MAX_DELIVERY_REPLY, max_str_len=4 * MAX_DELIVERY_REASON, max_bin_len=0,
                               max_array_len=0, max_map_len=2, max_objects=5, max_depth=1)


def encode_delivery_reply(status: str, reason: str = "") -> bytes:
    return msgpack.packb({"status": status, "reason": reason[:MAX_DELIVERY_REASON]}, use_bin_type=True)


def decode_delivery_reply(payload: bytes) -> tuple[str, str]:
    """(status, reason) of a rollout delivery answer; ``Rejected`` if it is not one."""
    value = unpack(payload, DELIVERY_REPLY_LIMITS, "delivery reply")
    if type(value) is not dict or set(value) != {"status", "reason"}:
        raise WrongType("delivery reply must be a map of status and reason")
    status, reason = value["status"], value["reason"]
    if type(status) is not str or type(reason) is not str or status not in DELIVERY_STATUSES:
        raise InvalidValue(f"delivery reply status {str(status)[:20]!r} is not one of {sorted(DELIVERY_STATUSES)}")
    return status, reason
