"""Helpers for the weight broadcast's swarm tests and benchmark: a trainer that publishes through
its publish directory, fetchers that trust it, and their status files (<home>/shards/status.json)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from intellect_node.node.demo.local_swarm import LocalSwarm, NodeProcess
from intellect_node.node.shards.checkpoint import write_safetensors

# Adverts live long enough that a node busy hashing hundreds of MiB on a loaded machine does not
# drop out of its peers' member lists; discovery stays quick.
FAST = {"INTELLECT_NODE_ADVERT_LIFETIME_S": "30", "INTELLECT_NODE_ADVERT_REFRESH_S": "5",
        "INTELLECT_NODE_HEARTBEAT_S": "1", "INTELLECT_NODE_DISCOVERY_S": "2"}


def make_checkpoint(path: Path, mib: int, seed: int) -> str:
    """A safetensors file of about ``mib`` MiB of random bf16/f32 tensors; returns its sha256."""
    g = torch.Generator().manual_seed(seed)
    per = (mib << 20) // 8
    tensors = {f"model.layers.{i}.mlp.{'up' if i % 2 else 'down'}_proj.weight":
               torch.randint(0, 256, (per,), dtype=torch.uint8, generator=g).view(torch.bfloat16 if i % 2
                                                                                  else torch.float32)
               for i in range(8)}
    write_safetensors(tensors, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shard_status(node: NodeProcess) -> dict[str, Any]:
    try:
        return json.loads((node.home / "shards" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def holds(node: NodeProcess, step: int) -> bool:
    return bool(shard_status(node).get("steps", {}).get(str(step), {}).get("complete"))


def file_sha256(node: NodeProcess, step: int) -> str:
    return hashlib.sha256(Path(shard_status(node)["steps"][str(step)]["path"]).read_bytes()).hexdigest()


class ShardSwarm:
    """A trainer (origin) and fetchers as real processes on 127.0.0.1."""

    def __init__(self, root: Path, run_id: str, env: dict[str, str], timing: dict[str, str] | None = None) -> None:
        self.swarm = LocalSwarm(root, run_id=run_id, timing=FAST if timing is None else timing)
        self.env = env
        self.publish_dir = root / "publish"
        self.origin: NodeProcess | None = None

    def start_origin(self, extra_env: dict[str, str] | None = None) -> NodeProcess:
        self.origin = self.swarm.start("origin", ["join", "--role", "trainer", "--new-swarm",
                                                  "--publish-dir", str(self.publish_dir)],
                                       {**self.env, **(extra_env or {})})
        return self.origin

    def fetcher_args(self) -> list[str]:
        assert self.origin is not None
        return ["join", "--role", "inference", "--bootstrap", self.origin.addr, "--trainer", self.origin.peer_id]

    def start_fetcher(self, name: str) -> NodeProcess:
        return self.swarm.start(name, self.fetcher_args(), self.env)

    def publish(self, step: int, mib: int, seed: int) -> str:
        """Write a checkpoint into the trainer's publish directory (rename = hand-off); its sha256."""
        self.publish_dir.mkdir(parents=True, exist_ok=True)
        staging = self.publish_dir / f".writing-{step}"
        digest = make_checkpoint(staging, mib, seed)
        os.rename(staging, self.publish_dir / f"step-{step}.safetensors")
        return digest

    def fetchers(self) -> list[NodeProcess]:
        return [n for name, n in self.swarm.nodes.items() if name != "origin"]

    def stop_all(self) -> None:
        self.swarm.stop_all()
