"""A store digest other than the run's is refused.

- Three real ``join --role diloco --workload metagene --reads`` nodes: two on the same reads build
  the same store and average together; the third, on other reads, has another store digest: it
  refuses the state the others serve (its log says why) and trains alone; a re-join with the same
  reads reuses the store.
- Three DiLoCo peers in one round (real averager children): a leader refuses the member whose
  run digest (model layout + data digest) differs, before any tensor moves, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm, wait_until
from intellect_node.node.diloco.client import AveragerClient
from intellect_node.node.diloco.data import CorpusSpec, generate
from intellect_node.node.diloco.peer import DilocoPeer
from intellect_node.node.metagene.presets import build_model
from intellect_node.node.metagene.synthetic import write_metagenome
from tests.diloco_helpers import DATA, MICRO, _layout, child_settings, identity, run_rounds_together, settings

pytestmark = pytest.mark.slow

CONFIG = """[diloco]
H = 2
batch = 2
matchmaking_s = 2.0
round_timeout_s = 20.0
max_peers = 3

[metagene]
vocab = 128
seq_len = 64
"""


def _rounds(home: Path) -> list[dict]:
    path = home / "diloco" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_same_reads_average_other_reads_are_refused_and_rejoining_reuses_the_store(tmp_path) -> None:
    write_metagenome(tmp_path / "shared", seed=1, organisms=2, reads_per_organism=100, genome_length=3000)
    write_metagenome(tmp_path / "other", seed=2, organisms=2, reads_per_organism=100, genome_length=3000)
    swarm = LocalSwarm(tmp_path / "nodes", run_id="metagene-join-test")
    for name in ("a", "b", "c"):
        (tmp_path / "nodes" / name).mkdir(parents=True)
        (tmp_path / "nodes" / name / "config.toml").write_text(CONFIG)

    def join(name: str, reads: str, *more: str):
        return swarm.start(name, ["join", "--role", "diloco", "--workload", "metagene", "--reads", str(tmp_path / reads), *more])

    try:
        a = join("a", "shared", "--new-swarm")
        b = join("b", "shared", "--bootstrap", a.addr)
        c = join("c", "other", "--bootstrap", a.addr)
        homes = {n.name: n.home for n in (a, b, c)}
        wait_until(lambda: all(len(_rounds(h)) >= 3 for h in homes.values()), timeout_s=240, poll_s=1.0)
        ra, rb, rc = (_rounds(homes[n]) for n in "abc")
        of_b = {r["round"]: r for r in rb}  # b joined later: it may have adopted a's state and started at its round
        together = [(x, of_b[x["round"]]) for x in ra if x["group_size"] == 2 and x["round"] in of_b]
        assert together and all(x["state_hash"] == y["state_hash"] for x, y in together), (ra, rb)
        assert all(r["solo"] for r in rc), rc
        assert "state from peers refused: a peer served the state of another model or data" in (homes["c"] / "node.log").read_text()
        stores = {n: list((h / "metagene" / "stores").iterdir()) for n, h in homes.items()}
        assert [p.name for p in stores["a"]] == [p.name for p in stores["b"]] != [p.name for p in stores["c"]]
        # a re-join with the same reads reuses the store; here into a's running home, so the node
        # itself then refuses to start twice, but the store step has run (and took no rebuild)
        again = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "join", "--role", "diloco", "--workload",
                                "metagene", "--reads", str(tmp_path / "shared"), "--home", str(homes["a"]),
                                "--run-id", swarm.run_id, "--listen", "/ip4/127.0.0.1/tcp/0"],
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 1 and "already running" in again.stderr, again.stderr[-2000:]
        assert f"metagene store reused: {stores['a'][0]}" in again.stderr.replace("\n", "")
        assert "tokenizing" not in again.stderr and len(list((homes["a"] / "metagene" / "stores").iterdir())) == 1
    finally:
        swarm.stop_all()


def _peer(tmp: Path, name: str, data_digest: bytes, initial_peers: tuple[str, ...] = ()) -> DilocoPeer:
    s = settings(round_timeout_s=15.0)
    model = build_model(MICRO, seed=0)
    child = dataclasses.replace(child_settings(s, initial_peers), data_digest=data_digest)
    client = AveragerClient(tmp / f"{name}.sock", _layout(model), child, tmp / f"{name}.log")
    client.ensure_running()
    return DilocoPeer(model, s, client, generate(CorpusSpec.parse(DATA)), identity(name), tmp / f"{name}.safetensors")


def test_a_member_with_another_data_digest_is_refused_at_matchmaking(tmp_path) -> None:
    first = _peer(tmp_path, "p0", b"S" * 32)
    peers = [first, _peer(tmp_path, "p1", b"S" * 32, tuple(first.client.maddrs)),
             _peer(tmp_path, "other", b"T" * 32, tuple(first.client.maddrs))]
    try:
        records = run_rounds_together(peers)
        assert all(not isinstance(r, BaseException) for r in records), records
        assert [r.group_size for r in records[:2]] == [2, 2], records
        assert records[0].state_hash == records[1].state_hash
        assert records[2].solo  # it averaged with nobody
        logs = "".join((tmp_path / f"{n}.log").read_text() for n in ("p0", "p1", "other"))
        assert "trains another model or other data" in logs
    finally:
        for p in peers:
            p.client.close()
