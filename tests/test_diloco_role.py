"""``intellect-node join --role diloco``: two real nodes (each with its averager child) find each
other's hivemind address and state server in their signed adverts, train the tiny Llama on the
generated corpus, end at one state hash, write metrics.jsonl, report in ``status``, and leave no hivemind process
behind after SIGTERM or Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm, wait_until
from intellect_node.node.diloco.adverts import state_endpoint
from intellect_node.protocol import codec
from intellect_node.protocol.manifest import CheckpointManifest

pytestmark = pytest.mark.slow

DILOCO = """[diloco]
H = 4
batch = 4
matchmaking_s = 2.0
round_timeout_s = 30.0
max_peers = 2
data = "generated:sequences=1024,seq_len=32"
"""


def _gone(group: int) -> None:
    """The averager child's process group is empty within 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    pytest.fail("the averager child's process group outlived its node")


def _rounds(home) -> list[dict]:
    path = home / "diloco" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _together(a_home, b_home) -> list[tuple[dict, dict]]:
    """The rounds both nodes averaged in a group of two: (a's record, b's record)."""
    ra, rb = ({r["round"]: r for r in _rounds(home)} for home in (a_home, b_home))
    return [(ra[n], rb[n]) for n in sorted(ra) if n in rb and ra[n]["group_size"] == rb[n]["group_size"] == 2]


def _agreed(a_home, b_home) -> list[tuple[dict, dict]]:
    """The rounds of two that both began from one state (each member signed the same hash)."""
    return [(ra, rb) for ra, rb in _together(a_home, b_home) if ra["hash_agreement"] and rb["hash_agreement"]]


def test_two_nodes_run_diloco_rounds_and_stop_cleanly(tmp_path) -> None:
    swarm = LocalSwarm(tmp_path, run_id="diloco-test")
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "a" / "config.toml").write_text(DILOCO)
        a = swarm.start("a", ["join", "--role", "diloco", "--new-swarm"])
        wait_until(lambda: a.status()["services"]["diloco"]["hivemind_maddrs"], timeout_s=60)
        own = [m for m in a.status()["members"] if m["peer_id"] == a.peer_id][0]
        assert any("/hivemind/" in addr for addr in own["addrs"])  # in its signed advert
        (tmp_path / "b").mkdir()
        (tmp_path / "b" / "config.toml").write_text(DILOCO)  # no initial_peers: b reads a's advert
        b = swarm.start("b", ["join", "--role", "diloco", "--bootstrap", a.addr])
        # b may start after a's first round gave up waiting (a loaded machine takes its time to start
        # a node): then both trained a round alone, and their first round together may start from two
        # states (each signs its own: no agreement); the loser of the tie then takes the other's state
        wait_until(lambda: len(_agreed(a.home, b.home)) >= 2, timeout_s=180, poll_s=0.5)
        together = _together(a.home, b.home)
        for ra, rb in together:  # a round that began from one state ends in one state
            assert (ra["state_hash"] == rb["state_hash"]) == bool(ra["hash_agreement"]
                                                                  and rb["hash_agreement"]), (ra, rb)
        assert together[-1][0]["hash_agreement"]  # a disagreement was repaired, not carried on
        status = a.status()["services"]["diloco"]
        assert status["round"] >= 2 and status["last_round"]["round"] >= 1 and status["hivemind_peer"]
        assert status["state_overlay"]["published"] >= 2  # its state after each outer step, for joiners
        own = [m for m in a.status()["members"] if m["peer_id"] == a.peer_id][0]
        server = state_endpoint(a.peer_id, own["addrs"])  # its advert names its state server
        assert server is not None
        with urllib.request.urlopen(f"http://{server.host}:{server.port}/ina/v1/diloco-test/manifest", timeout=10) as r:
            signed = codec.decode(r.read(), CheckpointManifest)
        assert signed.signer_peer_id == a.peer_id and signed.message.step >= 2  # step = round, signed by a
        a_group = status["averager_pid"]  # it leads its process group (hivemind's daemons are in it)
        b_group = b.status()["services"]["diloco"]["averager_pid"]
        assert swarm.stop("a") == 0  # SIGTERM
        _gone(a_group)
        b.process.send_signal(signal.SIGINT)  # Ctrl-C
        assert b.process.wait(timeout=30) == 0
        _gone(b_group)
        assert (a.home / "diloco" / "state.safetensors").exists()
    finally:
        swarm.stop_all()


def test_demo_workload_diloco_writes_metrics_plot_and_summary(tmp_path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "demo", "--workload", "diloco",
                           "--peers", "2", "--rounds", "2", "--minutes", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "rounds" and summary["same_state_hash_there"], summary
    assert (out / "loss.png").stat().st_size > 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {line["node"] for line in lines} == {"peer0", "peer1"} and all(line["group_size"] == 2 for line in lines)
