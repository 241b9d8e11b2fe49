"""A live validator, and a live trainer (which runs the same judge on what it trains on), fed
malformed but signed batches: neither stops judging.

Every hostile batch below is signed by its own fresh key, passes or fails the receiver's wire
checks as it should, and whatever reaches the judge is judged, deferred within the inbox's
bounds, or dropped; an honest batch delivered after all of them is still accepted, and the node
never restarts its judging service (specs/validation.md section 4, "Judging never stops").
"""

import dataclasses
import hashlib
import os

import pytest
import trio
from safetensors.torch import load_file, save_file

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.local_swarm import LocalSwarm
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.rollouts.exchange import DeliveryFailed, DeliveryRejected, deliver
from intellect_node.node.rollouts.inbox import InboxLimits
from intellect_node.node.shards.store import MANIFEST_FILE
from intellect_node.node.tasks.spec import load_task_spec
from intellect_node.protocol import codec
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import RolloutBatch, pack_tokens
from intellect_node.protocol.verdicts import Verdict
from tests.support.engine_helpers import wide_tiny_model
from tests.support.inprocess_nodes import make_node

pytestmark = pytest.mark.slow
RUN = "judging-test"
TASKS = "toy:seed=3,count=200"
TIMING = {"INTELLECT_NODE_ADVERT_LIFETIME_S": "30", "INTELLECT_NODE_ADVERT_REFRESH_S": "5",
          "INTELLECT_NODE_HEARTBEAT_S": "1", "INTELLECT_NODE_DISCOVERY_S": "2"}


@pytest.fixture
def swarm(tmp_path):
    swarm = LocalSwarm(tmp_path / "swarm", run_id=RUN, timing=TIMING)
    yield swarm
    swarm.stop_all()


def step_zero_manifest_hash(home) -> bytes | None:
    for path in home.rglob(MANIFEST_FILE):
        if path.parent.name == f"{0:012d}":
            return hashlib.sha256(path.read_bytes()).digest()
    return None


def hostile_batches(honest: RolloutBatch) -> dict[str, RolloutBatch]:
    """Malformed but schema-valid batches (and one empty), each field at or past what a judge
    may expect: every one built from an honest batch so that the rest of it is plausible."""
    group = honest.groups[0]
    completion = group.completions[0]
    out_of_vocab = dataclasses.replace(completion, token_ids=pack_tokens([2**32 - 1] * completion.num_tokens))
    return {
        "empty": dataclasses.replace(honest, groups=()),
        "out_of_vocabulary": dataclasses.replace(honest, groups=(dataclasses.replace(
            group, completions=(out_of_vocab, *group.completions[1:])),)),
        "counter_at_the_limit": dataclasses.replace(honest, groups=(dataclasses.replace(group, counter=2**32),)),
        "step_far_ahead": dataclasses.replace(honest, policy_step=2**40),
        "unknown_checkpoint": dataclasses.replace(honest, manifest_hash=bytes(32)),
        "a_thousand_groups": dataclasses.replace(honest, groups=tuple(
            dataclasses.replace(group, counter=i) for i in range(1024))),
        "wrong_everything": dataclasses.replace(honest, groups=tuple(
            dataclasses.replace(group, counter=i, task_id="x" * 128, length_target=1, prompt_ids=pack_tokens([0]))
            for i in range(64))),
    }


def test_a_live_validator_judges_through_hostile_batches(swarm, tmp_path):
    model = wide_tiny_model()
    publish_dir = tmp_path / "publish"
    publish_dir.mkdir()
    trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--publish-dir", str(publish_dir)])
    save_file(load_file(model / "model.safetensors"), publish_dir / ".writing")
    os.rename(publish_dir / ".writing", publish_dir / "step-0.safetensors")
    validator = swarm.start("validator", ["join", "--role", "validator", "--bootstrap", trainer.addr, "--trainer",
                                          trainer.peer_id, "--model", str(model), "--tasks", TASKS,
                                          "--engine", "torch"])
    judges_through_hostile_batches(swarm, tmp_path, validator, "validator", model,
                                   lambda: validator.status()["services"]["validator"])


def test_a_live_trainer_judges_through_hostile_batches(swarm, tmp_path):
    """The trainer runs the same ValidatorService on what it trains on: the same batches cannot
    stop its training either."""
    model = wide_tiny_model()
    trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--model", str(model),
                                      "--tasks", TASKS, "--engine", "torch"])
    judges_through_hostile_batches(swarm, tmp_path, trainer, "trainer", model,
                                   lambda: trainer.status()["services"]["trainer"]["verification"])


