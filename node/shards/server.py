"""The shard server: verified byte ranges of held checkpoints over HTTP, with upload limits.

Routes: protocol/overlay_routes.py (specs/shardcast.md section 4): the newest manifest, a step's
manifest, delta body, ``have`` stream of verified shards, and byte ranges of its verified shards.

Limits: ``max_uploads`` concurrent bodies in total (503), ``max_uploads_per_peer`` per peer and a
per-peer token bucket on requests and on bytes (429). A checkpoint this node published is served
in seed mode: a shard that is being uploaded, or was uploaded within the last few seconds, is
refused with 409, a list of shards to take instead and the peers it last sent shards to, so the
origin sends about one copy and the fetchers spread the rest among themselves.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import h11
import numpy as np
import trio

from intellect_node.node.shards.config import MIB, ShardConfig
from intellect_node.node.shards.delta_relay import DeltaSeeds, HeldBodies
from intellect_node.node.shards.http import (
    PEER_HEADER,
    BadRequestAuth,
    ProgressWindow,
    header,
    read_head,
    response_head,
    verify_request,
)
from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.overlay_routes import ROUTE

log = logging.getLogger(__name__)
HEAD_TIMEOUT_S = 5.0
HAVE_HEARTBEAT_S = 10.0  # an empty line when nothing changed, so a dead stream is noticed
HAVE_COALESCE_S = 0.02  # shards verified together go out in one line
HAVE_STREAM_S = 300.0  # then the stream ends and the watcher opens a new one
MAX_HAVE_STREAMS = 256
MAX_HAVE_STREAMS_PER_PEER = 4
SENDFILE_CHUNK = 4 * MIB
SEED_HOLD_S = 5.0
# recipients named in a 409 (a shard's or a delta body's): a fetcher watching none of them would wait out the hold
SEED_HOLDERS = 8
UNSIGNED_PEER = "addr:"  # the key of a request without a signed peer header: its address, never named to others
REQUESTS_PER_PEER_S = 50.0  # requests of every kind together; a burst of twice that
_RANGE = re.compile(rb"bytes=([0-9]{1,15})-([0-9]{1,15})")


def pack_bits(flags: bytearray) -> str:
    """One bit per shard, most significant first, as hex: compact for long-poll answers."""
    return np.packbits(np.frombuffer(bytes(flags), dtype=np.uint8)).tobytes().hex()


def unpack_bits(text: str, count: int) -> bytearray:
    """The inverse of ``pack_bits``; ValueError if ``text`` does not hold ``count`` bits."""
    raw = bytes.fromhex(text)
    if len(raw) != (count + 7) // 8:
        raise ValueError(f"{len(raw)} bytes of bits for {count} shards")
    return bytearray(np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:count].tobytes())


@dataclass
class _Bucket:
    rate: float
    burst: float
    tokens: float
    at: float = field(default_factory=time.monotonic)

    def take(self, amount: float) -> float:
        """Take ``amount`` tokens; the seconds to wait before they are covered (0 if at once)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= amount
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


@dataclass
class UploadStats:
    bytes: int = 0
    shards: int = 0
    deltas: int = 0  # delta bodies sent whole
    refused: int = 0  # 409, 429 and 503 answers


