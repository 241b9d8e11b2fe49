"""bench/scale.py's namespaces (issue 51): every node dials from an address of its own behind one
router, the bench's newcomer from another, and every namespace is gone afterwards, also when the
build fails half way."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.netns import _namespaces, unavailable_reason

BENCH = Path(__file__).resolve().parent.parent / "bench"
pytestmark = pytest.mark.skipif(unavailable_reason(("ip",)) is not None, reason=str(unavailable_reason(("ip",))))
ACCEPT_TWO = """import socket, sys
server = socket.create_server((sys.argv[1], 7000))
print("ready", flush=True)
for _ in range(2):
    conn, peer = server.accept()
    print(peer[0], flush=True)
    conn.close()
"""


@pytest.fixture
def scale(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # scale.py imports its neighbour membership.py
    import scale

    return scale


def test_each_node_and_the_newcomer_dial_from_their_own_address(scale):
    with scale.SwarmNet(nodes=3) as net:
        server_ns, server_ip = net.host("bootstrap")
        client_ns, client_ip = net.host("s000")
        assert net.host("s000") == (client_ns, client_ip)  # a restarted node keeps its namespace
        server = subprocess.Popen([*net.exec_prefix(server_ns), sys.executable, "-c", ACCEPT_TWO, server_ip],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            net.sh(client_ns, sys.executable, "-c",
                   f"import socket; socket.create_connection(('{server_ip}', 7000), timeout=5).close()")
            net.as_newcomer(lambda: socket.create_connection((server_ip, 7000), timeout=5).close())
            seen = server.communicate(timeout=10)[0].split()
        finally:
            server.kill()
        made = list(net.created)
    assert seen == [client_ip, "10.255.1.2"]
    assert len({server_ip, client_ip, "10.255.1.2"}) == 3
    assert not set(made) & set(_namespaces())


def test_a_build_that_fails_half_way_leaves_no_namespace(scale, monkeypatch):
    real = scale._ip_batch

    def fails_at_the_second_node(lines, namespace=None, force=False):
        if namespace is not None and namespace.endswith("-n1"):
            raise RuntimeError("injected")
        return real(lines, namespace, force)

    monkeypatch.setattr(scale, "_ip_batch", fails_at_the_second_node)
    net = scale.SwarmNet(nodes=3)
    with pytest.raises(RuntimeError, match="injected"):
        net.__enter__()
    assert not [name for name in _namespaces() if name.startswith(net.tag)]
