"""Churn against one node, as a public bootstrap node lives it: fresh identities that dial from a
chosen 127.x.y.z source address (py-libp2p's dialer cannot bind one), publish an advert and leave,
or (``flood``) hold idle connections from a few address ranges and remake each one the node
closes or refuses. The connection and admission tests, bench/connections.py and bench/admission.py
drive it."""

import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.io.trio import TrioTCPStream
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.adverts import SOFTWARE_VERSION
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol import codec
from intellect_node.protocol.framing import (
    MAX_MEMBERS_RESPONSE,
    MEMBERS_PROTOCOL,
    decode_envelope_list,
    encode_members_request,
)
from intellect_node.protocol.messages import Hardware, NodeAdvert

DIAL_TIMEOUT_S = 10.0


def peer_info(addr: str) -> PeerInfo:
    return info_from_p2p_addr(multiaddr.Multiaddr(addr))


@asynccontextmanager
async def serving(host: IHost) -> AsyncIterator[PeerInfo]:
    """Run ``host`` listening on 127.0.0.1; yields its dialable PeerInfo."""
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        yield peer_info(str(host.get_addrs()[0]))


@asynccontextmanager
async def fresh_peer(target: PeerInfo, source_ip: str = "127.0.0.1",
                     identity: Identity | None = None) -> AsyncIterator[IHost]:
    """A new identity's host connected to ``target`` from ``source_ip``, disconnected on exit.

    Raises (OSError, SwarmException, trio.TooSlowError) when the node refuses the connection.
    """
    host = build_host(identity or Identity.generate())
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


async def hold(target: PeerInfo, source_ip: str, release: trio.Event) -> bool:
    """A fresh identity connects from ``source_ip`` and holds the connection idle until ``release``
    is set or the node closes it; whether it got in."""
    try:
        async with fresh_peer(target, source_ip) as host:
            conns = host.get_network().get_connections(target.peer_id)
            if not conns:
                return False
            closed = getattr(conns[0].muxed_conn, "event_closed", None)
            async with trio.open_nursery() as nursery:
                async def until(event: trio.Event) -> None:
                    await event.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until, release)
                if isinstance(closed, trio.Event):
                    nursery.start_soon(until, closed)
            return True
    except Exception:  # refused, or the handshake cut short
        return False


async def flood(target: PeerInfo, sources: list[str], connections: int, stop: trio.Event,
                retry_s: float = 0.2) -> Counter[str]:
    """``connections`` attackers spread over ``sources``, each holding one idle connection from its
    address and remaking it (a fresh identity) ``retry_s`` after the node closes or refuses it,
    until ``stop``. Counts "admitted" and "refused" attempts."""
    counts: Counter[str] = Counter()

    async def attacker(source_ip: str) -> None:
        while not stop.is_set():
            counts["admitted" if await hold(target, source_ip, stop) else "refused"] += 1
            with trio.move_on_after(retry_s):
                await stop.wait()

    async with trio.open_nursery() as nursery:
        for i in range(connections):
            nursery.start_soon(attacker, sources[i % len(sources)])
    return counts


CHURN_HARDWARE = Hardware(accelerator="cpu", accelerator_name="churn", accelerator_count=0, accelerator_memory_bytes=0,
                          cpu_cores=1, ram_bytes=1 << 30, disk_free_bytes=1 << 30)


async def query_members(host: IHost, target: PeerInfo, advert: bytes = b"") -> list[bytes]:
    """One members exchange: send ``advert`` (nothing for a read-only query) and no digest, return the
    list (every advert the node holds)."""
    with trio.fail_after(DIAL_TIMEOUT_S):
        stream = await host.new_stream(target.peer_id, [MEMBERS_PROTOCOL])
        try:
            await write_frame(stream, encode_members_request(advert, []))
            return decode_envelope_list(await read_frame(stream, MAX_MEMBERS_RESPONSE, DIAL_TIMEOUT_S))
        finally:
            await close_quietly(stream)


async def advertise_and_leave(target: PeerInfo, run_id: str, source_ip: str = "127.0.0.1",
                              lifetime_s: float = 10.0) -> bool:
    """One churn cycle: a fresh identity connects, publishes a short-lived advert, leaves."""
    identity = Identity.generate()
    advert = NodeAdvert(peer_id=identity.peer_id, run_id=run_id, roles=("inference",), addrs=(),
                        hardware=CHURN_HARDWARE, throughput_tokens_per_s=0.0, software_version=SOFTWARE_VERSION,
                        policy_step=None)
    try:
        async with fresh_peer(target, source_ip, identity) as host:
            await query_members(host, target, codec.encode(advert, identity, lifetime_s=lifetime_s))
            return True
    except Exception:
        return False


async def churn(cycle: Callable[[], Awaitable[bool]], cycles: int, concurrency: int) -> tuple[int, float]:
    """Run ``cycles`` cycles, ``concurrency`` at a time; (how many succeeded, seconds taken)."""
    succeeded = 0
    started = time.perf_counter()
    limiter = trio.CapacityLimiter(concurrency)

    async def one() -> None:
        nonlocal succeeded
        async with limiter:
            ok = await cycle()
        succeeded += ok

    async with trio.open_nursery() as nursery:
        for _ in range(cycles):
            nursery.start_soon(one)
    return succeeded, time.perf_counter() - started
