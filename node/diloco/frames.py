"""Frames between the node and its averager child (specs/diloco.md section 6).

A frame is a 4-byte big-endian length and a msgpack map with a ``type``. The length is checked
against the receiver's current limit before one byte of the body is read, msgpack's own limits
are set from it, and each message type has a schema of typed, bounded fields: anything else is a
``FrameError`` that names what was wrong. Both sides use this module, so the child (which must not
import libp2p) and the node agree on one definition.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from collections.abc import Callable
from typing import Any

import msgpack

from intellect_node.node.diloco.compressions import LEVELS, SPARSE
from intellect_node.protocol.bounded_msgpack import MAX_OBJECTS, Limits, unpack
from intellect_node.protocol.errors import Rejected

HEADER = struct.Struct(">I")
PRE_INIT_LIMIT = 1 << 20
SLACK = 1 << 20
PREFIX = re.compile(r"[A-Za-z0-9_-]{1,64}")


class FrameError(Exception):
    """A frame or message that breaks the protocol; the message says which part."""


def frame_limits(limit: int) -> Limits:
    """Bounds for a frame body of at most ``limit`` bytes. The largest message, ``init``, holds up
    to 65536 shapes of 8 dimensions (about 590,000 objects) three levels deep."""
    return Limits(max_bytes=limit, max_str_len=1 << 16, max_bin_len=limit, max_array_len=1 << 17,
                  max_map_len=1 << 10, max_objects=MAX_OBJECTS, max_depth=4)


def payload_limit(elements: int) -> int:
    """The largest frame once the model's size is known: one fp32 vector (``average``'s values, or
    the reply's sums) plus slack (the exponents, one byte per 4096 elements, and the fields)."""
    return 4 * elements + SLACK


def encode(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


def _read_exactly(sock: socket.socket, n: int, what: str) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise FrameError(f"connection closed after {got} of {n} bytes of the {what}")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket, limit: int) -> dict[str, Any]:
    """One message, its size checked before decoding; EOFError on a clean close between frames."""
    first = sock.recv(HEADER.size)
    if not first:
        raise EOFError("peer closed the connection")
    header = first if len(first) == HEADER.size else first + _read_exactly(sock, HEADER.size - len(first), "header")
    (length,) = HEADER.unpack(header)
    if length > limit:
        raise FrameError(f"frame of {length} bytes is over the limit of {limit}")
    return decode(_read_exactly(sock, length, "frame body"), limit)


def decode(body: bytes, limit: int) -> dict[str, Any]:
    """The frame's map, decoded within ``frame_limits(limit)`` (protocol/bounded_msgpack.py)."""
    try:
        message = unpack(body, frame_limits(limit), "frame body")
    except Rejected as exc:
        raise FrameError(f"frame body is not valid msgpack within its bounds ({exc.reason}): {exc}"[:300]) from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise FrameError("a frame must hold a map with a string 'type'")
    return message


# --- field checks: each returns the value or raises FrameError naming the field ---------------

Check = Callable[[str, Any], Any]


def integer(low: int, high: int) -> Check:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise FrameError(f"{name}: expected a whole number in [{low}, {high}], got {str(value)[:40]!r}")
        return value
    return check


def number(low: float, high: float) -> Check:
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise FrameError(f"{name}: expected a number in [{low}, {high}], got {str(value)[:40]!r}")
        return float(value)
    return check


def blob(size: int | None = None, max_size: int = 1 << 20) -> Check:
    def check(name: str, value: Any) -> bytes:
        if not isinstance(value, bytes) or (size is not None and len(value) != size) or len(value) > max_size:
            got = len(value) if isinstance(value, bytes) else type(value).__name__
            raise FrameError(f"{name}: expected {size if size is not None else f'at most {max_size}'} bytes, got {got}")
        return value
    return check


def text(pattern: re.Pattern[str] | None = None, max_len: int = 512) -> Check:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str) or len(value) > max_len or (pattern and not pattern.fullmatch(value)):
            raise FrameError(f"{name}: not an acceptable string: {str(value)[:60]!r}")
        return value
    return check


