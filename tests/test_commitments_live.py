"""A live validator judges step >= 1 by the work commitments it stored before each checkpoint.

Real nodes (a publishing trainer and a validator as subprocesses, an in-process sender): a worker
that did not commit gets ``uncommitted`` for its groups; a committed worker's group is accepted
and its committed but undelivered counter settles as reward 0 when the step leaves the window; a
commitment after the checkpoint is ``late``; a second one is ``duplicate``; one above the run's
cap is ``too_many_groups``; and a crash of the validator keeps its book
(specs/rollouts.md, "Committed assignments").
"""

import hashlib
import json
import os

import pytest
import trio
from safetensors.torch import load_file, save_file

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.local_swarm import LocalSwarm
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.rollouts.exchange import deliver
from intellect_node.node.shards.store import MANIFEST_FILE
from intellect_node.node.tasks.spec import load_task_spec
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.run_spec import DEFAULT_MAX_GROUPS_PER_STEP
from intellect_node.protocol.verdicts import Verdict
from tests.support.engine_helpers import wide_tiny_model
from tests.support.inprocess_nodes import make_node

pytestmark = pytest.mark.slow
RUN = "commitments-test"
TASKS = "toy:seed=3,count=200"
TIMING = {"INTELLECT_NODE_ADVERT_LIFETIME_S": "30", "INTELLECT_NODE_ADVERT_REFRESH_S": "2",
          "INTELLECT_NODE_HEARTBEAT_S": "1", "INTELLECT_NODE_DISCOVERY_S": "2"}


@pytest.fixture
def swarm(tmp_path):
    swarm = LocalSwarm(tmp_path / "swarm", run_id=RUN, timing=TIMING)
    yield swarm
    swarm.stop_all()


def publish(publish_dir, step: int, tensors: dict) -> None:
    save_file(tensors, publish_dir / f".writing-{step}")
    os.rename(publish_dir / f".writing-{step}", publish_dir / f"step-{step}.safetensors")


def manifest_hash(home, step: int) -> bytes | None:
    for path in home.rglob(MANIFEST_FILE):
        if path.parent.name == f"{step:012d}":
            return hashlib.sha256(path.read_bytes()).digest()
    return None


def records(home) -> list[dict]:
    return [json.loads(p.read_text()) for p in (home / "verdicts").glob("*.json")]


def verdict_of(home, worker: str) -> Verdict | None:
    for record in records(home):
        if record["worker"] == worker and record["verdict"]:
            return codec.decode(bytes.fromhex(record["verdict"]), Verdict).message
    return None


def test_a_live_validator_judges_by_stored_commitments_and_settles_undelivered(swarm, tmp_path):
    model = wide_tiny_model()
    weights = load_file(model / "model.safetensors")
    publish_dir = tmp_path / "publish"
    publish_dir.mkdir()
    trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--publish-dir", str(publish_dir)])
    publish(publish_dir, 0, weights)
    validator_args = ["join", "--role", "validator", "--bootstrap", trainer.addr, "--trainer", trainer.peer_id,
                      "--model", str(model), "--tasks", TASKS, "--engine", "torch"]
    validator = swarm.start("validator", validator_args)
    swarm.wait_until(lambda: manifest_hash(validator.home, 0) is not None, timeout_s=120, poll_s=0.5)
    swarm.wait_until(lambda: "validator" in validator.status()["services"], timeout_s=120, poll_s=0.5)
    committed, idle, tardy = Identity.generate(), Identity.generate(), Identity.generate()

    def send(envelopes: list[bytes], judge) -> list[str]:
        answers = []

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                sender = make_node(tmp_path, f"sender-{len(os.listdir(tmp_path))}", RUN, bootstrap=[judge.addr])
                await nursery.start(sender.run)
                for envelope in envelopes:
                    answers.append(await deliver(sender, judge.peer_id, envelope, attempts=3))
                nursery.cancel_scope.cancel()

        trio.run(main)
        return answers

    def commitment(worker: Identity, step: int, groups: int) -> bytes:
        return codec.encode(WorkCommitment(run_id=RUN, worker=worker.peer_id, step=step, groups=groups), worker,
                            lifetime_s=600)

    # checkpoint 0 is known: step 0 is always late (warm-up), step 1 is stored, the first one stands
    assert send([commitment(committed, 0, 2), commitment(committed, 1, 2), commitment(committed, 1, 8)],
                validator) == ["late", "stored", "duplicate"]
    assert json.loads((validator.home / "commitments.jsonl").read_text().splitlines()[-1]) == [
        committed.peer_id, 1, 2]

    swarm.kill("validator")  # a crash: the book is read back from <home>/commitments.jsonl
    validator = swarm.start("validator", validator_args)
    swarm.wait_until(lambda: "validator" in validator.status()["services"], timeout_s=120, poll_s=0.5)
    weights1 = {name: t * 1.01 for name, t in weights.items()}
    publish(publish_dir, 1, weights1)
    swarm.wait_until(lambda: manifest_hash(validator.home, 1) is not None, timeout_s=120, poll_s=0.5)

    engine = TorchEngine.from_checkpoint(model)
    engine.load_state_dict(weights1)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = load_task_spec(TASKS)
    beacon = manifest_hash(validator.home, 1)

    def batch(worker: Identity) -> bytes:
        built = build_batch(engine, tokenizer, tasks, run_id=RUN, worker=worker.peer_id, step=1,
                            manifest_hash=beacon, first_counter=0, settings=RolloutShape(groups_per_batch=1))
        return codec.encode(built.batch, worker, lifetime_s=600)

    assert send([commitment(tardy, 1, 2), commitment(committed, 1, 2), batch(committed), batch(idle),
                 commitment(tardy, 2, DEFAULT_MAX_GROUPS_PER_STEP + 1)], validator) == [
        "late", "duplicate", "stored", "stored", "too_many_groups"]

    swarm.wait_until(lambda: verdict_of(validator.home, committed.peer_id) is not None
                     and verdict_of(validator.home, idle.peer_id) is not None, timeout_s=180, poll_s=1)
    paid = verdict_of(validator.home, committed.peer_id)
    assert paid is not None and [g.counter for g in paid.accepted] == [0] and not paid.rejected, paid
    unpaid = verdict_of(validator.home, idle.peer_id)
    assert unpaid is not None and not unpaid.accepted and [g.reason for g in unpaid.rejected] == ["uncommitted"]

    # step 1 leaves the async window (2) once step 4 is known: counter 1 was committed, never delivered
    for step in (2, 3, 4):
        publish(publish_dir, step, {name: t * (1 + step / 100) for name, t in weights.items()})

    def undelivered() -> list[dict]:
        return [r for r in records(validator.home) if r.get("undelivered")]

    swarm.wait_until(lambda: undelivered(), timeout_s=180, poll_s=1)
    assert [(r["worker"], r["step"], r["undelivered"], r["reward"]) for r in undelivered()] == [
        (committed.peer_id, 1, [1], 0.0)]
    status = validator.status()["services"]["validator"]
    assert status["undelivered_groups"] == 1 and status["rejected_groups"].get("uncommitted") == 1, status
    assert status["failed_batches"] == 0, status
    assert validator.status()["services"]["rollouts"]["commitments"].get("too_many_groups") == 1
