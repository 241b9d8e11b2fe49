"""Fetching from a peer's shard server over its libp2p connection (``/ina/shards/1.0.0``).

The same calls as the HTTP ``ShardClient`` (``get``, ``follow``, ``get_range``) with a peer id in
place of an HTTP endpoint, and the same checks: the answer's status and length must match what
was asked before a body byte is read (``malformed_body``/``oversize``), a body that ends early is
``truncated``, one moving under ``min_bytes_per_window`` in ``stall_s`` is cut (``timeout``).
Refusals raise ``HttpStatus`` with the server's status, so the fetcher treats them alike.
Integrity is the fetcher's: it hashes every stretch ``on_chunk`` sees against the manifest.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from intellect_node.node.shards.client import HASH_CHUNK, HttpStatus
from intellect_node.node.shards.config import MIB
from intellect_node.node.shards.http import ProgressWindow
from intellect_node.node.shards.stream_wire import MAX_ANSWER_HEAD, decode_head, encode_request
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol.errors import MalformedBody, Oversize, Rejected, Stalled, Truncated
from intellect_node.protocol.framing import SHARDS_PROTOCOL

READ_SIZE = 1 << 20


class ShardStreamClient:
    def __init__(self, host: IHost, stall_s: float) -> None:
        self.host = host
        self.stall_s = stall_s

    @contextlib.asynccontextmanager
    async def _request(self, peer_id: str, target: str, first: int | None = None,
                       last: int | None = None) -> AsyncIterator[tuple[INetStream, int, int]]:
        """A stream with the request sent and the answer head read: (stream, status, length).
        Any status but 200/206 raises HttpStatus with the server's reason."""
        stream: INetStream | None = None
        with trio.move_on_after(self.stall_s):
            try:
                stream = await self.host.new_stream(ID.from_base58(peer_id), [TProtocol(SHARDS_PROTOCOL)])
            except Exception as exc:  # not connected, protocol refused, connection reset
                raise ConnectionError(f"no shard stream to {peer_id}: {type(exc).__name__}: {exc}") from None
        if stream is None:
            raise Stalled(f"no shard stream to {peer_id} within {self.stall_s:g} s")
        try:
            await write_frame(stream, encode_request(target, first, last))
            status, length, reason = decode_head(await read_frame(stream, MAX_ANSWER_HEAD, self.stall_s))
            if status not in (200, 206):
                raise HttpStatus(status, reason.encode())
            yield stream, status, length
        except (OSError, HttpStatus, Rejected):
            raise
        except Exception as exc:  # libp2p's resets and closed streams
            raise ConnectionError(f"shard stream to {peer_id}: {type(exc).__name__}: {exc}") from None
        finally:
            await close_quietly(stream)

    async def get(self, peer_id: str, target: str, limit: int) -> bytes:
        """A small body (a manifest); HttpStatus for anything but 200."""
        async with self._request(peer_id, target) as (stream, status, length):
            if status != 200:
                raise MalformedBody(f"status {status} for a whole resource")
            if length > limit:
                raise Oversize(f"{length}-byte body, at most {limit} expected")
            body = bytearray(length)
            await self._fill(stream, memoryview(body), lambda view: None, 1, peer_id)
            return bytes(body)

    async def follow(self, peer_id: str, target: str, on_line: Callable[[bytes], bool],
                     idle_timeout_s: float, max_line: int) -> None:
        """Have lines, one frame each, until the server ends the stream or ``on_line`` says stop."""
        async with self._request(peer_id, target) as (stream, _, _):
            while True:
                try:
                    line = await read_frame(stream, max_line, idle_timeout_s)
                except Truncated as exc:
                    if "before its first byte" in str(exc):
                        return  # the server ended the stream between lines
                    raise
                if not on_line(line):
                    return

    async def get_range(self, peer_id: str, target: str, start: int, dest: memoryview,
                        on_chunk: Callable[[memoryview], None], min_bytes_per_window: int = MIB) -> None:
        """Bytes [start, start + len(dest)) of ``target`` into ``dest``; ``on_chunk`` sees each stretch."""
        end = start + len(dest)
        async with self._request(peer_id, target, start, end - 1) as (stream, status, length):
            if status != 206 or length != len(dest):
                raise MalformedBody(f"asked for bytes {start}-{end - 1}, got status {status} with {length} bytes")
            await self._fill(stream, dest, on_chunk, min_bytes_per_window, peer_id)

    async def _fill(self, stream: INetStream, dest: memoryview, on_chunk: Callable[[memoryview], None],
                    min_bytes_per_window: int, peer_id: str) -> None:
        filled, reported = 0, 0
        with trio.CancelScope() as scope:
            window = ProgressWindow(scope, self.stall_s, min_bytes_per_window)
            while filled < len(dest):
                try:
                    chunk = await stream.read(min(READ_SIZE, len(dest) - filled))
                except Exception as exc:  # libp2p signals EOF and resets with several types
                    raise Truncated(f"{peer_id}'s stream ended with {len(dest) - filled} body bytes missing "
                                    f"({type(exc).__name__})") from None
                if not chunk:
                    raise Truncated(f"{peer_id}'s stream ended with {len(dest) - filled} body bytes missing")
                if len(chunk) > len(dest) - filled:
                    raise Oversize(f"{peer_id} sent more than the {len(dest)} bytes asked for")
                dest[filled: filled + len(chunk)] = chunk
                filled += len(chunk)
                window.moved(len(chunk))
                if filled - reported >= HASH_CHUNK or filled == len(dest):
                    on_chunk(dest[reported:filled])
                    reported = filled
        if scope.cancelled_caught:
            raise Stalled(f"{peer_id} sent under {min_bytes_per_window} bytes in {self.stall_s:g} s")
