"""A node's host dials only whom the node chooses (node/swarm/host.py): py-libp2p's auto-connector
would dial every peer in its peerstore, so in a swarm of N every node held N-1 connections."""

from __future__ import annotations

from contextlib import AsyncExitStack

import multiaddr
import trio

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.host import build_host

LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]


async def test_a_known_peer_is_not_dialed_unless_the_node_asks() -> None:
    hosts = [build_host(Identity.generate()) for _ in range(4)]
    first, others = hosts[0], hosts[1:]
    async with AsyncExitStack() as stack:
        for host in others:
            await stack.enter_async_context(host.run(LISTEN))
        for host in others:  # known before the first host starts: its auto-connector ticked at start
            first.get_peerstore().add_addrs(host.get_id(), host.get_addrs(), 3600)
        await stack.enter_async_context(first.run(LISTEN))
        await trio.sleep(2.0)
        assert first.get_connected_peers() == []
        await first.connect(first.get_peerstore().peer_info(others[0].get_id()))  # the node's own dial still works
        assert first.get_connected_peers() == [others[0].get_id()]
