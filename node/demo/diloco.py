"""``intellect-node demo --workload diloco``: N DiLoCo nodes as processes on 127.0.0.1.

Each node is a real ``intellect-node join --role diloco`` (its own home, its own averager child);
the first starts the swarm and the others bootstrap to it and find its hivemind address in its
signed advert. The demo waits until every node has done ``rounds`` rounds (or ``minutes`` pass,
or a node dies), stops them with SIGTERM, and writes into ``out``: ``metrics.jsonl`` (every
node's round records, with the node's name), ``loss.png`` (each node's inner loss per round) and
``summary.json`` (rounds, final loss, whether every node ended at the same state hash, bytes).
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from intellect_node.node.demo.local_swarm import LocalSwarm, NodeProcess, death_report

POLL_S = 1.0


@dataclass(frozen=True)
class DilocoDemoOptions:
    peers: int = 4
    rounds: int = 10
    H: int = 20
    minutes: float = 5.0
    compression: str = "int8"
    out: Path | None = None
    batch: int = 8
    data: str = "generated:sequences=8192,seq_len=64"
    model: str = ""  # a preset name; empty: the [diloco] default
    title: str = "intellect-node demo: DiLoCo"

    def config(self) -> str:
        """Every node's ``[diloco]`` section (the same values on all, as the spec requires)."""
        # no rounds limit in the nodes: a node that stopped early would no longer serve its state
        # to a late joiner; the demo stops them all once each has done ``rounds``
        return (f"[diloco]\nH = {self.H}\nbatch = {self.batch}\ncompression = \"{self.compression}\"\n"
                f"matchmaking_s = 10.0\nround_timeout_s = 60.0\nmax_peers = {self.peers}\n"
                f"data = {json.dumps(self.data)}\n" + (f"model = {json.dumps(self.model)}\n" if self.model else ""))


def _records(node: NodeProcess) -> list[dict[str, Any]]:
    path = node.home / "diloco" / "metrics.jsonl"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line) | {"node": node.name})
        except json.JSONDecodeError:
            break  # a line being written
    return lines


def _by_round(lines: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["round"]: r for r in lines}


def common_round(by_node: dict[str, list[dict[str, Any]]]) -> int | None:
    """The newest round every node has a record of (a late joiner's records start later)."""
    rounds = [set(_by_round(lines)) for lines in by_node.values()]
    shared = set.intersection(*rounds) if rounds else set()
    return max(shared) if shared else None


def summarize(by_node: dict[str, list[dict[str, Any]]], seconds: float, stopped_by: str) -> dict[str, Any]:
    finals = {name: lines[-1] for name, lines in by_node.items() if lines}
    common = common_round(by_node)
    hashes = {_by_round(lines)[common]["state_hash"] for lines in by_node.values()} if common is not None else set()
    return {"nodes": len(by_node), "rounds_done": {n: len(lines) for n, lines in by_node.items()},
            "final_loss": {n: round(r["loss"], 4) for n, r in finals.items()},
            "newest_common_round": common, "same_state_hash_there": len(hashes) == 1,
            "solo_rounds": sum(r["solo"] for lines in by_node.values() for r in lines),
            "allreduce_bytes_per_node": {n: sum(r["allreduce_bytes"] for r in lines) for n, lines in by_node.items()},
            "seconds": round(seconds, 1), "stopped_by": stopped_by}


def write_loss_plot(by_node: dict[str, list[dict[str, Any]]], path: Path,
                    title: str = "intellect-node demo: DiLoCo") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name, lines in sorted(by_node.items()):
        axis.plot([r["round"] for r in lines], [r["loss"] for r in lines], "o-", markersize=3, label=name)
    axis.set_xlabel("outer round")
    axis.set_ylabel("mean inner loss")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper right")
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def run_diloco_demo(options: DilocoDemoOptions, log: Callable[[str], None]) -> dict[str, Any]:
    root = options.out or Path(tempfile.mkdtemp(prefix="intellect-diloco-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root / "nodes", ignore_errors=True)  # a fresh run each time: no stale checkpoint
    swarm = LocalSwarm(root / "nodes", run_id="diloco-demo")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    started, stopped_by, nodes = time.monotonic(), "ctrl-c", []
    try:
        for i in range(options.peers):
            home = root / "nodes" / f"peer{i}"
            home.mkdir(parents=True, exist_ok=True)
            (home / "config.toml").write_text(options.config())
            join = ["join", "--role", "diloco"] + (["--new-swarm"] if i == 0 else ["--bootstrap", nodes[0].addr])
            nodes.append(swarm.start(f"peer{i}", join))
            log(f"started peer{i} ({nodes[-1].peer_id[-8:]})")
        stopped_by = _watch(nodes, options, started, log)
    except KeyboardInterrupt:
        pass
    finally:
        by_node = {node.name: _records(node) for node in nodes}
        swarm.stop_all()
        signal.signal(signal.SIGTERM, previous)
    summary = summarize(by_node, time.monotonic() - started, stopped_by)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for lines in by_node.values() for r in lines))
    if any(by_node.values()):
        write_loss_plot(by_node, root / "loss.png", options.title)
    (root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    summary["out"] = str(root)
    return summary


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _watch(nodes: list[NodeProcess], options: DilocoDemoOptions, started: float, log: Callable[[str], None]) -> str:
    deadline, reported = started + options.minutes * 60, -1
    while True:
        by_node = {node.name: _records(node) for node in nodes}
        common = common_round(by_node)
        if common is not None and common > reported:
            at = {name: _by_round(lines)[common] for name, lines in by_node.items()}
            losses = " ".join(f"{name}={r['loss']:.3f}" for name, r in at.items())
            agree = len({r["state_hash"] for r in at.values()}) == 1
            log(f"round {common}: loss {losses}; state hash {'equal on all' if agree else 'DIFFERS'}")
            reported = common
        if min(len(lines) for lines in by_node.values()) >= options.rounds:
            return "rounds"
        died = death_report(nodes)
        if died:
            return died
        if time.monotonic() >= deadline:
            return "minutes"
        time.sleep(POLL_S)