class ServeError(Exception):
    """A refusal with an HTTP status (the stream transport sends the same codes)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class ShardServer:
    def __init__(self, store: ShardStore, config: ShardConfig, own_peer_id: str, scores: PeerScores,
                 on_upload: Callable[[], None] = lambda: None,
                 relays: Callable[[str], bool] = lambda peer: True, held: HeldBodies | None = None) -> None:
        """``relays(peer)``: whether that peer serves on what it fetches (its advert names an HTTP
        address). In seed mode only uploads to such peers count as handed out: a shard sent to a
        NATed node has not reached the swarm, so the origin must not hold it back from others.
        ``held``: delta bodies verified here whose steps are still being built (delta_relay)."""
        self.store, self.config, self.own_peer_id, self.scores = store, config, own_peer_id, scores
        self.on_upload = on_upload
        self.relays = relays
        self.held = held if held is not None else HeldBodies()
        self.delta_seeds = DeltaSeeds(config.delta_seed_copies, max(SEED_HOLD_S, config.stall_s), SEED_HOLDERS)
        self.stats = UploadStats()
        self.active = 0
        self._active_per_peer: dict[str, int] = {}
        self._streams_per_peer: dict[str, int] = {}
        self._requests: dict[str, _Bucket] = {}
        self._bytes: dict[str, _Bucket] = {}

    async def serve(self, host: str, port: int, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on host:port until cancelled; reports the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        async with trio.open_nursery() as nursery:
            task_status.started(listeners[0].socket.getsockname()[1])
            await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def _handle(self, stream: trio.SocketStream) -> None:
        sock = stream.socket
        reply = HttpReply(stream)
        try:
            try:
                head, _ = await read_head(sock, HEAD_TIMEOUT_S)
                conn = h11.Connection(h11.SERVER)
                conn.receive_data(head)
                request = conn.next_event()
                if not isinstance(request, h11.Request) or not isinstance(conn.next_event(), h11.EndOfMessage):
                    raise ServeError(400, "a GET without a body, please")
                if request.method != b"GET":
                    raise ServeError(405, "only GET")
                target = request.target.decode("ascii", "replace")
                if ROUTE.fullmatch(target) is None:
                    self.scores.rejections["http_bad_path"] += 1
                    raise ServeError(404, "no such resource")
                await self.answer(reply, target, header(request.headers, b"range"), self._peer_key(request, stream))
            except Rejected as exc:
                self.scores.rejections[f"http_{exc.reason}"] += 1
            except h11.RemoteProtocolError as exc:
                self.scores.rejections["http_bad_request"] += 1
                await reply.error(ServeError(400, f"bad request: {exc}"))
            except ServeError as exc:
                await reply.error(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away; nothing to clean up beyond closing
        finally:
            await stream.aclose()

    def _peer_key(self, request: h11.Request, stream: trio.SocketStream) -> str:
        value = header(request.headers, PEER_HEADER)
        if value is not None:
            try:
                return verify_request(value, self.own_peer_id, request.target.decode("ascii"))
            except BadRequestAuth as exc:
                self.scores.rejections["http_bad_auth"] += 1
                raise ServeError(401, str(exc)) from None
        return UNSIGNED_PEER + str(stream.socket.getpeername()[0])

    async def answer(self, reply: Reply, target: str, range_value: bytes | None, peer: str) -> None:
        """Answer one request for ``target`` from ``peer`` (a verified peer id, or ``addr:<ip>``)
        on either transport; refusals are ``ServeError`` (the caller sends them with
        ``reply.error``, so they are counted in one place)."""
        try:
            await self._route(reply, target, range_value, peer)
        except ServeError as exc:
            if exc.status in (409, 429, 503):
                self.stats.refused += 1
            raise

    async def _route(self, reply: Reply, target: str, range_value: bytes | None, peer: str) -> None:
        match = ROUTE.fullmatch(target)
        if match is None:
            raise ServeError(404, "no such resource")
        bucket = self._requests.setdefault(peer, _Bucket(REQUESTS_PER_PEER_S, 2 * REQUESTS_PER_PEER_S,
                                                         2 * REQUESTS_PER_PEER_S))
        if bucket.take(1) > 0:
            raise ServeError(429, "too many requests", retry_after=1.0)
        if match["run"] != self.store.root.name:
            raise ServeError(404, "unknown run")
        what, step = match["what"], match["step"]
        if step is None:
            if what != "manifest" or not self.store.checkpoints:
                raise ServeError(404, "no manifest held")
            newest = self.store.checkpoints[max(self.store.checkpoints)]
            await reply.small(newest.envelope)
            return
        checkpoint = self.store.checkpoints.get(int(step))
        if what == "have":
            await self._have(reply, checkpoint, peer)
            return
        if what == "delta":
            await self._send_delta(reply, int(step), checkpoint, peer)
            return
        if checkpoint is None:
            raise ServeError(404, "step not held")
        if what == "manifest":
            await reply.small(checkpoint.envelope)
        else:
            await self._send_range(reply, range_value, checkpoint, peer)

    async def _have(self, reply: Reply, checkpoint: Checkpoint | None, peer: str) -> None:
        """Newline-delimited JSON, one line per change: {"version", "shards", "verified"}.

        One connection per watcher for the whole fetch: a change costs one small write, not a new
        connection and request (the first design, a long-poll per change, spent more CPU on
        requests than on hashing with eight fetchers). Ends once the step is complete here.
        """
        if checkpoint is None:
            raise ServeError(404, "step not held")
        streams = sum(self._streams_per_peer.values())
        if streams >= MAX_HAVE_STREAMS or self._streams_per_peer.get(peer, 0) >= MAX_HAVE_STREAMS_PER_PEER:
            raise ServeError(503, "too many have streams", retry_after=5.0)
        self._streams_per_peer[peer] = self._streams_per_peer.get(peer, 0) + 1
        try:
            await reply.have_open()
            sent = -1
            with trio.move_on_after(HAVE_STREAM_S):
                while True:
                    if checkpoint.version != sent:
                        sent = checkpoint.version
                        line = json.dumps({"version": sent, "shards": checkpoint.manifest.shard_count,
                                           "verified": pack_bits(checkpoint.verified)})
                        await reply.have_line(line.encode())
                        if all(checkpoint.verified):
                            return
                    with trio.move_on_after(HAVE_HEARTBEAT_S) as idle:
                        await checkpoint.changed.wait()
                        await trio.sleep(HAVE_COALESCE_S)
                    if idle.cancelled_caught:
                        await reply.have_line(b"")
        finally:
            self._streams_per_peer[peer] -= 1
            if not self._streams_per_peer[peer]:
                del self._streams_per_peer[peer]

    async def _send_range(self, reply: Reply, value: bytes | None, checkpoint: Checkpoint, peer: str) -> None:
        total = checkpoint.manifest.total_size
        if value is None:
            start, end = 0, total - 1
        else:
            match = _RANGE.fullmatch(value)
            if match is None:
                raise ServeError(416, "one range bytes=a-b only")
            start, end = int(match[1]), int(match[2])
            if not start <= end < total:
                raise ServeError(416, f"range outside 0-{total - 1}")
        if not checkpoint.range_verified(start, end + 1):
            raise ServeError(404, "range not verified here")
        size = checkpoint.manifest.shard_size
        shards = range(start // size, end // size + 1)
        if checkpoint.origin:
            self._seed_check(checkpoint, shards)
        self._check_slots(peer)
        try:
            fd = self.store.open_data(checkpoint)
        except FileNotFoundError:
            raise ServeError(404, "step not held") from None
        self._take_slot(peer)
        hands_out = not checkpoint.origin or self.relays(peer)  # counts for seed mode (_seed_check)
        if hands_out:
            for index in shards:
                checkpoint.uploads[index] += 1
                checkpoint.uploading[index] += 1
        sent_all = False
        try:
            await reply.body_head(206 if value is not None else 200, start, end, total)
            await self._send_body(reply, fd, start, end + 1 - start, peer)
            sent_all = True
            self.stats.shards += len(shards)
            if hands_out and checkpoint.origin:
                _remember_recipient(checkpoint, peer)
        finally:
            os.close(fd)
            self._give_slot(peer)
            for index in shards if hands_out else ():
                checkpoint.uploading[index] -= 1
                checkpoint.uploaded_at[index] = time.monotonic()
                if not sent_all:
                    checkpoint.uploads[index] -= 1  # it did not arrive; it may be handed out again
            self.on_upload()

    async def _send_delta(self, reply: Reply, step: int, checkpoint: Checkpoint | None, peer: str) -> None:
        """The step's delta body (specs/deltas.md section 4), under the same upload slots as shards,
        seeded: a few copies, then 409 naming their holders (the trainer's and every member's, so
        the body spreads as a tree whatever the swarm's size)."""
        fd, size = self._delta_source(step, checkpoint)
        try:
            if (holders := self.delta_seeds.refusal(step, time.monotonic())) is not None:
                raise ServeError(409, json.dumps({"holders": holders}))
            self._check_slots(peer)
            # a copy counts (and its holder is named) only for a peer that signed its request and serves
            counted = not peer.startswith(UNSIGNED_PEER) and self.relays(peer)
            if counted:
                self.delta_seeds.started(step, peer)
            self._take_slot(peer)
            whole = False
            try:
                await reply.body_head(200, 0, size - 1, size)
                await self._send_body(reply, fd, 0, size, peer)
                whole = True
                self.stats.deltas += 1
            finally:
                self._give_slot(peer)
                if counted:
                    self.delta_seeds.ended(step, peer, time.monotonic(), whole)
                self.on_upload()
        finally:
            os.close(fd)

    def _check_slots(self, peer: str) -> None:
        """503 when every upload slot is taken, 429 when this peer holds its share of them."""
        if self.active >= self.config.max_uploads:
            raise ServeError(503, "upload slots full", retry_after=1.0)
        if self._active_per_peer.get(peer, 0) >= self.config.max_uploads_per_peer:
            raise ServeError(429, "too many uploads to this peer", retry_after=1.0)

    def _take_slot(self, peer: str) -> None:
        self.active += 1
        self._active_per_peer[peer] = self._active_per_peer.get(peer, 0) + 1

    def _give_slot(self, peer: str) -> None:
        self.active -= 1
        self._active_per_peer[peer] -= 1
        if not self._active_per_peer[peer]:
            del self._active_per_peer[peer]

    def _delta_source(self, step: int, checkpoint: Checkpoint | None) -> tuple[int, int]:
        """(descriptor, size) of the body: kept beside a complete step, else verified and held
        while its step is built here; 404 otherwise."""
        delta = None if checkpoint is None else checkpoint.manifest.delta
        if checkpoint is not None and delta is not None and checkpoint.complete:
            try:
                return self.store.open_delta(checkpoint), delta.size
            except FileNotFoundError:
                pass
        held = self.held.open(step)
        if held is None:
            raise ServeError(404, "no delta held for this step")
        return held

    def _seed_check(self, checkpoint: Checkpoint, shards: range) -> None:
        """Seed mode: each shard once, then a while for the peers to pass it on.

        A shard on its way to someone is refused, and so is one already handed out, until
        ``max(SEED_HOLD_S, stall_s)`` after its last upload ended (if its holders died or left,
        the origin then serves it again rather than leave the swarm stuck).
        """
        now = time.monotonic()
        hold = max(SEED_HOLD_S, self.config.stall_s)

        def servable(i: int) -> bool:
            return not checkpoint.uploading[i] and (not checkpoint.uploads[i] or now - checkpoint.uploaded_at[i] > hold)

        if all(servable(i) for i in shards):
            return
        suggest = [i for i in range(checkpoint.manifest.shard_count) if servable(i)]
        holders = checkpoint.recipients[::-1][:SEED_HOLDERS]
        raise ServeError(409, json.dumps({"suggest": suggest[:64], "holders": holders}))

    async def _send_body(self, reply: Reply, fd: int, offset: int, count: int, peer: str) -> None:
        """The body from the file, paced per peer; cut when the reader stops taking data (slow
        readers hold a slot)."""
        rate = self.config.peer_rate_mib_s * MIB
        bucket = self._bytes.setdefault(peer, _Bucket(rate, rate, rate)) if rate > 0 else None
        with trio.CancelScope() as scope:
            # A paced upload must not look stalled to ourselves: expect half the allowed rate.
            window = ProgressWindow(scope, self.config.stall_s,
                                    MIB if bucket is None else min(MIB, int(rate * self.config.stall_s / 2)))
            while count:
                chunk = min(count, SENDFILE_CHUNK if bucket is None else max(1, int(bucket.rate / 10)))
                if bucket is not None:
                    delay = bucket.take(chunk)
                    if delay:
                        await trio.sleep(delay)
                        window.moved(0)
                sent = await reply.send_file(fd, offset, chunk)
                offset += sent
                count -= sent
                self.stats.bytes += sent
                window.moved(sent)
                await trio.lowlevel.checkpoint()
        if scope.cancelled_caught:
            self.scores.rejections["upload_stalled"] += 1
            raise trio.BrokenResourceError("reader stalled")


class Reply(Protocol):
    """How an answer goes out on one transport; the server decides what to say."""

    async def small(self, body: bytes) -> None:
        """200 with a short body (a manifest envelope)."""

    async def error(self, error: ServeError) -> None:
        """A refusal; the peer may already be gone."""

    async def have_open(self) -> None: ...

    async def have_line(self, line: bytes) -> None:
        """One have line (without its newline); empty: a heartbeat."""

    async def body_head(self, status: int, start: int, end: int, total: int) -> None:
        """200 (whole file) or 206 for bytes ``start``..``end`` inclusive of ``total``."""

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        """Send up to ``count`` body bytes of ``fd`` from ``offset``; how many went out (> 0)."""


class HttpReply:
    """Answers on an HTTP connection: heads by hand, bodies with zero-copy ``sendfile``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    async def small(self, body: bytes) -> None:
        head = response_head(200, [("content-type", "application/octet-stream"), ("content-length", str(len(body)))])
        await self.stream.send_all(head + body)

    async def error(self, error: ServeError) -> None:
        body = str(error).encode()
        headers = [("content-type", "text/plain"), ("content-length", str(len(body)))]
        if error.retry_after is not None:
            headers.append(("retry-after", str(int(error.retry_after + 0.999))))
        try:
            await self.stream.send_all(response_head(error.status, headers) + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def have_open(self) -> None:
        await self.stream.send_all(response_head(200, [("content-type", "application/x-ndjson"),
                                                       ("cache-control", "no-store")]))

    async def have_line(self, line: bytes) -> None:
        await self.stream.send_all(line + b"\n")

    async def body_head(self, status: int, start: int, end: int, total: int) -> None:
        headers = [("content-type", "application/octet-stream"), ("content-length", str(end - start + 1))]
        if status == 206:
            headers.append(("content-range", f"bytes {start}-{end}/{total}"))
        await self.stream.send_all(response_head(status, headers))

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        sock = self.stream.socket
        while True:
            try:
                sent = os.sendfile(sock.fileno(), fd, offset, count)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            if sent == 0:
                raise trio.BrokenResourceError("peer closed the connection")
            return sent


def _remember_recipient(checkpoint: Checkpoint, peer: str) -> None:
    """The peers a 409 names: the newest ``SEED_HOLDERS`` that took a whole shard from here."""
    if peer in checkpoint.recipients:
        checkpoint.recipients.remove(peer)
    checkpoint.recipients.append(peer)
    del checkpoint.recipients[:-SEED_HOLDERS]
