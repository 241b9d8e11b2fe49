"""Serving shards over libp2p streams (``/ina/shards/1.0.0``): what the HTTP server serves, to
peers that cannot dial it (a node behind NAT advertises no HTTP address, but holds libp2p
connections, direct after a hole punch or through a relay).

The answer is decided by ``ShardServer.answer``, so limits (uploads in total and per peer, the
request bucket, have streams, seed mode) are shared with HTTP and keyed on the peer id the libp2p
connection authenticated. This module only reads the request (size-limited frame, deadline,
strict schema: ``stream_wire``) and writes answers. A request that is malformed, oversized or
never sent is counted (``counts`` and the scores' ``p2p_<reason>``) and charged to its peer.

How many streams are served at once, per peer and per IP, and how fast a request must arrive is
the stream guard's table (``node/swarm/guard.py``: 64 streams, a complete request within 4 s, a
slow request evicted for a newcomer), not a count here: a count here was filled by strangers
sending one byte each, and refused every honest request until their deadline (issue 50).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable

import trio
from libp2p.abc import INetStream

from intellect_node.node.shards.server import ServeError, ShardServer
from intellect_node.node.shards.stream_wire import MAX_REQUEST, decode_request, encode_head
from intellect_node.node.swarm.guard import busy_reply
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol.errors import Rejected

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_S = 10.0  # a backstop: the guard resets a stream without its request 4 s after it opened
WRITE_CHUNK = 256 << 10  # yamux's default window: one write fills it


class StreamReply:
    """Answers on a libp2p stream: a head frame, then raw body bytes or have-line frames."""

    def __init__(self, stream: INetStream) -> None:
        self.stream = stream

    async def small(self, body: bytes) -> None:
        await write_frame(self.stream, encode_head(200, len(body)))
        await self.stream.write(body)

    async def error(self, error: ServeError) -> None:
        try:
            await write_frame(self.stream, encode_head(error.status, 0, str(error)))
        except Exception:  # the peer went away; nothing to tell it
            pass

    async def have_open(self) -> None:
        await write_frame(self.stream, encode_head(200))

    async def have_line(self, line: bytes) -> None:
        await write_frame(self.stream, line)

    async def body_head(self, status: int, start: int, end: int, total: int) -> None:
        await write_frame(self.stream, encode_head(status, end - start + 1))

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        data = os.pread(fd, min(count, WRITE_CHUNK), offset)
        if not data:
            raise trio.BrokenResourceError("checkpoint file shorter than its manifest")
        await self.stream.write(data)
        return len(data)


async def answer_busy(stream: INetStream) -> None:
    """What the guard answers when every shard stream slot is held by a request being answered: a
    fetcher retries a 503 after ``Retry-After`` as it would over HTTP."""
    await write_frame(stream, encode_head(503, 0, "too many shard streams"))


class ShardStreamServer:
    """The ``/ina/shards/1.0.0`` handler: register ``handle`` on the host."""

    def __init__(self, server: ShardServer, scores: PeerScores, on_change: Callable[[], None] = lambda: None) -> None:
        self.server, self.scores = server, scores
        self.counts: Counter[str] = Counter()  # answered, banned, and each rejection reason
        # the status file is rewritten only when marked: a count changed after the upload's own mark
        # (``answered`` comes last) would otherwise stay unreported until something else changes
        self._on_change = on_change

    @busy_reply(answer_busy)
    async def handle(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        reply = StreamReply(stream)
        try:
            if self.scores.is_banned(peer):
                self.counts["banned"] += 1
                return
            await self._answer(reply, stream, peer)
        finally:
            self._on_change()
            await close_quietly(stream)

    async def _answer(self, reply: StreamReply, stream: INetStream, peer: str) -> None:
        try:
            target, range_value = decode_request(await read_frame(stream, MAX_REQUEST, REQUEST_TIMEOUT_S))
            await self.server.answer(reply, target, range_value, peer)
            self.counts["answered"] += 1
        except Rejected as exc:
            self.counts[exc.reason] += 1
            self.scores.rejections[f"p2p_{exc.reason}"] += 1
            self.scores.reject(peer, exc.reason, f"shard request: {exc}")
            await reply.error(ServeError(400, f"{exc.reason}: {exc}"))
        except ServeError as exc:
            self.counts[f"refused_{exc.status}"] += 1
            await reply.error(exc)
        except Exception as exc:  # the reader reset or left mid-answer: its loss, not the node's
            self.counts["aborted"] += 1
            log.debug("shard stream to %s ended: %s: %s", peer, type(exc).__name__, exc)
