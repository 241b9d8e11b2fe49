"""The dial-back protocol between real in-process nodes on 127.0.0.1 (node/swarm/nat/reachability.py):
a dial-back proves the requester's peer id on the port it named, a port held by another peer or by
nobody is unreachable, a second request from the same IP is refused, and garbage is refused."""

from __future__ import annotations

import trio
from libp2p.custom_types import TProtocol

from intellect_node.node.shards.fetcher import PeerBook
from intellect_node.node.swarm.nat.reachability import (
    REFUSED,
    UNREACHABLE,
    Reachability,
    ask,
    check,
    tcp_port,
)
from intellect_node.node.swarm.streams import write_frame
from intellect_node.protocol.framing import DIALBACK_PROTOCOL
from tests.support.inprocess_nodes import make_node
from tests.support.waiting import poll_up_to

RUN = "reach-test"


async def _ask_fresh(server, requester, peer, port):  # type: ignore[no-untyped-def]
    """One request with the server's per-IP interval reset; the guard holds one stream slot per
    peer until the previous handler has returned, so a request right after another may be reset."""
    for _ in range(5):
        server.nat.dialback._last_by_ip.clear()
        answer = await ask(requester.host, peer, port)
        if answer is not None:
            return answer
        await trio.sleep(0.2)
    return None


async def test_dial_back_proves_the_requester_and_refuses_what_it_should(tmp_path, nursery) -> None:
    server = make_node(tmp_path, "server", RUN)
    addrs = await nursery.start(server.run)
    requester = make_node(tmp_path, "requester", RUN, bootstrap=addrs)
    other = make_node(tmp_path, "other", RUN, bootstrap=addrs)
    await nursery.start(requester.run)
    await nursery.start(other.run)
    peer = server.host.get_id()
    own_port, other_port = tcp_port(requester.addrs()), tcp_port(other.addrs())
    assert own_port and other_port

    server.nat.dialback._last_by_ip.clear()  # the nodes' own loops may have asked already
    result = await check(requester.host, [peer], own_port, Reachability())
    assert (result.state, result.observed_ip) == ("public", "127.0.0.1")
    assert result.advertised(requester.addrs()) == requester.addrs()  # the proven address is the one it has
    assert (await ask(requester.host, peer, own_port)) == (REFUSED, "127.0.0.1")  # once per IP per interval

    assert (await _ask_fresh(server, requester, peer, other_port)) == (UNREACHABLE, "127.0.0.1")  # another key there
    with trio.socket.socket() as unused:
        await unused.bind(("127.0.0.1", 0))
        free_port = unused.getsockname()[1]
    assert (await _ask_fresh(server, requester, peer, free_port)) == (UNREACHABLE, "127.0.0.1")
    assert server.nat.dialback.outcomes["reachable"] >= 1 and server.nat.dialback.outcomes["unreachable"] == 2

    stream = await requester.host.new_stream(peer, [TProtocol(DIALBACK_PROTOCOL)])
    await write_frame(stream, b"x" * 100)  # over the 2-byte limit: refused before it is read
    await poll_up_to(lambda: server.guard.errors or server.scores.rejections, 5)
    assert server.guard.errors or server.scores.rejections


def test_a_private_node_advertises_no_address_and_a_public_one_its_proven_address() -> None:
    addrs = ["/ip4/10.0.0.5/tcp/4001/p2p/12D3KooWabc"]
    assert Reachability("private", "203.0.113.9").advertised(addrs) == []
    assert Reachability("unknown").advertised(addrs) == addrs
    assert Reachability("public", "203.0.113.9").advertised(addrs) == ["/ip4/203.0.113.9/tcp/4001/p2p/12D3KooWabc"]


def test_data_plane_addresses_follow_reachability() -> None:
    http = ["/ip4/10.0.0.5/tcp/7000/http"]
    assert Reachability("private", "203.0.113.9").advertised_data(http) == []  # a NATed node only fetches
    assert Reachability("unknown").advertised_data(http) == http
    assert Reachability("public", "203.0.113.9").advertised_data(http) == ["/ip4/203.0.113.9/tcp/7000/http"]


def test_a_peer_that_stops_advertising_http_is_no_longer_a_parent() -> None:
    book = PeerBook()
    book.learn("peer", ["/ip4/10.0.0.5/tcp/7000/http"])
    assert book.servable("peer")
    book.learn("peer", ["/ip4/10.0.0.5/tcp/4001/p2p/peer"])  # its reachability check found it private
    assert not book.servable("peer") and book.peers["peer"].endpoint is None
    book.learn("peer", ["/ip4/198.18.0.9/tcp/7001/http"])  # public again, on a new address
    assert book.servable("peer") and book.peers["peer"].endpoint.port == 7001
    book.learn("joining", ["/ip4/10.0.0.6/tcp/4001/p2p/joining"])  # its overlay's address not added yet
    assert not book.servable("joining") and book.may_relay("joining")
    book.learn("nated", ["/ip4/198.18.0.2/tcp/4001/p2p/relay/p2p-circuit/p2p/nated"])  # relayed only
    assert not book.servable("nated") and not book.may_relay("nated")
    assert book.may_relay("stranger")  # unknown: the origin's seed mode counts its upload as usual
