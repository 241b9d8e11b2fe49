"""HTTP/1.1 plumbing shared by the shard server and client: heads through h11, bodies raw.

h11 parses and formats request and response heads strictly. Bodies bypass it: the server sends a
checkpoint range with ``sendfile`` (zero copy), the client ``recv_into``s a reused buffer and hands
each chunk to a sink that hashes and writes it. Every connection carries one request and closes,
so no body bookkeeping is ever needed beyond Content-Length.

The ``X-Ina-Peer`` header names the requesting peer with an Ed25519 signature over the server's
peer id, the request target and a timestamp; servers key per-peer limits on it (on loopback every
peer shares one address). A request without it is keyed on its remote address.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from http import HTTPStatus

import trio

from intellect_node.crypto.envelope import now_ms
from intellect_node.crypto.identity import Identity, public_key_from_peer_id, verify_signature
from intellect_node.protocol.errors import Oversize, Stalled, Truncated, Unanswered
from intellect_node.protocol.messages import PEER_ID_PATTERN

MAX_HEAD = 16 << 10
PEER_HEADER = b"x-ina-peer"
_AUTH_DOMAIN = b"intellect-node/shard-request/v1\x00"
AUTH_MAX_SKEW_MS = 60_000
_AUTH_VALUE = re.compile(rf"({PEER_ID_PATTERN}) ([0-9]{{1,15}}) ([0-9a-f]{{128}})")


class BadRequestAuth(Exception):
    """An X-Ina-Peer header that does not verify (wrong key, stale timestamp, bad format)."""


def _auth_message(server_peer_id: str, target: str, timestamp_ms: int) -> bytes:
    return _AUTH_DOMAIN + f"{server_peer_id}\x00{target}\x00{timestamp_ms}".encode()


def sign_request(identity: Identity, server_peer_id: str, target: str) -> bytes:
    timestamp = now_ms()
    signature = identity.sign(_auth_message(server_peer_id, target, timestamp))
    return f"{identity.peer_id} {timestamp} {signature.hex()}".encode()


def verify_request(value: bytes, server_peer_id: str, target: str, now: int | None = None) -> str:
    """The requesting peer's id, or BadRequestAuth."""
    match = _AUTH_VALUE.fullmatch(value.decode("ascii", "replace"))
    if match is None:
        raise BadRequestAuth("malformed X-Ina-Peer header")
    peer_id, timestamp, signature = match.group(1), int(match.group(2)), bytes.fromhex(match.group(3))
    if abs((now_ms() if now is None else now) - timestamp) > AUTH_MAX_SKEW_MS:
        raise BadRequestAuth("X-Ina-Peer timestamp too far from now")
    try:
        public_key = public_key_from_peer_id(peer_id)
    except ValueError:
        raise BadRequestAuth("X-Ina-Peer names no Ed25519 key") from None
    if not verify_signature(public_key, signature, _auth_message(server_peer_id, target, timestamp)):
        raise BadRequestAuth("X-Ina-Peer signature does not verify")
    return peer_id


async def read_head(sock: trio.socket.SocketType, timeout_s: float) -> tuple[bytes, bytes]:
    """(head including the blank line, bytes after it); Oversize, Truncated (Unanswered before the
    first byte) or Stalled otherwise."""
    buffer = bytearray()
    with trio.move_on_after(timeout_s):
        while True:
            end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end >= 0:
                return bytes(buffer[: end + 4]), bytes(buffer[end + 4:])
            if len(buffer) > MAX_HEAD:
                raise Oversize(f"HTTP head over {MAX_HEAD} bytes")
            chunk = await sock.recv(65536)
            if not chunk and not buffer:
                raise Unanswered("connection closed before the first byte of the HTTP head")
            if not chunk:
                raise Truncated(f"connection closed inside the HTTP head after {len(buffer)} bytes")
            buffer += chunk
    raise Stalled(f"no complete HTTP head within {timeout_s:g} s")


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The value of header ``name`` (lower case); h11 lower-cases names on the way in."""
    for key, value in headers:
        if key == name:
            return value
    return None


class ProgressWindow:
    """Cuts a transfer that moves fewer than ``min_bytes`` in any ``stall_s`` window.

    A per-read timeout alone lets a peer trickle one byte every few seconds forever.
    """

    def __init__(self, scope: trio.CancelScope, stall_s: float, min_bytes: int) -> None:
        self.scope, self.stall_s, self.min_bytes = scope, stall_s, min_bytes
        self.window_bytes = 0
        scope.deadline = trio.current_time() + stall_s

    def moved(self, count: int) -> None:
        self.window_bytes += count
        if self.window_bytes >= self.min_bytes:
            self.window_bytes = 0
            self.scope.deadline = trio.current_time() + self.stall_s


async def recv_body(sock: trio.socket.SocketType, prefix: bytes, length: int, sink: Callable[[memoryview], None],
                    buffer: bytearray, window: ProgressWindow) -> None:
    """Read exactly ``length`` body bytes (``prefix`` first), handing ``sink`` large chunks."""
    if len(prefix) > length:
        raise Oversize(f"peer sent {len(prefix)} bytes for a {length}-byte body")
    if prefix:
        sink(memoryview(prefix))
    remaining = length - len(prefix)
    view = memoryview(buffer)
    while remaining:
        filled = 0
        want = min(remaining, len(buffer))
        while filled < want:
            count = await sock.recv_into(view[filled:want])
            if count == 0:
                if filled:
                    sink(view[:filled])
                raise Truncated(f"connection closed with {remaining - filled} body bytes missing")
            filled += count
            window.moved(count)
        sink(view[:filled])
        remaining -= filled


async def recv_into_view(sock: trio.socket.SocketType, prefix: bytes, dest: memoryview,
                         on_chunk: Callable[[memoryview], None], window: ProgressWindow, chunk: int) -> None:
    """Fill ``dest`` exactly (``prefix`` first) straight from the socket, no intermediate buffer;
    ``on_chunk`` sees each filled stretch of about ``chunk`` bytes, in order, once."""
    if len(prefix) > len(dest):
        raise Oversize(f"peer sent {len(prefix)} bytes for a {len(dest)}-byte body")
    dest[: len(prefix)] = prefix
    filled, reported = len(prefix), 0
    while filled < len(dest):
        count = await sock.recv_into(dest[filled: filled + chunk])
        if count == 0:
            raise Truncated(f"connection closed with {len(dest) - filled} body bytes missing")
        filled += count
        window.moved(count)
        if filled - reported >= chunk or filled == len(dest):
            on_chunk(dest[reported:filled])
            reported = filled
    if reported < filled:
        on_chunk(dest[reported:filled])


def response_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """A response head; written by hand because every answer closes its connection (h11 parses
    what comes from peers, which is where strictness matters)."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", *(f"{k}: {v}" for k, v in headers), "connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
