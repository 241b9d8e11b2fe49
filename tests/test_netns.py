"""The namespace internet itself: NAT out works, nothing reaches a home from outside, and the
namespaces are gone afterwards (tests/netns.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.netns import SmallInternet, _namespaces, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def _connect(net: SmallInternet, namespace: str, ip: str, port: int) -> str:
    code = (f"import socket\ntry:\n socket.create_connection(('{ip}', {port}), timeout=2); print('ok')\n"
            "except OSError as exc:\n print(type(exc).__name__)")
    return subprocess.run([*net.exec_prefix(namespace), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=10, check=True).stdout.strip()


def _listen(net: SmallInternet, namespace: str, port: int) -> subprocess.Popen[str]:
    code = (f"import socket,sys\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('0.0.0.0', {port})); s.listen(); print('ready', flush=True)\n"
            "c, a = s.accept(); print(a[0], flush=True)")
    server = subprocess.Popen([*net.exec_prefix(namespace), sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


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
