"""A worker that replaces a dead one gets the run going again through a bridge step.

Real processes: a trainer and a worker of the demo's tiny model on toy reversal, one group per
step. After three steps the worker is killed, and a new worker joins once the trainer has nothing
left to train on. The newcomer commits for the trainer's next step, as every worker does, and may
generate only counters it committed before their checkpoint existed; nobody may make a group of
the trainer's window any more (the dead worker's commitments are its own, and step 0, which needs
none, has left the window). Before bridge steps the run stopped there for good: the trainer waited
for groups, the newcomer for a step. Now the trainer publishes its weights unchanged as the next
step (specs/rollouts.md, "Bridge steps"), the newcomer's commitment for it counts, and the trainer
trains on the newcomer's groups.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm
from tests.support.trainer_runs import ENV, TASKS, TIMING, published_steps, read_jsonl, trained_steps

BRIDGE_AFTER_S = 3  # with a committed counter of the window still owed (the dead worker's): 5 times that
QUIET_S = 8.0  # the trainer's pool and step unchanged this long after the kill: nothing of the dead worker left


@pytest.mark.slow
@pytest.mark.timeout(600, func_only=True)
def test_a_newcomer_after_a_dead_worker_is_trained_on_through_a_bridge_step(tmp_path: Path, demo_model) -> None:
    model = demo_model
    swarm = LocalSwarm(tmp_path, run_id="bridge-test", timing=TIMING)
    try:
        trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--model", str(model),
                                          "--tasks", TASKS, "--batch-groups", "1"],
                              {**ENV, "INTELLECT_NODE_TRAINER_BRIDGE_AFTER_S": str(BRIDGE_AFTER_S)})
        worker_args = ["join", "--role", "inference", "--bootstrap", trainer.addr, "--trainer", trainer.peer_id,
                       "--model", str(model), "--tasks", TASKS]
        swarm.start("first", worker_args, ENV)
        swarm.wait_until(lambda: len(trained_steps(trainer.home)) >= 3, timeout_s=300, poll_s=0.5)
        swarm.kill("first")
        swarm.wait_until(quiet(trainer), timeout_s=120, poll_s=0.5)
        stalled_at = trainer.status()["services"]["trainer"]["step"]
        assert stalled_at >= 3  # step 0 has left the async window (2): every groups' step needs a commitment

        newcomer = swarm.start("newcomer", worker_args, ENV)
        swarm.wait_until(lambda: any(s > stalled_at + 1 for s in trained_steps(trainer.home)), timeout_s=240,
                         poll_s=0.5)
    finally:
        swarm.stop_all()

    lines = read_jsonl(trainer.home / "trainer" / "metrics.jsonl")
    bridges = [line["step"] for line in lines if line.get("bridge")]
    assert bridges and bridges[0] == stalled_at + 1, lines
    steps = published_steps(trainer.home)
    assert steps == list(range(1, len(steps) + 1))  # trained and bridge steps, one numbering
    ledger = read_jsonl(trainer.home / "trainer" / "ledger.jsonl")
    assert {"step": stalled_at + 1, "trained": [], "bridge": True} in ledger
    # the newcomer's groups on a bridge were accepted (not refused as uncommitted) and trained on; on the
    # first one, or, when the newcomer took longer than the bridge wait to deliver (a loaded machine: it
    # then generates on the newest checkpoint), on a later bridge its next commitment opened
    on_bridge = [r for r in _records(trainer.home) if r["worker"] == newcomer.peer_id and r["step"] in bridges]
    assert any(r["accepted"] for r in on_bridge), on_bridge
    newcomers_batches = {r["digest"] for r in _records(trainer.home) if r["worker"] == newcomer.peer_id}
    assert any(key.split(":")[0] in newcomers_batches for entry in ledger for key in entry.get("trained", []))


def quiet(trainer) -> Callable[[], bool]:
    """A predicate: the trainer's pool is empty and its step and pool unchanged for QUIET_S."""
    last: dict[str, Any] = {"seen": None, "since": 0.0}

    def check() -> bool:
        state = trainer.status()["services"]["trainer"]
        now, seen = time.monotonic(), (state["step"], state["pooled_groups"])
        if seen != last["seen"]:
            last.update(seen=seen, since=now)
        return state["pooled_groups"] == 0 and now - last["since"] >= QUIET_S

    return check


def _records(home: Path) -> list[dict]:
    """The trainer's verdict records (not its settlements of undelivered counters), with their digests."""
    return [json.loads(path.read_text()) | {"digest": path.stem}
            for path in sorted((home / "verdicts").glob("*.json")) if not path.name.startswith("undelivered-")]