def judges_through_hostile_batches(swarm, tmp_path, judge, service: str, model, verification) -> None:
    """Deliver every hostile batch, a flood and then an honest batch to the live ``judge``; the honest
    batch is accepted, nothing made the judge raise, and ``service`` never restarted."""
    swarm.wait_until(lambda: step_zero_manifest_hash(judge.home) is not None, timeout_s=120, poll_s=0.5)
    swarm.wait_until(lambda: service in judge.status()["services"], timeout_s=60, poll_s=0.5)
    manifest_hash = step_zero_manifest_hash(judge.home)

    engine = TorchEngine.from_checkpoint(model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = load_task_spec(TASKS)

    def built(identity: Identity) -> RolloutBatch:
        return build_batch(engine, tokenizer, tasks, run_id=RUN, worker=identity.peer_id, step=0,
                           manifest_hash=manifest_hash, first_counter=0, settings=RolloutShape()).batch

    template = built(Identity.generate())
    hostile = {}  # each from a batch built honestly for its own key, so that only the named part is wrong
    for name in hostile_batches(template):
        key = Identity.generate()
        hostile[name] = key, hostile_batches(built(key))[name]
    outcomes: dict[str, str] = {}
    honest_key = Identity.generate()
    honest_envelope = codec.encode(built(honest_key), honest_key, lifetime_s=600)
    flood_key = Identity.generate()

    async def attack() -> None:
        async with trio.open_nursery() as nursery:
            attacker = make_node(tmp_path, "attacker", RUN, bootstrap=[judge.addr])
            await nursery.start(attacker.run)
            for name, (key, batch) in hostile.items():
                envelope = codec.encode(batch, key, lifetime_s=600)
                try:
                    outcomes[name] = await deliver(attacker, judge.peer_id, envelope, attempts=1)
                except DeliveryRejected as exc:
                    outcomes[name] = f"rejected: {exc}"
            # one worker floods batches that can never be judged: only its own share fills
            for i in range(InboxLimits().per_worker_batches + 2):
                batch = dataclasses.replace(template, worker=flood_key.peer_id, manifest_hash=bytes([i + 1]) * 32)
                try:
                    outcomes[f"flood-{i}"] = await deliver(attacker, judge.peer_id,
                                                           codec.encode(batch, flood_key, lifetime_s=600), attempts=1)
                except DeliveryFailed as exc:
                    outcomes[f"flood-{i}"] = str(exc)
            outcomes["honest"] = await deliver(attacker, judge.peer_id, honest_envelope)
            nursery.cancel_scope.cancel()

    trio.run(attack)
    assert "invalid_value" in outcomes["empty"], outcomes
    assert all(outcomes[name] == "stored" for name in hostile if name != "empty"), outcomes
    floods = [outcomes[f"flood-{i}"] for i in range(InboxLimits().per_worker_batches + 2)]
    assert floods.count("stored") == InboxLimits().per_worker_batches and "busy" in floods[-1], floods
    assert outcomes["honest"] == "stored"

    def honest_verdict() -> Verdict | None:
        for path in (judge.home / "verdicts").glob("*.json"):
            record = __import__("json").loads(path.read_text())
            if record["worker"] == honest_key.peer_id and record["verdict"]:
                return codec.decode(bytes.fromhex(record["verdict"]), Verdict).message
        return None

    swarm.wait_until(lambda: honest_verdict() is not None, timeout_s=180, poll_s=1)
    verdict = honest_verdict()
    assert verdict is not None and verdict.accepted and not verdict.rejected, verdict

    async def deliver_again() -> None:  # the worker's "stored" answer was lost: the same envelope again
        async with trio.open_nursery() as nursery:
            attacker = make_node(tmp_path, "attacker", RUN, bootstrap=[judge.addr])
            await nursery.start(attacker.run)
            outcomes["honest_again"] = await deliver(attacker, judge.peer_id, honest_envelope)
            nursery.cancel_scope.cancel()

    trio.run(deliver_again)
    assert outcomes["honest_again"] == "duplicate"  # judged once: its counters never read as replayed
    status = verification()
    assert status["failed_batches"] == 0, status  # nothing above made the judge raise
    rejected = status["rejected_groups"]
    assert rejected.get("bad_tokens") == 1, rejected
    assert rejected.get("wrong_task", 0) >= 1, rejected
    # the far-ahead step, the unknown checkpoints and the counter gap wait, decoded once
    assert status["deferred"] >= 3 + InboxLimits().per_worker_batches, status
    assert judge.process.poll() is None
    assert judge.status()["supervisor"][service]["restarts"] == 0
