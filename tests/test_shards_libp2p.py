"""Shards over libp2p streams (``/ina/shards/1.0.0``, specs/shardcast.md section 4.1) between real
in-process hosts on 127.0.0.1, each with the node's stream guard: a server with no HTTP address
serves a checkpoint that verifies against its signed manifest; a server sending corrupt bytes is
caught by the manifest's hashes, charged and excluded; hostile requests are refused, counted and
charged, and the server goes on answering honest ones."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import multiaddr
import pytest
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.host.exceptions import StreamFailure
from libp2p.network.stream.exceptions import StreamReset
from libp2p.peer.peerinfo import PeerInfo

from intellect_node.crypto.identity import Identity
from intellect_node.node.shards import fetcher as fetcher_module
from intellect_node.node.shards.checkpoint import build_manifest
from intellect_node.node.shards.client import ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.fetcher import CheckpointFetch, PeerBook, PeerRecord
from intellect_node.node.shards.server import ShardServer
from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.node.shards.stream_client import ShardStreamClient
from intellect_node.node.shards.stream_server import ShardStreamServer
from intellect_node.node.shards.stream_wire import (
    MAX_ANSWER_HEAD,
    decode_head,
    decode_request,
    encode_head,
)
from intellect_node.node.swarm.guard import StreamGuard
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.streams import close_quietly, connection_path, read_frame, write_frame
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Unanswered
from intellect_node.protocol.framing import HEADER, SHARDS_PROTOCOL
from intellect_node.protocol.manifest import CheckpointManifest
from tests.support.shards_swarm import make_checkpoint

LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
RUN = "p2p-shards"
SHARD = 256 << 10
PROTOCOL = TProtocol(SHARDS_PROTOCOL)


class Events:
    """What the fetch reported: who served each verified shard, who served a bad one."""

    def __init__(self) -> None:
        self.verified_from: list[str] = []
        self.bad: list[str] = []

    def verified(self, checkpoint: Checkpoint, shard: int, peer_id: str, nbytes: int) -> None:
        self.verified_from.append(peer_id)

    def bad_shard(self, checkpoint: Checkpoint, shard: int, peer_id: str, digest: bytes) -> None:
        self.bad.append(peer_id)


def guarded_host(scores: PeerScores) -> IHost:
    host = build_host(Identity.generate())
    StreamGuard(scores).install(host)
    return host


def published(tmp_path: Path) -> tuple[Path, str, codec.Signed[CheckpointManifest], bytes]:
    """A 2 MiB checkpoint signed by a trainer: (file, its sha256, the signed manifest, envelope)."""
    source = tmp_path / "step-1.safetensors"
    digest = make_checkpoint(source, 2, seed=5)
    manifest = build_manifest(source, run_id=RUN, step=1, parent_step=None, shard_size=SHARD)
    envelope = codec.encode(manifest, Identity.generate(), lifetime_s=3600)
    return source, digest, codec.decode(envelope, CheckpointManifest), envelope


def serving_node(tmp_path: Path, host: IHost, scores: PeerScores, source: Path,
                 signed: codec.Signed[CheckpointManifest], envelope: bytes,
                 on_change: Callable[[], None] = lambda: None) -> ShardStreamServer:
    """A shard server on ``host``'s libp2p streams only (no HTTP listener, nothing advertised)."""
    store = ShardStore(tmp_path / "server", RUN)
    staged = store.staging_path(1)
    shutil.copyfile(source, staged)
    store.add_published(staged, signed, envelope).origin = False  # a plain holder: no seed mode
    config = ShardConfig(data_dir=tmp_path / "server", shard_size=SHARD)
    server = ShardStreamServer(ShardServer(store, config, host.get_id().to_base58(), scores), scores, on_change)
    host.set_stream_handler(PROTOCOL, server.handle)
    return server


async def connect(host: IHost, other: IHost) -> None:
    await host.connect(PeerInfo(other.get_id(), other.get_addrs()))


