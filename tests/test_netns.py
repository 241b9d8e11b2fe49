"""The namespace helpers themselves: NAT out works, nothing reaches a home from outside, a
rate-limited link holds its rate, and the namespaces are gone afterwards (tests/support/netns.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.netns import LimitedSwitch, SmallInternet, _namespaces, unavailable_reason


def _connect(net: SmallInternet, namespace: str, ip: str, port: int) -> str:
    code = (f"import socket\ntry:\n socket.create_connection(('{ip}', {port}), timeout=2); print('ok')\n"
            "except OSError as exc:\n print(type(exc).__name__)")
    return subprocess.run([*net.exec_prefix(namespace), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=10, check=True).stdout.strip()


def _listen(net: SmallInternet, namespace: str, port: int) -> subprocess.Popen[str]:
    code = (f"import socket,sys\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('0.0.0.0', {port})); s.listen(); print('ready', flush=True)\n"
            "c, a = s.accept(); print(a[0], flush=True)")
    server = subprocess.Popen([*net.exec_prefix(namespace), sys.executable, "-c", code], stdout=subprocess.PIPE,
                              text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_home_reaches_the_public_side_through_masquerade_and_is_not_reachable_itself() -> None:
    with SmallInternet(publics=1, homes=1) as net:
        pub, home = net.name("pub0"), net.name("home1")
        server = _listen(net, pub, 9000)
        try:
            assert _connect(net, home, "198.18.0.2", 9000) == "ok"
            assert server.communicate(timeout=5)[0].strip() == "198.18.0.11"  # the router's address, not the home's
        finally:
            server.kill()
        server = _listen(net, home, 9001)
        try:
            assert _connect(net, pub, "198.19.1.2", 9001) == "OSError"  # no route to a private network
            assert _connect(net, pub, "198.18.0.11", 9001) == "TimeoutError"  # the router forwards nothing in, drops it
        finally:
            server.kill()
        made = list(net.created)
    assert not set(made) & set(_namespaces())


SEND_MBIT, SEND_BYTES = 8.0, 2_000_000


@pytest.mark.skipif(unavailable_reason(LimitedSwitch.TOOLS) is not None,
                    reason=str(unavailable_reason(LimitedSwitch.TOOLS)))
def test_limited_switch_holds_a_transfer_to_its_rate_and_routes_nowhere_else() -> None:
    """bench/diloco.py's link: a worker that entered its namespace (``enter``) sends to the other
    host at about the tbf rate, not at loopback speed, and has no route off the switch."""
    code = ("import socket, sys, time\nfrom tests.support.netns import enter\nenter(sys.argv[1])\n"
            "try:\n socket.create_connection(('1.1.1.1', 80), timeout=2)\nexcept OSError as exc:\n print(exc.errno)\n"
            f"s = socket.create_connection((sys.argv[2], 9000), timeout=5)\nstarted = time.perf_counter()\n"
            f"s.sendall(b'x' * {SEND_BYTES})\ns.shutdown(socket.SHUT_WR)\ns.recv(1)\n"
            f"print(time.perf_counter() - started)")
    with LimitedSwitch(hosts=2, mbit=SEND_MBIT) as net:
        a, b = net.name("host0"), net.name("host1")
        assert net.sh(a, "tc", "qdisc", "show", "dev", "eth0").startswith("qdisc tbf")
        sink = subprocess.Popen([*net.exec_prefix(b), sys.executable, "-c",
                                 "import socket\ns=socket.socket(); "
                                 "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                                 "s.bind(('0.0.0.0', 9000)); s.listen(); print('ready', flush=True)\n"
                                 "c, _ = s.accept()\n"
                                 "while c.recv(1 << 16): pass\nc.sendall(b'k')"], stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
            out = subprocess.run([sys.executable, "-c", code, a, net.ips[b]], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.split()
        finally:
            sink.kill()
        assert out[0] == "101"  # ENETUNREACH: no route out of the namespaces
        mbit = SEND_BYTES * 8 / float(out[1]) / 1e6
        assert 0.6 * SEND_MBIT < mbit < 1.2 * SEND_MBIT, f"{mbit:.1f} Mbit/s through a {SEND_MBIT} Mbit/s link"
        made = list(net.created)
    assert not set(made) & set(_namespaces())
