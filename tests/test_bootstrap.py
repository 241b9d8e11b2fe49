"""Joining through real nodes on 127.0.0.1: DNS names, the peer cache before bootstrap peers, and a
failure message that names every address tried and why it failed."""

import json
import socket
import tomllib

import pytest
import trio

from intellect_node.crypto.identity import Identity
from intellect_node.node.app.config import load_config
from intellect_node.node.swarm.bootstrap import (
    DnsFailure,
    config_line,
    join_tiers,
    resolve,
)
from intellect_node.node.swarm.runtime import JoinError
from tests.support.inprocess_nodes import make_node

RUN = "bootstrap-test"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def silent_listener():
    """A TCP port that accepts connections (the kernel's backlog) but never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _accepted_any(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside trio's nested nursery groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def test_resolve_replaces_a_dns_name_and_leaves_ip_addresses_alone():
    peer = Identity.generate().peer_id
    assert await resolve(f"/dns4/localhost/tcp/4001/p2p/{peer}") == [f"/ip4/127.0.0.1/tcp/4001/p2p/{peer}"]
    assert await resolve(f"/ip4/10.0.0.1/tcp/1/p2p/{peer}") == [f"/ip4/10.0.0.1/tcp/1/p2p/{peer}"]
    with pytest.raises(DnsFailure, match="no-such-host.invalid"):
        await resolve(f"/dns4/no-such-host.invalid/tcp/4001/p2p/{peer}")


def test_tiers_put_the_cache_first_and_never_repeat_or_include_ourselves():
    tiers = join_tiers(cached=["/a", "/b", "/a"], configured=["/b", "/c", "/own"], own=["/own"])
    assert tiers == [("peer cache", ["/a", "/b"]), ("bootstrap", ["/c"])]
    assert join_tiers([], [], []) == []


def test_the_printed_config_line_loads_as_the_bootstrap_list(tmp_path):
    addrs = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWabc", "/dns4/boot.example.org/tcp/4001/p2p/12D3KooWabc"]
    line = config_line(addrs)
    assert tomllib.loads(line) == {"bootstrap": addrs}
    (tmp_path / "config.toml").write_text(f"[node]\n{line}\n")
    assert load_config({"home": tmp_path}, environ={}).swarm.bootstrap == tuple(addrs)


async def test_a_node_joins_through_a_dns_name(tmp_path, nursery):
    first = make_node(tmp_path, "first", RUN)
    addrs = await nursery.start(first.run)
    port = addrs[0].split("/tcp/")[1].split("/")[0]
    second = make_node(tmp_path, "second", RUN, bootstrap=[f"/dns4/localhost/tcp/{port}/p2p/{first.peer_id}"])
    await nursery.start(second.run)
    assert second.view.get(first.peer_id) is not None  # the members exchange ran through the resolved address
    assert first.peer_id in {p.to_base58() for p in second.host.get_connected_peers()}


async def test_the_peer_cache_is_tried_before_bootstrap_peers(tmp_path, nursery, silent_listener):
    first = make_node(tmp_path, "first", RUN)
    addrs = await nursery.start(first.run)
    bootstrap = f"/ip4/127.0.0.1/tcp/{silent_listener.getsockname()[1]}/p2p/{Identity.generate().peer_id}"
    second = make_node(tmp_path, "second", RUN, bootstrap=[bootstrap], connect_timeout_s=2.0)
    second.config.layout.peer_cache.write_text(json.dumps({first.peer_id: addrs}))
    second.peer_cache._load()
    with trio.fail_after(10):
        await nursery.start(second.run)
    assert second.view.get(first.peer_id) is not None
    assert not _accepted_any(silent_listener)  # the cache answered: the bootstrap host saw no dial


async def test_when_no_peer_answers_the_error_names_each_address_and_why(tmp_path, nursery, silent_listener):
    first = make_node(tmp_path, "first", RUN)
    addrs = await nursery.start(first.run)
    stranger = Identity.generate().peer_id
    first_port = addrs[0].split("/tcp/")[1].split("/")[0]
    tried = {
        "refused": f"/ip4/127.0.0.1/tcp/{_closed_port()}/p2p/{Identity.generate().peer_id}",
        "wrong peer id": f"/ip4/127.0.0.1/tcp/{first_port}/p2p/{stranger}",  # first's port, someone else's id
        "timeout": f"/ip4/127.0.0.1/tcp/{silent_listener.getsockname()[1]}/p2p/{Identity.generate().peer_id}",
        "dns failure": f"/dns4/no-such-host.invalid/tcp/4001/p2p/{Identity.generate().peer_id}",
        "bad address": "/ip4/127.0.0.1/tcp/4001",
    }
    lonely = make_node(tmp_path, "lonely", RUN, bootstrap=list(tried.values()), connect_timeout_s=1.5)
    with trio.fail_after(15), pytest.raises(BaseException) as caught:
        await lonely.run()
    errors = _leaves(caught.value)
    assert len(errors) == 1 and isinstance(errors[0], JoinError), caught.value
    message = str(errors[0])
    assert f"could not reach any of {len(tried)} peers tried" in message
    lines = {line.strip() for line in message.splitlines()}
    for reason, addr in tried.items():
        assert any(line.startswith(f"{addr} (bootstrap): {reason}") for line in lines), (reason, message)


async def test_a_join_refused_at_the_per_ip_cap_says_so_not_wrong_peer(tmp_path, nursery):
    """A bootstrap node admitting one unproven connection per IP: the second node from 127.0.0.1 is
    turned away at admission, and its error names that cap and the setting, not a wrong peer id."""
    first = make_node(tmp_path, "first", RUN, unproven_per_ip=1)
    addrs = await nursery.start(first.run)
    holder = make_node(tmp_path, "holder", RUN, bootstrap=addrs)
    await nursery.start(holder.run)  # holds the one unproven slot 127.0.0.1 gets
    late = make_node(tmp_path, "late", RUN, bootstrap=addrs, connect_timeout_s=3.0)
    with trio.fail_after(20), pytest.raises(BaseException) as caught:
        await late.run()
    errors = _leaves(caught.value)
    assert len(errors) == 1 and isinstance(errors[0], JoinError), caught.value
    message = str(errors[0])
    assert f"{addrs[0]} (bootstrap): over admission cap" in message, message
    assert "unproven_per_ip" in message and "INTELLECT_NODE_UNPROVEN_PER_IP" in message
    assert "wrong peer id" not in message
    assert first.connections.status()["refused"].get("per_ip", 0) >= 1
