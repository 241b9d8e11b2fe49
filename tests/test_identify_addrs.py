"""A node listening on 0.0.0.0 tells peers only addresses they can dial (specs/connections.md).

py-libp2p 0.8.1's identify sent ``/ip4/0.0.0.0/...`` as the node's listenAddrs and in its signed
peer record, and js- and go-libp2p peers stored it as the node's only address. Real hosts on this
machine: A listens on 0.0.0.0, B dials it and runs identify; then two nodes, for the DHT's
provider records and peer routing and for the node's advert.
"""

from __future__ import annotations

import ipaddress

import multiaddr
import trio
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.identity.identify.pb.identify_pb2 import Identify
from libp2p.peer.envelope import consume_envelope
from libp2p.peer.peer_record import PEER_RECORD_ENVELOPE_DOMAIN
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import read_length_prefixed_protobuf

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.host import advertised_multiaddrs, build_host, dialable_addrs, dialable_hosts
from intellect_node.node.swarm.runtime import Node
from intellect_node.node.swarm.settings import SwarmSettings
from intellect_node.protocol import codec
from intellect_node.protocol.messages import NodeAdvert
from tests.support.protocol_samples import CPU_HARDWARE
from tests.support.waiting import poll_until


def _ip(addr: multiaddr.Multiaddr | str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(str(addr).split("/")[2])


def _all_dialable(addrs: list[multiaddr.Multiaddr] | list[str]) -> bool:
    return bool(addrs) and not any(_ip(addr).is_unspecified for addr in addrs)


def test_unspecified_addresses_are_replaced_or_dropped() -> None:
    hosts = dialable_hosts("0.0.0.0")
    out = dialable_addrs(["/ip4/0.0.0.0/tcp/9/p2p/12D3KooWabc", "/ip6/::/tcp/9", "/ip4/10.1.2.3/tcp/9"])
    assert out[:len(hosts)] == [f"/ip4/{h}/tcp/9/p2p/12D3KooWabc" for h in hosts]
    assert "/ip4/10.1.2.3/tcp/9" in out and _all_dialable(out)
    assert all(_ip(addr).version == 4 or _ip(addr).is_global for addr in out)  # :: only as global IPv6
    assert advertised_multiaddrs([multiaddr.Multiaddr("/ip4/0.0.0.0/tcp/9")]) == [
        multiaddr.Multiaddr(f"/ip4/{h}/tcp/9") for h in hosts]


async def test_identify_sends_dialable_listen_addrs_and_peer_record() -> None:
    a, b = build_host(Identity.generate()), build_host(Identity.generate())
    async with a.run(listen_addrs=[multiaddr.Multiaddr("/ip4/0.0.0.0/tcp/0")]), \
            b.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        port = int(str(a.get_transport_addrs()[0]).split("/")[4])
        assert str(a.get_transport_addrs()[0]).startswith("/ip4/0.0.0.0/")  # it does listen on 0.0.0.0
        expected = {f"/ip4/{h}/tcp/{port}" for h in dialable_hosts("0.0.0.0")}
        assert {str(addr).split("/p2p/")[0] for addr in a.get_addrs()} == expected

        await b.connect(PeerInfo(a.get_id(), [multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")]))
        stream = await b.new_stream(a.get_id(), [IDENTIFY])
        with trio.fail_after(10):
            message = Identify()
            message.ParseFromString(await read_length_prefixed_protobuf(stream, use_varint_format=True))
        listen = [multiaddr.Multiaddr(raw) for raw in message.listen_addrs]
        assert {str(addr) for addr in listen} == expected
        _, record = consume_envelope(message.signedPeerRecord, PEER_RECORD_ENVELOPE_DOMAIN)
        assert record.peer_id == a.get_id()
        assert {str(addr).split("/p2p/")[0] for addr in record.addrs} == expected

        # B's own identify on connect replaces the address it dialed
        await poll_until(lambda: {str(addr).split("/p2p/")[0] for addr in b.get_peerstore().addrs(a.get_id())}
                         == expected, 10)
        stored = b.get_peerstore().get_peer_record(a.get_id())
        assert stored is not None and _all_dialable(stored.record().addrs)


async def test_dht_provider_records_peer_routing_and_adverts_are_dialable(tmp_path, nursery) -> None:
    def node(name: str, bootstrap: list[str]) -> Node:
        config = SwarmSettings(home=tmp_path / name, run_id="addr-test", roles=("inference",),
                               listen=("/ip4/0.0.0.0/tcp/0",), bootstrap=tuple(bootstrap), new_swarm=not bootstrap,
                               heartbeat_s=1.0, discovery_s=2.0)
        config.home.mkdir(parents=True)
        return Node(config, Identity.generate(), CPU_HARDWARE)

    first = node("a", [])
    addrs = await nursery.start(first.run)
    assert _all_dialable(addrs)
    second = node("b", addrs)
    await nursery.start(second.run)

    assert await first.provide("0123456789abcdef0123456789abcdef")
    with trio.fail_after(20):
        while True:
            providers = await second.dht.find_providers("0123456789abcdef0123456789abcdef", 5)
            if any(info.peer_id == first.host.get_id() for info in providers):
                break
            await trio.sleep(0.2)
    provided = next(info for info in providers if info.peer_id == first.host.get_id())
    assert _all_dialable(provided.addrs)

    routed = await first.dht.peer_routing.find_peer(first.host.get_id())  # what kad answers for us
    assert routed is not None and _all_dialable(routed.addrs)

    own = codec.decode(first.adverts.envelope, NodeAdvert).message  # type: ignore[arg-type]
    assert _all_dialable(list(own.addrs))
