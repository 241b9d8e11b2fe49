"""A store digest other than the run's is refused.

- Two real ``join --role diloco --workload metagene --reads`` nodes on different reads: the
  second has another store digest, so the two never share a round (a leader refuses the other at
  matchmaking, and its averager log says why); the same reads give the same store in another
  process; a re-join with the same reads reuses the store.
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
from intellect_node.node.diloco.data import generate
from intellect_node.node.diloco.data_spec import CorpusSpec
from intellect_node.node.diloco.peer import DilocoPeer
from intellect_node.node.metagene.job import MetageneJob
from intellect_node.node.metagene.prepare import prepare_store
from intellect_node.node.metagene.presets import build_model
from intellect_node.node.metagene.synthetic import write_metagenome
from tests.support.diloco_helpers import DATA, MICRO, _layout, child_settings, identity, run_rounds_together, settings

pytestmark = pytest.mark.slow

CONFIG = """[diloco]
H = 2
batch = 2
matchmaking_s = 2.0
round_timeout_s = 10.0
max_peers = 3

[metagene]
vocab = 128
seq_len = 64
"""


def _rounds(home: Path) -> list[dict]:
    path = home / "diloco" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_other_reads_are_refused_and_rejoining_reuses_the_store(tmp_path) -> None:
    write_metagenome(tmp_path / "shared", seed=1, organisms=2, reads_per_organism=100, genome_length=3000)
    write_metagenome(tmp_path / "other", seed=2, organisms=2, reads_per_organism=100, genome_length=3000)
    swarm = LocalSwarm(tmp_path / "nodes", run_id="metagene-join-test")
    for name in ("a", "c"):
        (tmp_path / "nodes" / name).mkdir(parents=True)
        (tmp_path / "nodes" / name / "config.toml").write_text(CONFIG)

    def join(name: str, reads: str, *more: str):
        return swarm.start(name, ["join", "--role", "diloco", "--workload", "metagene",
                                  "--reads", str(tmp_path / reads), *more])

    try:
        a = join("a", "shared", "--new-swarm")
        wait_until(lambda: len(_rounds(a.home)) >= 1, timeout_s=120, poll_s=1.0)  # a serves its state from now on
        c = join("c", "other", "--bootstrap", a.addr)
        wait_until(lambda: len(_rounds(c.home)) >= 2, timeout_s=180, poll_s=1.0)
        assert all(r["solo"] for r in _rounds(a.home) + _rounds(c.home))  # never one group
        # c refuses a's state (its run digest names other data), so they meet at no round; had they
        # met, a leader would have refused the other at matchmaking with the same words
        assert ("the state file is of another run: it trains another model or other data"
                in (c.home / "node.log").read_text())
        # the same reads give the same store in another process (here: this one), so peers that
        # train their own tokenizer on the same reads agree
        (store_a,) = (a.home / "metagene" / "stores").iterdir()
        mine = prepare_store([str(tmp_path / "shared")], None, tmp_path / "mine",
                             MetageneJob(("x",), vocab=128).read_options(), 128, 200_000, lambda _: None)
        assert mine.path.name == store_a.name and mine.digest.hex()[:16] in (a.home / "node.log").read_text()
        # a re-join with the same reads reuses the store; here into a's running home, so the node
        # itself then refuses to start twice, but the store step has run (and took no rebuild)
        again = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "join", "--role", "diloco",
                                "--workload", "metagene", "--reads", str(tmp_path / "shared"), "--home", str(a.home),
                                "--run-id", swarm.run_id, "--listen", "/ip4/127.0.0.1/tcp/0"],
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 1 and "already running" in again.stderr, again.stderr[-2000:]
        assert f"metagene store reused: {store_a}" in again.stderr.replace("\n", "")
        assert "tokenizing" not in again.stderr and len(list((a.home / "metagene" / "stores").iterdir())) == 1
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
