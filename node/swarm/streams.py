"""Framed request/response over raw libp2p streams, with a size limit and a deadline per read."""

from __future__ import annotations

import trio
from libp2p.abc import INetStream

from intellect_node.protocol.errors import Stalled, Truncated
from intellect_node.protocol.framing import HEADER, frame, frame_length


async def _read_exactly(stream: INetStream, count: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < count:
        try:
            chunk = await stream.read(count - len(buffer))
        except Exception as exc:  # libp2p signals EOF and resets with several exception types
            raise Truncated(f"stream ended after {len(buffer)} of {count} bytes ({type(exc).__name__})") from None
        if not chunk:
            raise Truncated(f"stream ended after {len(buffer)} of {count} bytes")
        buffer += chunk
    return bytes(buffer)


async def read_frame(stream: INetStream, limit: int, timeout_s: float) -> bytes:
    """One frame's payload; Oversize before reading a too-long payload, Stalled past the deadline."""
    with trio.move_on_after(timeout_s) as scope:
        length = frame_length(await _read_exactly(stream, HEADER.size), limit)
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
