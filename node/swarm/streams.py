"""Framed request/response over raw libp2p streams, with a size limit and a deadline per read; and
whether a peer is reached directly or only through a relay."""

from __future__ import annotations

import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

from intellect_node.protocol.errors import Stalled, Truncated, Unanswered
from intellect_node.protocol.framing import HEADER, frame, frame_length


async def _read_exactly(stream: INetStream, count: int, *, opening: bool = False) -> bytes:
    """``count`` bytes; Truncated if the stream ends first (Unanswered if ``opening`` and it
    ended before the first byte)."""
    buffer = bytearray()
    while len(buffer) < count:
        try:
            chunk = await stream.read(count - len(buffer))
            how = ""
        except Exception as exc:  # libp2p signals EOF and resets with several exception types
            chunk, how = b"", f" ({type(exc).__name__})"
        if not chunk:
            if opening and not buffer:
                raise Unanswered(f"stream ended before its first byte{how}")
            raise Truncated(f"stream ended after {len(buffer)} of {count} bytes{how}")
        buffer += chunk
    return bytes(buffer)


async def read_frame(stream: INetStream, limit: int, timeout_s: float) -> bytes:
    """One frame's payload; Oversize before reading a too-long payload, Stalled past the deadline,
    Unanswered if the stream ends before the frame's first byte."""
    with trio.move_on_after(timeout_s) as scope:
        length = frame_length(await _read_exactly(stream, HEADER.size, opening=True), limit)
        return await _read_exactly(stream, length) if length else b""
    assert scope.cancelled_caught
    raise Stalled(f"no complete frame within {timeout_s:g} s")


async def write_frame(stream: INetStream, payload: bytes) -> None:
    await stream.write(frame(payload))


async def close_quietly(stream: INetStream) -> None:
    """Close a stream the peer may already have reset; there is nothing left to release then."""
    try:
        await stream.close()
    except Exception:
        pass


def connection_path(host: IHost, peer_id: str) -> str | None:
    """How this node is connected to ``peer_id`` now: "direct" (any connection not through a relay,
    e.g. after a hole punch), "relayed" (every connection a ``/p2p-circuit``) or None (not connected).
    Data-plane users need it: a relay caps each circuit's bytes, so big transfers avoid circuits."""
    conns = host.get_network().connections.get(ID.from_base58(peer_id))
    if not conns:
        return None
    addrs: list[str] = []
    for conn in conns if isinstance(conns, list) else [conns]:
        try:
            addrs += [str(a) for a in conn.get_transport_addresses()]
        except Exception:  # a connection closing under us names no address
            continue
    if addrs and all("/p2p-circuit" in a for a in addrs):
        return "relayed"
    return "direct"