def listing(item: Check, max_items: int) -> Check:
    def check(name: str, value: Any) -> list[Any]:
        if not isinstance(value, list) or len(value) > max_items:
            raise FrameError(f"{name}: expected a list of at most {max_items} items")
        return [item(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return check


def ipv4(name: str, value: Any) -> str:
    try:
        return str(ipaddress.IPv4Address(value))
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise FrameError(f"{name}: not an IPv4 address: {str(value)[:40]!r}") from None


def choice(*allowed: Any) -> Check:
    def check(name: str, value: Any) -> Any:
        if value not in allowed or isinstance(value, bool):
            raise FrameError(f"{name}: {str(value)[:40]!r} is not one of {allowed}")
        return value
    return check


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise FrameError(f"{name}: expected true or false, got {str(value)[:40]!r}")
    return value


def shape(name: str, value: Any) -> tuple[int, ...]:
    return tuple(listing(integer(0, 2**31), 8)(name, value))


def peer_hashes(name: str, value: Any) -> dict[str, bytes]:
    if not isinstance(value, dict) or len(value) > 256:
        raise FrameError(f"{name}: expected a map of at most 256 peers")
    return {text(max_len=128)(f"{name} key", k): blob(32)(f"{name}[{k}]", v) for k, v in value.items()}


def validate(message: dict[str, Any], schema: dict[str, Check]) -> dict[str, Any]:
    """The message's fields checked against ``schema``; a missing or unexpected field is an error."""
    fields = set(message) - {"type"}
    if fields != set(schema):
        missing, extra = sorted(set(schema) - fields), sorted(fields - set(schema))
        raise FrameError(f"{message['type']}: missing fields {missing}, unexpected fields {extra}")
    return {name: check(name, message[name]) for name, check in schema.items()}


# --- the messages --------------------------------------------------------------------------

INIT = {"prefix": text(PREFIX, 64), "shapes": listing(shape, 65536), "layout": blob(32),
        "levels": choice(*sorted(set(LEVELS.values()))), "sparse_k": choice(0, *SPARSE.values()),
        "initial_peers": listing(text(max_len=512), 64), "host": ipv4, "port": integer(0, 65535),
        "max_peers": integer(2, 256), "min_peers": integer(1, 256), "matchmaking_s": number(0.1, 60.0),
        "identity_path": text(max_len=4096), "allowlist": listing(text(max_len=64), 4096)}
STATUS_REPLY = {"peer_id": text(max_len=128), "maddrs": listing(text(max_len=512), 64),
                "rounds": integer(0, 2**32), "libp2p_loaded": boolean, "refused_parts": integer(0, 2**62),
                "refused_replies": integer(0, 2**62)}
READY = {"peer_id": text(max_len=128), "maddrs": listing(text(max_len=512), 64)}
FAILED = {"round": integer(0, 2**32 - 1), "error": text(max_len=2000)}
ERROR = {"error": text(max_len=2000)}


def gather_payload(chunks: int) -> dict[str, Check]:
    """What each member sends every other in matchmaking (specs/diloco.md section 6)."""
    return {"round": integer(0, 2**32 - 1), "layout": blob(32), "state_hash": blob(32),
            "exponents": blob(chunks, chunks), "member": text(max_len=64), "signature": blob(64)}


def average_request(elements: int) -> dict[str, Check]:
    return {"round": integer(0, 2**32 - 1), "timeout_s": number(1.0, 3600.0), "state_hash": blob(32),
            "values": blob(4 * elements, 4 * elements), "member": text(max_len=64), "signature": blob(64)}


def averaged_reply(elements: int, chunks: int) -> dict[str, Check]:
    return {"round": integer(0, 2**32 - 1), "group_size": integer(1, 256), "exponents": blob(chunks, chunks),
            "sums": blob(4 * elements, 4 * elements), "peer_hashes": peer_hashes, "seconds": number(0.0, 1e6),
            "sent_bytes": integer(0, 2**50), "attempts": integer(0, 2**32)}
