"""The gossip mesh at rest (node/swarm/mesh_router.py): real libp2p hosts on 127.0.0.1, each with
the node's gossipsub, all connected, so every node has peers outside its mesh. Once formed, the mesh
stops changing (no GRAFT or PRUNE while nobody joins or leaves), every mesh stays within its bounds,
messages reach everyone, and gossip (IHAVE) goes to at most ``GOSSIP_PEERS`` peers a heartbeat.

py-libp2p's own router grafted 2 peers a second on every node with zero-weight scores and pruned
them back (bench/HISTORY.md "Scale"): 11 GRAFT/PRUNE a second per node at N=100."""

from __future__ import annotations

import itertools
from contextlib import AsyncExitStack

import multiaddr
import trio
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.gossip import MESH_DEGREE_HIGH, MESH_DEGREE_LOW, build_pubsub
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.mesh_router import GOSSIP_PEERS, SteadyGossipSub

LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
TOPIC = "mesh-router-test"
NODES = 12  # 11 peers each: 3-7 outside any mesh of 4-8
QUIET_HEARTBEATS = 4
WINDOW_S = 6.0


def churn(routers: list[SteadyGossipSub]) -> int:
    return sum(r.rpcs["sent"]["graft"] + r.rpcs["sent"]["prune"] for r in routers)


async def test_a_formed_mesh_stops_changing_and_gossips_to_a_fixed_fan_out() -> None:
    hosts = [build_host(Identity.generate()) for _ in range(NODES)]
    routers: list[SteadyGossipSub] = []
    received = [0] * NODES
    everyone_has_all = trio.Event()
    async with AsyncExitStack() as stack:
        for host in hosts:
            await stack.enter_async_context(host.run(LISTEN))
        pubsubs = []
        for host in hosts:
            pubsub, router = build_pubsub(host)
            await stack.enter_async_context(background_trio_service(pubsub))
            await stack.enter_async_context(background_trio_service(router))
            await pubsub.wait_until_ready()
            pubsubs.append(pubsub)
            routers.append(router)
        subscriptions = [await pubsub.subscribe(TOPIC) for pubsub in pubsubs]
        with trio.fail_after(60):
            for a, b in itertools.combinations(hosts, 2):
                await a.connect(PeerInfo(b.get_id(), b.get_addrs()))

        async def drain(index: int) -> None:
            while True:
                await subscriptions[index].get()
                received[index] += 1
                if min(received) >= int(WINDOW_S):
                    everyone_has_all.set()

        async with trio.open_nursery() as nursery:
            for index in range(NODES):
                nursery.start_soon(drain, index)
            # formed: every node sees the others and no GRAFT or PRUNE for a few heartbeats running
            with trio.fail_after(45):
                quiet, last = 0, churn(routers)
                while quiet < QUIET_HEARTBEATS:
                    await trio.sleep(1.0)
                    now = churn(routers)
                    formed = all(len(p.peer_topics.get(TOPIC, ())) == NODES - 1 for p in pubsubs)
                    quiet = quiet + 1 if now == last and formed else 0
                    last = now
            assert all(MESH_DEGREE_LOW <= len(r.mesh[TOPIC]) <= MESH_DEGREE_HIGH for r in routers)

            before_churn = churn(routers)
            before_ihave = [r.rpcs["sent"]["ihave"] for r in routers]
            before_beats = [r.heartbeats for r in routers]
            for second in range(int(WINDOW_S)):  # one message a second, as the members topic's budget
                await pubsubs[second % NODES].publish(TOPIC, f"advert {second}".encode())
                await trio.sleep(1.0)
            with trio.fail_after(10):
                await everyone_has_all.wait()
            nursery.cancel_scope.cancel()

        assert churn(routers) == before_churn  # nobody joined or left: the mesh did not change
        assert all(MESH_DEGREE_LOW <= len(r.mesh[TOPIC]) <= MESH_DEGREE_HIGH for r in routers)
        for router, ihave, beats in zip(routers, before_ihave, before_beats, strict=True):
            heartbeats = router.heartbeats - beats
            assert heartbeats >= WINDOW_S - 2
            assert router.rpcs["sent"]["ihave"] - ihave <= GOSSIP_PEERS * heartbeats
        assert received == [int(WINDOW_S)] * NODES
        assert all(r.rpc_counts()["sent"]["messages"] > 0 for r in routers)
