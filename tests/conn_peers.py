"""Real libp2p peers for the connection tests: a fresh identity that dials a node from a chosen
127.0.0.x source address (py-libp2p's dialer cannot bind one), and a plain server host."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.io.trio import TrioTCPStream
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.host import build_host

DIAL_TIMEOUT_S = 10.0


def peer_info(addr: str) -> PeerInfo:
    return info_from_p2p_addr(multiaddr.Multiaddr(addr))


@asynccontextmanager
async def serving(host: IHost) -> AsyncIterator[PeerInfo]:
    """Run ``host`` listening on 127.0.0.1; yields its dialable PeerInfo."""
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        yield peer_info(str(host.get_addrs()[0]))


@asynccontextmanager
async def fresh_peer(target: PeerInfo, source_ip: str = "127.0.0.1") -> AsyncIterator[IHost]:
    """A new identity's host connected to ``target`` from ``source_ip``, disconnected on exit.

    Raises (OSError, SwarmException, trio.TooSlowError) when the node refuses the connection.
    """
    host = build_host(Identity.generate())
    tcp = target.addrs[0]
    async with host.run(listen_addrs=[]):
        with trio.fail_after(DIAL_TIMEOUT_S):
            sock = await trio.open_tcp_stream(tcp.value_for_protocol("ip4"), int(tcp.value_for_protocol("tcp")),
                                              local_address=source_ip)
            raw = RawConnection(TrioTCPStream(sock), True)
            await host.get_network().upgrade_outbound_raw_conn(raw, target.peer_id)
        try:
            yield host
        finally:
            with trio.move_on_after(2.0):
                await host.disconnect(target.peer_id)


async def can_connect(target: PeerInfo, source_ip: str = "127.0.0.1") -> bool:
    """Whether a fresh identity gets a connection that carries a stream (identify answers)."""
    try:
        async with fresh_peer(target, source_ip) as host:
            with trio.fail_after(DIAL_TIMEOUT_S):
                stream = await host.new_stream(target.peer_id, ["/ipfs/id/1.0.0"])
                await stream.read(1)
                await stream.close()
            return True
    except Exception:
        return False
