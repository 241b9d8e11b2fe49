"""A trainer whose workers' groups all teach nothing publishes bridge steps, and the workers go on.

Real processes: a trainer and a worker of the demo's tiny model on math word problems, which that
model never answers in a box (in 16 tokens), so every group's task rewards are all 0 and no group
enters the pool. Before bridge steps this run stopped for good: the worker generated only counters it had
committed, delivered them all, and waited for the next step; the trainer waited for groups. Now
the trainer publishes its weights unchanged as the next step (specs/rollouts.md, "Bridge steps"),
the worker's commitment for that step counts, and it generates and is judged there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm
from tests.support.engine_helpers import demo_tiny_model
from tests.support.trainer_runs import ENV, TIMING, read_jsonl

TASKS = "math:seed=3,count=64"
BRIDGE_AFTER_S = 3  # with a committed counter still owed: BRIDGE_OWED_FACTOR times that
RUN_ENV = {**ENV, "INTELLECT_NODE_RUN_MAX_TOKENS": "16"}  # the word problems' prompts leave the model no more


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trainer_with_nothing_to_train_on_bridges_and_its_worker_generates_on_the_bridge(tmp_path) -> None:
    model = demo_tiny_model()
    swarm = LocalSwarm(tmp_path, run_id="bridge-test", timing=TIMING)
    try:
        trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--model", str(model),
                                          "--tasks", TASKS, "--batch-groups", "4"],
                              {**RUN_ENV, "INTELLECT_NODE_TRAINER_BRIDGE_AFTER_S": str(BRIDGE_AFTER_S)})
        worker = swarm.start("worker", ["join", "--role", "inference", "--bootstrap", trainer.addr,
                                        "--trainer", trainer.peer_id, "--model", str(model), "--tasks", TASKS], RUN_ENV)
        metrics = trainer.home / "trainer" / "metrics.jsonl"

        # two bridges, and the worker's groups of the first one judged
        swarm.wait_until(lambda: sum(bool(line.get("bridge")) for line in read_jsonl(metrics)) >= 2
                         and any(record["step"] == 1 for record in verdict_records(trainer.home)),
                         timeout_s=400, poll_s=0.5)
    finally:
        swarm.stop_all()

    lines = read_jsonl(metrics)
    assert not [line for line in lines if "task_reward" in line], "a group taught something: the run is not starved"
    bridges = [line["step"] for line in lines if line.get("bridge")]
    assert bridges[:2] == [1, 2], lines
    ledger = read_jsonl(trainer.home / "trainer" / "ledger.jsonl")
    assert [e for e in ledger if e.get("bridge")][:2] == [{"step": 1, "trained": [], "bridge": True},
                                                           {"step": 2, "trained": [], "bridge": True}]

    def judged_on(step: int) -> list[dict]:
        return [record for record in verdict_records(trainer.home) if record["step"] == step]

    # the worker's groups on the bridge were accepted (not refused as uncommitted): its commitment counted
    assert any(record["accepted"] for record in judged_on(1))
    assert all(record["worker"] == worker.peer_id for record in verdict_records(trainer.home))


def verdict_records(home: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((home / "verdicts").glob("*.json"))]
