"""The shard client: one HTTP request per connection, heads checked by h11, bodies into a sink.

Everything a server says is checked against what was asked: status, Content-Length and
Content-Range must match the requested range exactly, or the answer is rejected (``malformed``)
before a body byte is read. A shard's body is received straight into its place in the mmapped
checkpoint file (one kernel copy, no user-space buffer); integrity is not the transport's job: the
fetcher hashes every stretch as it lands and compares the hash with the signed manifest.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import h11
import trio

from intellect_node.crypto.identity import Identity
from intellect_node.node.shards.config import MIB
from intellect_node.node.shards.http import (
    PEER_HEADER,
    ProgressWindow,
    header,
    read_head,
    recv_body,
    recv_into_view,
    sign_request,
)
from intellect_node.protocol.errors import MalformedBody, Oversize, Stalled

HASH_CHUNK = 1 * MIB  # bytes received before the fetcher hashes them: large enough to amortize calls
_CONTENT_RANGE = re.compile(rb"bytes ([0-9]{1,15})-([0-9]{1,15})/([0-9]{1,15})")


@dataclass(frozen=True)
class Endpoint:
    """A peer's shard server, from an advertised /ip4/<host>/tcp/<port>/http multiaddr."""

    peer_id: str
    host: str
    port: int


class HttpStatus(Exception):
    """The server answered with a status other than the one asked for; ``body`` is its reason."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.body = status, body


class ShardClient:
    def __init__(self, identity: Identity, stall_s: float) -> None:
        self.identity = identity
        self.stall_s = stall_s

    async def _request(self, endpoint: Endpoint, target: str, extra: list[tuple[str, str]],
                       head_timeout_s: float) -> tuple[trio.SocketStream, h11.Response, bytes]:
        with trio.move_on_after(head_timeout_s):
            stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
            handed_over = False
            try:
                headers = [("host", f"{endpoint.host}:{endpoint.port}"), *extra,
                           (PEER_HEADER.decode(), sign_request(self.identity, endpoint.peer_id, target).decode())]
                conn = h11.Connection(h11.CLIENT)
                await stream.send_all(conn.send(h11.Request(method="GET", target=target, headers=headers)))
                head, rest = await read_head(stream.socket, head_timeout_s)
                conn.receive_data(head)
                event = conn.next_event()
                if not isinstance(event, h11.Response):
                    raise MalformedBody(f"not an HTTP response head: {type(event).__name__}")
                handed_over = True
                return stream, event, rest
            except h11.RemoteProtocolError as exc:
                raise MalformedBody(f"bad HTTP response: {exc}") from None
            finally:
                if not handed_over:
                    await stream.aclose()
        raise Stalled(f"no answer from {endpoint.peer_id} within {head_timeout_s:g} s")

    async def get(self, endpoint: Endpoint, target: str, limit: int) -> bytes:
        """A small body (a manifest); HttpStatus for anything but 200 (its reason read under the
        refusal's own bound, not ``limit``: a 409's list of holders may be longer than a tiny body)."""
        stream, response, rest = await self._request(endpoint, target, [], self.stall_s)
        try:
            if response.status_code != 200:
                await self._raise_status(stream, response, rest)
            length = _content_length(response, limit)
            chunks: list[bytes] = []
            with trio.CancelScope() as scope:
                window = ProgressWindow(scope, self.stall_s, 1)
                await recv_body(stream.socket, rest, length, lambda view: chunks.append(bytes(view)),
                                bytearray(min(length, 1 << 16) or 1), window)
            if scope.cancelled_caught:
                raise Stalled(f"body from {endpoint.peer_id} stalled")
            body = b"".join(chunks)
        finally:
            await stream.aclose()
        return body

    async def _raise_status(self, stream: trio.SocketStream, response: h11.Response, rest: bytes) -> NoReturn:
        """An unexpected status: read its short body (the server's reason) and raise HttpStatus."""
        length = _content_length(response, 1 << 16)
        chunks: list[bytes] = []
        with trio.move_on_after(self.stall_s) as scope:
            window = ProgressWindow(scope, self.stall_s, 1)
            await recv_body(stream.socket, rest, length, lambda view: chunks.append(bytes(view)),
                            bytearray(length or 1), window)
        raise HttpStatus(response.status_code, b"".join(chunks))

    async def follow(self, endpoint: Endpoint, target: str, on_line: Callable[[bytes], bool],
                     idle_timeout_s: float, max_line: int) -> None:
        """Read a stream of lines (a have stream) until the server ends it or ``on_line`` returns
        False. Stalled past ``idle_timeout_s`` without a byte; Oversize for an endless line."""
        stream, response, rest = await self._request(endpoint, target, [], self.stall_s)
        try:
            if response.status_code != 200:
                await self._raise_status(stream, response, rest)
            buffer = bytearray(rest)
            while True:
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if not on_line(line):
                        return
                if len(buffer) > max_line:
                    raise Oversize(f"a line of over {max_line} bytes from {endpoint.peer_id}")
                with trio.move_on_after(idle_timeout_s):
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buffer += chunk
                    continue
                raise Stalled(f"{endpoint.peer_id} sent nothing for {idle_timeout_s:g} s")
        finally:
            await stream.aclose()

    async def get_range(self, endpoint: Endpoint, target: str, start: int, dest: memoryview,
                        on_chunk: Callable[[memoryview], None], min_bytes_per_window: int = MIB) -> None:
        """Bytes [start, start + len(dest)) of ``target`` received straight into ``dest`` (e.g. an
        mmap of the checkpoint file); ``on_chunk`` sees each stretch as it lands (to hash it).
        Raises Truncated, Stalled, MalformedBody, Oversize or HttpStatus."""
        end = start + len(dest)
        stream, response, rest = await self._request(endpoint, target, [("range", f"bytes={start}-{end - 1}")],
                                                      self.stall_s)
        try:
            if response.status_code != 206:
                await self._raise_status(stream, response, rest)
            length = _content_length(response, end - start)
            content_range = header(response.headers, b"content-range")
            match = _CONTENT_RANGE.fullmatch(content_range or b"")
            if length != end - start or match is None or (int(match[1]), int(match[2])) != (start, end - 1):
                raise MalformedBody(f"asked for bytes {start}-{end - 1}, got {content_range!r} ({length} bytes)")
            with trio.CancelScope() as scope:
                window = ProgressWindow(scope, self.stall_s, min_bytes_per_window)
                await recv_into_view(stream.socket, rest, dest, on_chunk, window, HASH_CHUNK)
            if scope.cancelled_caught:
                raise Stalled(f"{endpoint.peer_id} sent under {min_bytes_per_window} bytes in {self.stall_s:g} s")
        finally:
            await stream.aclose()


def _content_length(response: h11.Response, limit: int) -> int:
    value = header(response.headers, b"content-length")
    if value is None or not value.isdigit() or len(value) > 15:
        raise MalformedBody("response without a usable Content-Length")
    length = int(value)
    if length > limit:
        raise Oversize(f"{length}-byte body, at most {limit} expected")
    return length