async def fetch(tmp_path: Path, host: IHost, scores: PeerScores, signed: codec.Signed[CheckpointManifest],
                envelope: bytes, origin: str, sources: list[str]) -> tuple[Checkpoint, PeerBook, Events]:
    store = ShardStore(tmp_path / "fetcher", RUN)
    checkpoint = store.begin(signed, envelope)
    config = ShardConfig(data_dir=tmp_path / "fetcher", shard_size=SHARD, stall_s=5.0)
    book = PeerBook(path_of=lambda peer_id: connection_path(host, peer_id))
    for peer_id in sources:
        book.peers[peer_id] = PeerRecord(None)  # no HTTP address: libp2p is the only way
    events = Events()

    async def no_providers(shard: int) -> list[str]:
        return []

    identity = Identity.generate()
    with trio.fail_after(60):
        await CheckpointFetch(checkpoint, store, book, ShardClient(identity, 5.0), config, scores, events,
                              host.get_id().to_base58(), origin, no_providers,
                              streams=ShardStreamClient(host, 5.0)).run()
    return checkpoint, book, events


async def test_a_server_without_http_serves_a_checkpoint_that_verifies(tmp_path) -> None:
    source, digest, signed, envelope = published(tmp_path)
    server_scores, fetcher_scores = PeerScores(), PeerScores()
    server_host, fetcher_host = guarded_host(server_scores), guarded_host(fetcher_scores)
    async with server_host.run(LISTEN), fetcher_host.run(LISTEN):
        marks = [0]  # the status file's dirty marks: every answered request must reach the report

        def mark() -> None:
            marks[0] += 1

        server = serving_node(tmp_path, server_host, server_scores, source, signed, envelope, on_change=mark)
        await connect(fetcher_host, server_host)
        server_id = server_host.get_id().to_base58()
        assert connection_path(fetcher_host, server_id) == "direct"
        checkpoint, book, events = await fetch(tmp_path, fetcher_host, fetcher_scores, signed, envelope,
                                               origin=server_id, sources=[server_id])
        assert checkpoint.complete
        assert hashlib.sha256(checkpoint.data_path.read_bytes()).hexdigest() == digest
        assert set(events.verified_from) == {server_id} and len(events.verified_from) == signed.message.shard_count
        assert book.peers[server_id].rates["p2p"] > 0  # measured per transport
        assert server.counts["answered"] >= signed.message.shard_count + 1  # ranges and a have stream
        assert server.server.stats.shards == signed.message.shard_count
        assert marks[0] >= server.counts["answered"]
        assert not fetcher_scores.rejections and not server_scores.rejections

        # the manifest itself, over the same protocol (discovery's path to a NATed trainer)
        client = ShardStreamClient(fetcher_host, 5.0)
        with trio.fail_after(10):
            assert await client.get(server_id, f"/ina/v1/{RUN}/manifest", CheckpointManifest.MAX_SIZE) == envelope


