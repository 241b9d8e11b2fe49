"""Real node processes on 127.0.0.1: membership converges, crashes expire, restarts rejoin."""

import json
import subprocess
import sys

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm

FAST = {"INTELLECT_NODE_ADVERT_LIFETIME_S": "15", "INTELLECT_NODE_ADVERT_REFRESH_S": "5",
        "INTELLECT_NODE_HEARTBEAT_S": "1", "INTELLECT_NODE_DISCOVERY_S": "3"}
# Converges in about 1 s on an idle 2-core machine (bench/membership.py measures it); the bound
# leaves room for a loaded CI machine.
CONVERGENCE_BOUND_S = 60.0


@pytest.fixture
def swarm(tmp_path):
    swarm = LocalSwarm(tmp_path, run_id="swarm-test", timing=FAST)
    yield swarm
    swarm.stop_all()


def status_json(home) -> dict:
    out = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "status", "--home", str(home), "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)


@pytest.mark.slow
def test_nine_nodes_converge_crash_expires_and_restart_rejoins_without_bootstrap(swarm):
    boot = swarm.start_bootstrap()
    roles = ["inference", "validator", "trainer"]
    for i in range(8):
        swarm.start_member(f"n{i}", roles[i % 3], [boot.addr])

    swarm.wait_until(swarm.converged, timeout_s=CONVERGENCE_BOUND_S)
    everyone = {node.peer_id for node in swarm.nodes.values()}
    for node in swarm.nodes.values():  # through the CLI, as an operator would look
        data = status_json(node.home)
        assert {m["peer_id"] for m in data["members"]} == everyone
        hardware = {m["peer_id"]: m["hardware"] for m in data["members"]}
        assert all(hw["accelerator"] == "cpu" and hw["cpu_cores"] >= 1 and hw["ram_bytes"] > 0
                   for hw in hardware.values())
    n3_id = swarm.nodes["n3"].peer_id

    swarm.kill("n3")  # SIGKILL: no goodbye, its advert must expire
    survivors = [n for n in swarm.nodes.values()]
    swarm.wait_until(lambda: all(n3_id not in node.member_ids() for node in survivors), timeout_s=15 + 20)

    swarm.kill("bootstrap")  # the restart must not need it: the peer cache is enough
    restarted = swarm.start("n3", ["join", "--role", "validator"])
    assert restarted.peer_id == n3_id
    swarm.wait_until(lambda: all(n3_id in node.member_ids() for node in swarm.nodes.values()),
                     timeout_s=CONVERGENCE_BOUND_S)
    assert swarm.converged()


def test_join_without_any_peer_says_what_to_do(tmp_path):
    result = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "join", "--role", "inference",
                             "--home", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "--bootstrap" in result.stderr and "--new-swarm" in result.stderr


def test_unreachable_bootstrap_is_reported(tmp_path):
    dead = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWGHr8gMeAT6ELsKN1jjPbLCogvrpBLC95bnnLMPAnvAPm"
    result = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "join", "--role", "trainer",
                             "--home", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", dead],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "could not reach any of 1" in result.stderr
    assert "Traceback" not in result.stderr  # a clean message, not trio's wrapped exception


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_status_falls_back_to_asking_a_peer(swarm, tmp_path):
    boot = swarm.start_bootstrap()
    member = swarm.start_member("m", "inference", [boot.addr])
    swarm.wait_until(swarm.converged, timeout_s=CONVERGENCE_BOUND_S)
    # A home with no running node: status asks the bootstrap peer over the members protocol.
    out = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "status", "--home",
                          str(tmp_path / "viewer"), "--json", "--run-id", "swarm-test", "--bootstrap", boot.addr],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert {m["peer_id"] for m in json.loads(out)["members"]} == {boot.peer_id, member.peer_id}
    home = member.home
    assert swarm.stop("m") == 0
    assert not (home / "control.sock").exists()
    assert json.loads((home / "peers.json").read_text())  # the peer cache survives the stop
