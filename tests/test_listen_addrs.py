"""Listening and advertising: a port another node holds is found, and 0.0.0.0 is never advertised."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from intellect_node.node.swarm.host import PortInUse, claim_listen_addrs, dialable_addrs, dialable_hosts


def _listener_with_reuseport() -> tuple[socket.socket, int]:
    """What py-libp2p's TCP listener does: SO_REUSEPORT, so a second listener would silently share."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_a_port_held_by_a_reuseport_listener_is_refused_when_chosen() -> None:
    holder, port = _listener_with_reuseport()
    with holder, pytest.raises(PortInUse, match=f"port {port} is in use.*--listen"):
        claim_listen_addrs([f"/ip4/127.0.0.1/tcp/{port}"], defaulted=False)


def test_a_busy_default_port_falls_back_to_a_free_one() -> None:
    holder, port = _listener_with_reuseport()
    with holder:
        assert claim_listen_addrs([f"/ip4/127.0.0.1/tcp/{port}"], defaulted=True) == ["/ip4/127.0.0.1/tcp/0"]


def test_free_and_ephemeral_ports_pass_unchanged() -> None:
    holder, port = _listener_with_reuseport()
    holder.close()
    addrs = [f"/ip4/127.0.0.1/tcp/{port}", "/ip4/127.0.0.1/tcp/0"]
    assert claim_listen_addrs(addrs, defaulted=False) == addrs


def test_unspecified_address_becomes_interface_addresses() -> None:
    hosts = dialable_hosts("0.0.0.0")
    assert hosts and "0.0.0.0" not in hosts
    addrs = dialable_addrs(["/ip4/0.0.0.0/tcp/4001/p2p/12D3KooWabc", "/ip4/10.1.2.3/tcp/9/p2p/12D3KooWabc"])
    assert not any("0.0.0.0" in a for a in addrs)
    assert "/ip4/10.1.2.3/tcp/9/p2p/12D3KooWabc" in addrs
    assert [f"/ip4/{h}/tcp/4001/p2p/12D3KooWabc" for h in hosts] == addrs[:len(hosts)]
    assert dialable_hosts("127.0.0.1") == ["127.0.0.1"]


def test_second_node_on_a_chosen_busy_port_fails_clearly(tmp_path) -> None:
    holder, port = _listener_with_reuseport()
    with holder:
        result = subprocess.run(
            [sys.executable, "-m", "intellect_node.cli.main", "bootstrap", "--home", str(tmp_path),
             "--listen", f"/ip4/127.0.0.1/tcp/{port}"],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"port {port} is in use" in result.stderr and "Traceback" not in result.stderr