async def serve_corrupt(stream: INetStream) -> None:
    """A liar: every shard held, every range answered with the right length and wrong bytes."""
    try:
        target, range_value = decode_request(await read_frame(stream, 512, 10))
        if target.endswith("/have"):
            await write_frame(stream, encode_head(200))
            count = -(-(2 * (1 << 20) + 8192) // SHARD)
            line = {"version": 1, "shards": count, "verified": "ff" * ((count + 7) // 8)}
            await write_frame(stream, json.dumps(line).encode())
            await trio.sleep(30)
        else:
            assert range_value is not None
            first, last = (int(x) for x in range_value.decode().removeprefix("bytes=").split("-"))
            await write_frame(stream, encode_head(206, last - first + 1))
            await stream.write(b"\x5a" * (last - first + 1))
    finally:
        await close_quietly(stream)


async def test_a_corrupt_server_is_caught_by_the_manifest_charged_and_excluded(tmp_path) -> None:
    source, digest, signed, envelope = published(tmp_path)
    scores = PeerScores()
    honest_host, liar_host, fetcher_host = guarded_host(PeerScores()), guarded_host(PeerScores()), guarded_host(scores)
    async with honest_host.run(LISTEN), liar_host.run(LISTEN), fetcher_host.run(LISTEN):
        serving_node(tmp_path, honest_host, PeerScores(), source, signed, envelope)
        liar_host.set_stream_handler(PROTOCOL, serve_corrupt)
        await connect(fetcher_host, honest_host)
        await connect(fetcher_host, liar_host)
        honest, liar = honest_host.get_id().to_base58(), liar_host.get_id().to_base58()
        # the honest holder is the origin: the fetcher prefers any other holder, the liar, first
        checkpoint, _, events = await fetch(tmp_path, fetcher_host, scores, signed, envelope,
                                            origin=honest, sources=[honest, liar])
        assert checkpoint.complete
        assert hashlib.sha256(checkpoint.data_path.read_bytes()).hexdigest() == digest
        assert events.bad == [liar]  # excluded after its first bad shard
        assert liar not in events.verified_from
        assert scores.rejections["bad_shard"] == 1 and scores.penalty(liar) > 0
        assert scores.penalty(honest) == 0


async def ask_raw(host: IHost, peer: IHost, payload: bytes, *, announced: int | None = None) -> tuple[int, str]:
    """Send one raw request frame (``announced`` overrides its length header); the answer head."""
    stream = await host.new_stream(peer.get_id(), [PROTOCOL])
    try:
        length = len(payload) if announced is None else announced
        await stream.write(HEADER.pack(length) + payload)
        status, _, reason = decode_head(await read_frame(stream, MAX_ANSWER_HEAD, 10))
        return status, reason
    finally:
        await close_quietly(stream)


async def test_hostile_requests_are_refused_counted_and_charged(tmp_path) -> None:
    source, _, signed, envelope = published(tmp_path)
    server_scores = PeerScores()
    server_host = guarded_host(server_scores)
    have = f"/ina/v1/{RUN}/1/checkpoint.safetensors"
    hostile = [
        (b"x" * 64, 1 << 20, "oversize"),  # refused from the length header, before any read
        (b"\xff not json", None, "malformed_body"),
        (b'{"target": "/ina/v1/p2p-shards/1/manifest", "extra": 1}', None, "malformed_body"),
        (b'{"target": 7}', None, "wrong_type"),
        (b'{"target": "/ina/v1/../../etc/passwd"}', None, "invalid_value"),
        (json.dumps({"target": have, "range": [9, 2]}).encode(), None, "invalid_value"),
        (json.dumps({"target": have, "range": [0, True]}).encode(), None, "invalid_value"),
    ]
    clients = [guarded_host(PeerScores()) for _ in range(len(hostile) + 1)]
    async with server_host.run(LISTEN), contextlib.AsyncExitStack() as running:
        for client in clients:
            await running.enter_async_context(client.run(LISTEN))
        server = serving_node(tmp_path, server_host, server_scores, source, signed, envelope)
        for client in clients:
            await connect(client, server_host)
        with trio.fail_after(30):
            for client, (payload, announced, reason) in zip(clients, hostile, strict=False):
                status, said = await ask_raw(client, server_host, payload, announced=announced)
                assert (status, said.split(":")[0]) == (400, reason)
                assert server_scores.penalty(client.get_id().to_base58()) > 0  # the peer the connection names
        for reason in {r for _, _, r in hostile}:
            assert server_scores.rejections[f"p2p_{reason}"] == server.counts[reason] >= 1
        assert server.counts["answered"] == 0

        # one peer that keeps sending garbage is banned, and then answered nothing at all
        flooder = clients[1]
        with trio.fail_after(30):
            while not server_scores.is_banned(flooder.get_id().to_base58()):
                assert (await ask_raw(flooder, server_host, b"garbage"))[0] == 400
            # the guard or the handler closes it unread: the open, the request's write or the read fails
            with pytest.raises((Unanswered, StreamFailure, StreamReset)):
                await ask_raw(flooder, server_host, json.dumps({"target": f"/ina/v1/{RUN}/manifest"}).encode())

        honest = clients[-1]
        with trio.fail_after(10):  # a range outside the file and a step not held: refused, not charged
            status, _ = await ask_raw(honest, server_host, json.dumps(
                {"target": have, "range": [0, signed.message.total_size]}).encode())
            assert status == 416
            status, _ = await ask_raw(honest, server_host, json.dumps({"target": f"/ina/v1/{RUN}/2/manifest"}).encode())
            assert status == 404
        assert server.counts["refused_416"] == 1 and server.counts["refused_404"] == 1
        assert server_scores.penalty(honest.get_id().to_base58()) == 0

        # the node is still serving: an honest request is answered with the manifest
        with trio.fail_after(10):
            body = await ShardStreamClient(honest, 5.0).get(server_host.get_id().to_base58(),
                                                            f"/ina/v1/{RUN}/1/manifest", 1 << 20)
        assert body == envelope and server.counts["answered"] == 1


def test_the_transport_follows_measured_throughput_and_circuits_come_last() -> None:
    paths = {"both": "direct", "relayed": "relayed", "gone": None}
    book = PeerBook(path_of=paths.get)
    book.learn("both", ["/ip4/10.0.0.1/tcp/4001/p2p/both", "/ip4/10.0.0.1/tcp/8080/http"])
    book.learn("relayed", ["/ip4/10.0.0.2/tcp/4001/p2p/r/p2p-circuit/p2p/relayed"])
    book.learn("gone", ["/ip4/10.0.0.3/tcp/4001/p2p/r/p2p-circuit/p2p/gone"])
    assert book.transport("both") == "http"  # neither measured: HTTP first
    book.succeeded("both", 8 << 20, 1.0, "http")
    assert book.transport("both") == "p2p"  # HTTP measured, libp2p not yet: try it once
    book.succeeded("both", 2 << 20, 1.0, "p2p")
    assert book.transport("both") == "http"  # then the faster one
    for _ in range(5):
        book.succeeded("both", 64 << 20, 1.0, "p2p")
    assert book.transport("both") == "p2p"  # and it follows the measurements
    # a circuit only for what fits within a relay's byte cap; nothing without a connection
    assert book.transport("relayed", 1 << 20) == "relay" and book.transport("relayed", 64 << 20) is None
    assert book.transport("gone") is None and not book.servable("gone")


def origin_node(tmp_path: Path, host: IHost, scores: PeerScores, source: Path,
                signed: codec.Signed[CheckpointManifest], envelope: bytes) -> ShardStreamServer:
    """The trainer's server for the step it published: seed mode, a hold long enough that no
    fetcher gets a second copy from it within the test."""
    store = ShardStore(tmp_path / "origin", RUN)
    staged = store.staging_path(1)
    shutil.copyfile(source, staged)
    store.add_published(staged, signed, envelope).origin = True
    config = ShardConfig(data_dir=tmp_path / "origin", shard_size=SHARD, stall_s=120.0)
    server = ShardStreamServer(ShardServer(store, config, host.get_id().to_base58(), scores), scores)
    host.set_stream_handler(PROTOCOL, server.handle)
    return server


async def test_a_fetcher_that_watches_no_holder_is_told_the_holders_by_the_origin(tmp_path, monkeypatch) -> None:
    """In a swarm larger than a fetcher's watch slots it may watch nobody who holds the step yet;
    the origin's 409 names whom it sent the shards to, and the fetcher takes them from those
    (it waited out the origin's seed hold before: one copy every 10 s)."""
    monkeypatch.setattr(fetcher_module, "MAX_WATCHED", 1)  # its one slot: the origin
    source, digest, signed, envelope = published(tmp_path)
    scores = [PeerScores() for _ in range(3)]
    origin_host, holder_host, late_host = [guarded_host(s) for s in scores]
    async with origin_host.run(LISTEN), holder_host.run(LISTEN), late_host.run(LISTEN):
        origin = origin_node(tmp_path, origin_host, scores[0], source, signed, envelope)
        origin_id, holder_id = origin_host.get_id().to_base58(), holder_host.get_id().to_base58()
        for a, b in ((holder_host, origin_host), (late_host, origin_host), (late_host, holder_host)):
            await connect(a, b)
        first, _, _ = await fetch(tmp_path / "holder", holder_host, scores[1], signed, envelope,
                                  origin=origin_id, sources=[origin_id])
        assert first.complete and origin.server.stats.shards == signed.message.shard_count
        holder_dir = tmp_path / "holder" / "fetcher"
        holder_store = ShardStore(holder_dir, RUN)
        holder_store.reopen(lambda raw: codec.decode(raw, CheckpointManifest))
        holder_config = ShardConfig(data_dir=holder_dir, shard_size=SHARD)
        holder_server = ShardStreamServer(ShardServer(holder_store, holder_config, holder_id, scores[1]), scores[1])
        holder_host.set_stream_handler(PROTOCOL, holder_server.handle)

        late, _, events = await fetch(tmp_path / "late", late_host, scores[2], signed, envelope,
                                      origin=origin_id, sources=[origin_id, holder_id])
        assert late.complete
        assert hashlib.sha256(late.data_path.read_bytes()).hexdigest() == digest
        assert set(events.verified_from) == {holder_id}  # the origin sent its one copy, to the holder
        assert origin.server.stats.shards == signed.message.shard_count
        assert origin.counts["refused_409"] >= 1
        assert not any(s.rejections for s in scores), [dict(s.rejections) for s in scores]
