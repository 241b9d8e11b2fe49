"""Real processes: a trainer publishing two successive checkpoints, an inference worker and a
validator. The trainer's inbox receives valid batches for both steps, each provable only with its
own weights, and the validator signs verdicts that accept them."""

import json
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from intellect_node.crypto.toploc import verify_proofs
from intellect_node.node.demo.local_swarm import LocalSwarm
from intellect_node.node.demo.swarm import DEMO_TASKS
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.rollouts.inbox import RolloutInbox
from intellect_node.node.tasks.verify import teaches_nothing
from intellect_node.protocol import codec
from intellect_node.protocol.rollouts import RolloutBatch, proof_key, unpack_tokens
from intellect_node.protocol.verdicts import Verdict
from tests.support.engine_helpers import wide_tiny_model

pytestmark = pytest.mark.slow  # three node processes per test, and a model build

TIMING = {"INTELLECT_NODE_ADVERT_LIFETIME_S": "30", "INTELLECT_NODE_ADVERT_REFRESH_S": "5",
          "INTELLECT_NODE_HEARTBEAT_S": "1", "INTELLECT_NODE_DISCOVERY_S": "2"}


def publish(publish_dir: Path, step: int, tensors: dict) -> None:
    staging = publish_dir / f".writing-{step}"
    save_file(tensors, staging)
    os.rename(staging, publish_dir / f"step-{step}.safetensors")  # the rename hands it over


def batches_by_step(inbox_dir: Path) -> dict[int, list[RolloutBatch]]:
    found: dict[int, list[RolloutBatch]] = {}
    if not inbox_dir.exists():
        return found
    inbox = RolloutInbox(inbox_dir)
    for digest in inbox.pending():
        batch = codec.decode(inbox.load(digest), RolloutBatch).message
        found.setdefault(batch.policy_step, []).append(batch)
    return found


def proofs_hold(engine: TorchEngine, batch: RolloutBatch) -> bool:
    group = batch.groups[0]
    record = group.completions[0]
    again = engine.prefill([unpack_tokens(group.prompt_ids).tolist()], [unpack_tokens(record.token_ids).tolist()])[0]
    key = proof_key(batch.manifest_hash, batch.policy_step, group.prompt_ids, record.token_ids)
    return all(v.ok for v in verify_proofs(again.hidden_states, list(record.proofs), key=key))


@pytest.fixture
def swarm(tmp_path):
    swarm = LocalSwarm(tmp_path, run_id="inference-test", timing=TIMING)
    yield swarm
    swarm.stop_all()


def test_inference_node_produces_valid_batches_for_two_successive_checkpoints(swarm, tmp_path):
    model = wide_tiny_model()
    weights0 = load_file(model / "model.safetensors")
    weights1 = {name: t + torch.randn_like(t) * 0.3 * t.abs() for name, t in weights0.items()}
    publish_dir = tmp_path / "publish"
    publish_dir.mkdir()
    trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--publish-dir", str(publish_dir)])
    publish(publish_dir, 0, weights0)
    common = ["--bootstrap", trainer.addr, "--trainer", trainer.peer_id, "--model", str(model),
              "--tasks", "toy:seed=3,count=200", "--engine", "torch"]
    validator = swarm.start("validator", ["join", "--role", "validator", *common])
    worker = swarm.start("worker", ["join", "--role", "inference", *common])
    inbox = trainer.home / "inbox"
    swarm.wait_until(lambda: 0 in batches_by_step(inbox), timeout_s=180, poll_s=1)
    publish(publish_dir, 1, weights1)
    swarm.wait_until(lambda: 1 in batches_by_step(inbox), timeout_s=180, poll_s=1)

    received = batches_by_step(inbox)
    engine = TorchEngine.from_checkpoint(model, max_batch_rows=8)
    for step, weights in ((0, weights0), (1, weights1)):
        engine.load_state_dict(weights)
        assert all(proofs_hold(engine, batch) for batch in received[step]), f"step {step} proofs"
    assert not proofs_hold(engine, received[0][0])  # step-0 work does not pass for step-1 weights
    counters = sorted(g.counter for batch in received[0] for g in batch.groups)
    assert counters == list(range(len(counters)))  # dense within the step, never reused

    def verdicts() -> list[Verdict]:
        records = [json.loads(p.read_text()) for p in (validator.home / "verdicts").glob("*.json")]
        return [codec.decode(bytes.fromhex(r["verdict"]), Verdict).message for r in records if r["verdict"]]

    swarm.wait_until(lambda: {v.policy_step for v in verdicts()} >= {0, 1}, timeout_s=180, poll_s=1)
    assert validator.status()["services"]["rollouts"]["announced"] >= 2  # gossiped beside the delivery
    assert all(v.accepted and not v.rejected and v.validator == validator.peer_id for v in verdicts()), verdicts()
    # status answers "is each local role producing?"
    worker_status = worker.status()["services"]
    assert worker_status["inference"]["batches"] >= 2 and worker_status["inference"]["tokens_per_s"] > 0
    assert worker_status["shards"]["steps"]["1"]["complete"]
    validator_status = validator.status()["services"]["validator"]
    assert validator_status["rows_verified"] > 0 and validator_status["accepted_groups"] > 0
    assert trainer.status()["services"]["rollouts"]["received"]["stored"] >= 2


@pytest.mark.timeout(300, func_only=True)
def test_a_worker_past_its_groups_per_step_waits_for_the_next_policy(swarm, tmp_path, demo_model):
    """``--groups-per-step 1``: on step 0 the worker generates until it has one group whose
    completions scored differently (the demo's model on its reversal tasks: most groups are), then
    waits for a newer policy instead of making batches nobody would train on; a newer step ends
    the wait."""
    model = demo_model
    weights0 = load_file(model / "model.safetensors")
    publish_dir = tmp_path / "publish"
    publish_dir.mkdir()
    trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--publish-dir", str(publish_dir)])
    publish(publish_dir, 0, weights0)
    worker = swarm.start("worker", ["join", "--role", "inference", "--bootstrap", trainer.addr, "--trainer",
                                    trainer.peer_id, "--model", str(model), "--tasks", DEMO_TASKS,
                                    "--engine", "torch", "--groups-per-step", "1"])

    def inference() -> dict:
        return worker.status()["services"]["inference"]

    swarm.wait_until(lambda: inference()["paced_waits"] >= 1, timeout_s=180, poll_s=0.2)
    made = inference()["batches"]
    time.sleep(3)  # within the wait (10 s): nothing is generated
    assert inference()["batches"] == made
    informative = [g for batch in batches_by_step(trainer.home / "inbox")[0] for g in batch.groups
                   if not teaches_nothing([c.reward for c in g.completions])]
    assert informative  # what it waited on
    publish(publish_dir, 1, {name: t * 1.01 for name, t in weights0.items()})
    swarm.wait_until(lambda: 1 in batches_by_step(trainer.home / "inbox"), timeout_s=120, poll_s=0.5)
