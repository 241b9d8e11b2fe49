"""Slow requests cannot lock honest peers out of a protocol (specs/guards.md G3, G4; issue 50).

For each of our request/response protocols (shards, members, rollouts, dial-back): strangers from
5 addresses hold every slot of the protocol's stream table with streams that sent one byte of a
request and nothing more, and remake each stream the node resets or evicts. An honest peer from
a sixth address is still answered within seconds, because a newcomer from a less represented
address takes the place of the slowest incomplete request. Real libp2p hosts on 127.x.y.z (every
such address is local on Linux, so the node sees six machines), each node with the stream guard.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

import trio
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import PeerInfo

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.churn import fresh_peer, query_members, serving
from intellect_node.node.rollouts.exchange import RolloutReceiver, deliver
from intellect_node.node.rollouts.inbox import RolloutInbox
from intellect_node.node.shards.checkpoint import build_manifest
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.server import ShardServer
from intellect_node.node.shards.store import ShardStore
from intellect_node.node.shards.stream_client import ShardStreamClient
from intellect_node.node.shards.stream_server import ShardStreamServer
from intellect_node.node.swarm.guard import POLICIES, StreamGuard
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.member_exchange import MemberExchange
from intellect_node.node.swarm.membership import MemberView
from intellect_node.node.swarm.nat.reachability import REFUSED, UNREACHABLE, DialBackServer, ask
from intellect_node.node.swarm.peer_cache import PeerCache
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.stream_table import SlotPolicy, StreamTable
from intellect_node.protocol import codec
from intellect_node.protocol.framing import (
    DIALBACK_PROTOCOL,
    MEMBERS_PROTOCOL,
    ROLLOUTS_PROTOCOL,
    SHARDS_PROTOCOL,
    frame,
)
from intellect_node.protocol.manifest import CheckpointManifest
from tests.support.protocol_samples import sample_batch
from tests.support.shards_swarm import make_checkpoint
from tests.support.waiting import poll_until

RUN = "stream-tables"
ATTACKER_ADDRESSES = [f"127.{i}.{i}.1" for i in range(1, 6)]
HONEST_ADDRESS = "127.9.9.1"
Honest = Callable[[IHost, PeerInfo], Awaitable[object]]


async def hold_slots(target: PeerInfo, source_ip: str, protocol: str, streams: int, stop: trio.Event,
                     counts: Counter[str]) -> None:
    """One stranger from ``source_ip``: ``streams`` streams, each sending one byte of a request
    (a frame header's first byte) and nothing more, remade 0.3 s after the node resets it."""

    async def one(host: IHost) -> None:
        while not stop.is_set():
            try:
                stream = await host.new_stream(target.peer_id, [TProtocol(protocol)])
                await stream.write(b"\x00")
                counts["opened"] += 1
                await stream.read(1)  # until the node resets or closes it
            except Exception:
                pass
            with trio.move_on_after(0.3):
                await stop.wait()

    try:
        async with fresh_peer(target, source_ip) as host, trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(one, host)
            await stop.wait()
            nursery.cancel_scope.cancel()
    except Exception:
        counts["refused"] += 1


async def honest_answer_while_held(server: IHost, guard: StreamGuard, scores: PeerScores, protocol: str,
                                   identities: int, honest: Honest,
                                   service: Callable[..., Awaitable[None]] | None = None) -> object:
    """Fill ``protocol``'s table from 5 addresses (``identities`` strangers, each holding its
    per-peer cap), then time ``honest`` from a sixth address; its answer. ``service``: started
    on the serving host first (a service that registers its own handler)."""
    policy = POLICIES[protocol]
    assert policy.capacity is not None and policy.capacity <= identities * policy.per_peer
    stop = trio.Event()
    counts: Counter[str] = Counter()
    async with serving(server) as target, trio.open_nursery() as nursery:
        if service is not None:
            await nursery.start(service)
        table = guard.tables[protocol]
        for i in range(identities):
            nursery.start_soon(hold_slots, target, ATTACKER_ADDRESSES[i % len(ATTACKER_ADDRESSES)], protocol,
                               policy.per_peer, stop, counts)
        # full, and strangers knocking at a full table
        await poll_until(lambda: len(table.slots) >= policy.capacity and table.counts["full"] >= 3, 60)
        assert all(not slot.complete for slot in table.slots)  # every slot held by a one-byte request
        async with fresh_peer(target, HONEST_ADDRESS) as host:
            started = time.monotonic()
            with trio.fail_after(10):
                answer = await honest(host, target)
            taken = time.monotonic() - started
            honest_peer = host.get_id().to_base58()
        status = table.status()
        stop.set()
        nursery.cancel_scope.cancel()  # the service, and strangers still closing their hosts
    print(f"{protocol}: honest answer in {taken:.2f} s while {policy.capacity} slots were held; "
          f"table {status}; strangers {dict(counts)}")
    assert status.get("evicted", 0) >= 1  # the honest stream took a slow one's place
    assert taken < 5.0  # answered while every slot was held (target 2 s; slack for a loaded machine)
    assert scores.penalty(honest_peer) == 0  # the strangers are charged for their timeouts, the honest peer not
    return answer


def test_a_full_table_evicts_the_slowest_incomplete_request_of_the_most_represented_address():
    """Six slots: three from 10.0.0.1, two from 10.0.0.2, one answered from 10.0.0.3. Newcomers
    from fresh addresses take the places of 10.0.0.1's slowest (fewest bytes, then oldest), then of
    whichever address is the most represented; a newcomer from a crowded address evicts nobody, and a
    stream being answered is never evicted."""

    async def main() -> None:
        table = StreamTable("/test/1.0.0", SlotPolicy(per_peer=2, per_ip=4, first_byte_s=1.0, capacity=6,
                                                      request_s=5.0))
        a1, a2, a3 = (table.admit(peer, "10.0.0.1") for peer in ("a1", "a2", "a3"))
        b1, b2 = (table.admit(peer, "10.0.0.2") for peer in ("b1", "b2"))
        answered = table.admit("c1", "10.0.0.3")
        assert table.admit("a1", "10.0.0.1") == "full"  # from the most represented address: evicts nobody
        answered.saw(frame(b"request"))
        assert answered.complete and answered.scope.deadline == float("inf")
        a2.saw(b"\x00\x00")  # two bytes of a header: faster than a1 and a3
        await trio.sleep(0.01)
        assert table.admit("b3", "10.0.0.2") == "full"  # 2 + 1 < 3 fails: it would only trade places
        assert not isinstance(table.admit("d1", "10.0.0.4"), str)
        assert a1.evicted and a1.scope.cancel_called and not a3.evicted
        assert not isinstance(table.admit("e1", "10.0.0.5"), str)  # 10.0.0.1 and .2 hold 2: .1's a3 is slowest-oldest
        assert a3.evicted and not a2.evicted
        assert not isinstance(table.admit("f1", "10.0.0.6"), str)  # .2 now the most represented
        assert b1.evicted and not b2.evicted
        assert table.admit("g1", "10.0.0.7") == "full"  # every address holds 1 now
        assert not answered.evicted and table.counts["evicted"] == 3

    trio.run(main)


def guarded_server() -> tuple[IHost, StreamGuard, PeerScores]:
    scores = PeerScores()
    host = build_host(Identity.generate())
    guard = StreamGuard(scores)
    guard.install(host)
    return host, guard, scores


def test_shard_streams_held_by_one_byte_requests_from_36_identities_still_answer_an_honest_manifest(tmp_path):
    """The issue's case: 36 identities from 5 addresses, 2 streams each, one byte each; the honest
    peer's manifest request over /ina/shards/1.0.0 is answered with the manifest."""
    store = ShardStore(tmp_path / "server", RUN)
    staged = store.staging_path(1)
    make_checkpoint(staged, 1, seed=5)
    manifest = build_manifest(staged, run_id=RUN, step=1, parent_step=None, shard_size=256 << 10)
    envelope = codec.encode(manifest, Identity.generate(), lifetime_s=3600)
    store.add_published(staged, codec.decode(envelope, CheckpointManifest), envelope).origin = False  # no seed mode
    server, guard, scores = guarded_server()
    config = ShardConfig(data_dir=tmp_path / "server", shard_size=256 << 10)
    shards = ShardStreamServer(ShardServer(store, config, server.get_id().to_base58(), scores), scores)
    server.set_stream_handler(TProtocol(SHARDS_PROTOCOL), shards.handle)

    async def honest(host: IHost, target: PeerInfo) -> bytes:
        return await ShardStreamClient(host, 5.0).get(target.peer_id.to_base58(), f"/ina/v1/{RUN}/1/manifest", 1 << 20)

    assert trio.run(honest_answer_while_held, server, guard, scores, SHARDS_PROTOCOL, 36, honest) == envelope


def test_members_streams_held_by_one_byte_requests_still_answer_an_honest_exchange(tmp_path):
    server, guard, scores = guarded_server()
    MemberExchange(server, MemberView(RUN), scores, PeerCache(tmp_path / "peers.json"), lambda: None).install()

    async def honest(host: IHost, target: PeerInfo) -> list[bytes]:
        return await query_members(host, target)

    assert trio.run(honest_answer_while_held, server, guard, scores, MEMBERS_PROTOCOL, 36, honest) == []


def test_rollout_streams_held_by_one_byte_requests_still_store_an_honest_batch(tmp_path):
    server, guard, scores = guarded_server()
    inbox = RolloutInbox(tmp_path / "inbox")
    receiver = RolloutReceiver(inbox)
    context = SimpleNamespace(host=server, scores=scores, config=SimpleNamespace(run_id=RUN), view=MemberView(RUN))
    worker = Identity.generate()
    envelope = codec.encode(sample_batch(run_id=RUN, worker=worker.peer_id), worker, lifetime_s=600)

    async def honest(host: IHost, target: PeerInfo) -> str:
        return await deliver(SimpleNamespace(host=host, scores=PeerScores()), target.peer_id.to_base58(), envelope,
                             attempts=1)

    answer = trio.run(honest_answer_while_held, server, guard, scores, ROLLOUTS_PROTOCOL, 20, honest,
                      lambda task_status: receiver.run(context, task_status))
    assert answer == "stored" and len(inbox.pending()) == 1


def test_dialback_streams_held_by_one_byte_requests_still_answer_an_honest_request():
    server, guard, scores = guarded_server()
    DialBackServer(server, scores).install()

    async def honest(host: IHost, target: PeerInfo) -> tuple[bytes, str] | None:
        return await ask(host, target.peer_id, 9)  # nothing listens on port 9 here: a quick "unreachable"

    answer = trio.run(honest_answer_while_held, server, guard, scores, DIALBACK_PROTOCOL, 20, honest)
    assert answer is not None and answer[0] in (UNREACHABLE, REFUSED) and answer[1] == HONEST_ADDRESS
