"""Circuit relay v2 between real in-process hosts on 127.0.0.1 (node/swarm/nat/relay_service.py,
relay_client.py): a relay refuses the (max+1)th reservation, a reservation cannot be taken in
another peer's name (defect R1), and a stream opened through the relay reaches the reserved peer
(a members request answered across the circuit); the relay counts the circuit and its bytes."""

from __future__ import annotations

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg
from libp2p.tools.anyio_service import background_trio_service

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.guard import StreamGuard
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.nat.relay_client import RelayClient
from intellect_node.node.swarm.nat.relay_service import HOP_PROTOCOL, RelayService, relay_limits
from intellect_node.node.swarm.peer_scores import PeerScores
from tests.support.inprocess_nodes import make_node

LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
ECHO = TProtocol("/test/echo/1.0.0")


def _guarded_host() -> IHost:
    host = build_host(Identity.generate())
    StreamGuard(PeerScores()).install(host)
    return host


async def _read_exactly(stream, n: int) -> bytes:  # type: ignore[no-untyped-def]
    """Reads return what has arrived (the guard hands the first byte back on its own)."""
    data = b""
    while len(data) < n:
        data += await stream.read(n - len(data))
    return data


async def test_relay_refuses_the_reservation_past_its_limit_and_in_another_name(nursery) -> None:
    relay_host, *clients = [_guarded_host() for _ in range(4)]
    limits = relay_limits(max_reservations=2, reservation_ttl_s=60, circuit_duration_s=10, circuit_bytes=1 << 20)
    async with relay_host.run(LISTEN), clients[0].run(LISTEN), clients[1].run(LISTEN), clients[2].run(LISTEN):
        relay = RelayService(relay_host, limits)
        async with background_trio_service(relay):
            relay.set_hop(True)
            relay_addr = str(relay_host.get_addrs()[0]).split("/p2p/")[0]
            for client in clients:
                await client.connect(PeerInfo(relay_host.get_id(), [multiaddr.Multiaddr(relay_addr)]))

            # R1: client 0 asks for a reservation in client 2's name: it gets one in its own.
            stream = await clients[0].new_stream(relay_host.get_id(), [HOP_PROTOCOL])
            await write_delimited_msg(stream, HopMessage(type=HopMessage.RESERVE,
                                                         peer=CircuitPeerId(id=clients[2].get_id().to_bytes())))
            with trio.fail_after(10):
                await read_delimited_msg(stream, HopMessage)
            await stream.close()
            assert relay.reservations() == [clients[0].get_id().to_base58()]

            results = []
            for client in clients[1:]:
                user = RelayClient(client, RelayService(client, limits))
                with trio.fail_after(15):
                    results.append(await user._reserve(relay_host.get_id().to_base58(), relay_addr))
            assert results == [True, False]  # the third reservation is over max_reservations=2
            assert sorted(relay.reservations()) == sorted(c.get_id().to_base58() for c in clients[:2])
            assert relay.status()["reservations_refused"] == 1


async def test_a_stream_through_the_relay_reaches_the_reserved_peer(tmp_path, nursery) -> None:
    """The relay is a full node (its hop switched on as a public node's is); the NATed side is a
    full node too, so the request crossing the circuit is the members protocol itself."""
    relay = make_node(tmp_path, "relay", "relay-test")
    addrs = await nursery.start(relay.run)
    relay.nat.relay.set_hop(True)
    home = make_node(tmp_path, "home", "relay-test", bootstrap=addrs)
    await nursery.start(home.run)
    dialer_host = _guarded_host()
    dialer_service = RelayService(dialer_host, relay.nat.relay.limits)
    async with dialer_host.run(LISTEN), background_trio_service(dialer_service):
        relay_id = relay.host.get_id().to_base58()
        relay_addr = addrs[0].split("/p2p/")[0]
        with trio.fail_after(15):
            assert await home.nat.relay_client._reserve(relay_id, relay_addr)
        circuit = home.nat.relay_client.relayed_addrs()[0]
        assert circuit == f"{relay_addr}/p2p/{relay_id}/p2p-circuit/p2p/{home.peer_id}"

        async def echo(stream) -> None:  # type: ignore[no-untyped-def]
            await stream.write(b"echo:" + await _read_exactly(stream, 5))
            await stream.close()

        home.host.set_stream_handler(ECHO, echo)
        dialer = RelayClient(dialer_host, dialer_service)
        with trio.fail_after(20):
            peer = await dialer.dial(circuit)
            assert peer.to_base58() == home.peer_id
            stream = await dialer_host.new_stream(peer, [ECHO])
            await stream.write(b"hello")
            reply = await _read_exactly(stream, 10)
        assert reply == b"echo:hello"
        conns = dialer_host.get_network().connections[peer]
        conns = conns if isinstance(conns, list) else [conns]
        assert all("/p2p-circuit" in str(a) for c in conns for a in c.get_transport_addresses())
        status = relay.snapshot()["relay"]
        assert status["hop"] and status["reservations_served"] == 1
        assert status["circuits"]["opened"] == 1 and status["bytes_relayed"] > 0
        assert dialer.dials == {"ok": 1, "failed": 0}


def test_relay_limits_come_from_the_node_section(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from intellect_node.node.app.config import ConfigError, load_config

    (tmp_path / "config.toml").write_text("[node]\nrelay_max_reservations = 3\nrelay_circuit_bytes = 1048576\n")
    config = load_config({"home": str(tmp_path)}, environ={"INTELLECT_NODE_RELAY_CIRCUIT_DURATION_S": "30"})
    swarm = config.swarm
    assert (swarm.relay_max_reservations, swarm.relay_circuit_bytes,
            swarm.relay_circuit_duration_s) == (3, 1 << 20, 30.0)
    (tmp_path / "config.toml").write_text("[node]\nrelay_circuit_bytes = 0\n")
    try:
        load_config({"home": str(tmp_path)}, environ={})
    except ConfigError as exc:
        assert "relay_circuit_bytes" in str(exc)
    else:
        raise AssertionError("relay_circuit_bytes = 0 was accepted")
