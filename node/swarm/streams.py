"""Framed request/response over raw libp2p streams, with a size limit and a deadline per read; and
whether a peer is reached directly or only through a relay."""

from __future__ import annotations

import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

from intellect_node.node.swarm.loop_deadline import LoopDeadline
from intellect_node.protocol.errors import Stalled, Truncated, Unanswered
from intellect_node.protocol.framing import HEADER, frame, frame_length


class _FrameReader:
    """One frame read in steps that may be cancelled and resumed: the bytes read so far are kept."""

    def __init__(self, stream: INetStream, limit: int) -> None:
        self.stream, self.limit = stream, limit
        self.buffer = bytearray()
        self.length: int | None = None  # the payload's, once the header is read

    async def read(self) -> bytes:
        if self.length is None:
            await self._fill(HEADER.size)
            self.length = frame_length(bytes(self.buffer), self.limit)
            del self.buffer[:]
        await self._fill(self.length)
        return bytes(self.buffer)

    async def _fill(self, count: int) -> None:
        """Read until ``count`` bytes are buffered; Truncated if the stream ends first (Unanswered
        if it ended before the frame's first byte)."""
        while len(self.buffer) < count:
            try:
                chunk = await self.stream.read(count - len(self.buffer))
                how = ""
            except Exception as exc:  # libp2p signals EOF and resets with several exception types
                chunk, how = b"", f" ({type(exc).__name__})"
            if not chunk:
                if self.length is None and not self.buffer:
                    raise Unanswered(f"stream ended before its first byte{how}")
                raise Truncated(f"stream ended after {len(self.buffer)} of {count} bytes{how}")
            self.buffer += chunk


async def read_frame(stream: INetStream, limit: int, timeout_s: float) -> bytes:
    """One frame's payload; Oversize before reading a too-long payload, Unanswered if the stream
    ends before the frame's first byte, Stalled once ``timeout_s`` ran out on time (a deadline a
    stall of our own loop made late is given back: ``loop_deadline``)."""
    reader = _FrameReader(stream, limit)
    deadline = LoopDeadline(timeout_s)
    while wait := deadline.next_wait():
        with trio.move_on_after(wait):
            return await reader.read()
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
