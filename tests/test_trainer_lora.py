"""A LoRA trainer with real processes (specs/deltas.md 3a): it trains only adapters, publishes its
first checkpoint in full as the frozen base and every later step as an adapter, and the worker
builds each step from base and adapter to exactly the trainer's bytes, then generates on it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm
from tests.support.shards_swarm import shard_status
from tests.support.trainer_runs import ENV, TASKS, TIMING, trained_steps

LORA = {**ENV, "INTELLECT_NODE_TRAINER_LORA_RANK": "1", "INTELLECT_NODE_TRAINER_POLICY_DTYPE": "bfloat16"}


@pytest.fixture
def swarm(tmp_path):
    swarm = LocalSwarm(tmp_path, run_id="trainer-lora", timing=TIMING)
    yield swarm
    swarm.stop_all()


def sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.timeout(900, func_only=True)  # the body only: demo_model is built before
def test_a_lora_trainer_ships_adapters_that_workers_merge_to_its_exact_checkpoints(swarm: LocalSwarm,
                                                                                  demo_model) -> None:
    model = demo_model
    trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--model", str(model),
                                      "--tasks", TASKS, "--batch-groups", "4", "--lr", "2e-3"], LORA)
    worker = swarm.start("worker", ["join", "--role", "inference", "--bootstrap", trainer.addr,
                                    "--trainer", trainer.peer_id, "--model", str(model), "--tasks", TASKS], ENV)
    swarm.wait_until(lambda: len(trained_steps(trainer.home)) >= 3, timeout_s=400, poll_s=0.5)
    swarm.wait_until(lambda: any(held["complete"] and int(step) >= 3
                                 for step, held in shard_status(worker).get("steps", {}).items()),
                     timeout_s=120, poll_s=0.5)
    theirs, ours = shard_status(trainer), shard_status(worker)
    assert theirs["steps"]["0"]["delta_format"] is None  # the base travels once, in full
    adapter_steps = [s for s, held in ours["steps"].items() if held["delta_format"] == "lora/v1" and held["complete"]]
    assert len(adapter_steps) >= 2, ours["steps"]
    for step in adapter_steps:  # rank 1 on the tiny model's 28 linear layers: 57 KB of its 3.6 MB
        assert ours["steps"][step]["delta_size"] < ours["steps"][step]["total_size"] / 20
    # byte-identical where both still hold the step: the trainer runs ahead and prunes older steps,
    # and a file may go between reading the status and hashing it
    def compared() -> int:
        theirs, ours = shard_status(trainer), shard_status(worker)
        count = 0
        for step, held in ours.get("steps", {}).items():
            if held.get("delta_format") == "lora/v1" and held.get("complete") and step in theirs.get("steps", {}):
                try:
                    same = sha(held["path"]) == sha(theirs["steps"][step]["path"])
                except FileNotFoundError:
                    continue
                assert same, step
                count += 1
        return count
    swarm.wait_until(lambda: compared() >= 1, timeout_s=60, poll_s=0.2)
    assert ours["delta_steps"] >= 2 and ours["delta_refused"] == ours["delta_mismatch"] == 0
    assert "0" in ours["steps"]  # the base stays, however many steps came after it
    # the worker generates on the adapter steps it built
    log = (worker.home / "node.log").read_text()
    assert any(f"generating on step {step}" in log for step in adapter_steps)
