"""A picking cheater's groups are accepted but not trained on; an honest worker's are.

Real processes: a trainer and an honest inference worker of the demo's tiny model on toy reversal.
Beside them, in this process, a picking cheater: before each checkpoint it commits one group under
each of several fresh keys (stored: the tasks are unknown), and once the checkpoint is out it
generates each key's group on the trainer's published weights and delivers it only when some
completion scored. Its groups pass every check (they are sound work) and are accepted, but a key
made for one pick has no settled commitment while its group can be trained, so the trainer
withholds them; the honest worker's first commitments settle and its groups are trained on
(specs/rollouts.md, "Delivery standing"). Steps up to ``async_window + 1`` (3) are open to both.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import trio
from safetensors.torch import load_file
from transformers import AutoTokenizer

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.local_swarm import LocalSwarm
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.rollouts.exchange import deliver
from intellect_node.node.shards.store import DATA_FILE, MANIFEST_FILE
from intellect_node.node.tasks.spec import load_task_spec
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.rollout_shape import RolloutShape
from tests.support.inprocess_nodes import make_node
from tests.support.trainer_runs import ENV, TASKS, TIMING, read_jsonl, trained_steps

RUN = "standing-test"
OPEN_THROUGH = 3  # async_window (2) + 1: no commitment can settle before step 4 is known
LAST_STEP = 7  # trained through step 7: its batch takes groups of steps 5 and 6, all gated
KEYS_PER_STEP = 3


def checkpoint(home: Path, step: int) -> tuple[bytes, dict] | None:
    """The manifest hash (the beacon) and the weights of the trainer's checkpoint ``step``, or None
    when the overlay has not made it yet or pruned it."""
    for path in home.rglob(MANIFEST_FILE):
        if path.parent.name == f"{step:012d}":
            try:
                return hashlib.sha256(path.read_bytes()).digest(), load_file(path.parent / DATA_FILE)
            except OSError:
                return None
    return None


def verdict_records(home: Path) -> list[dict]:
    return [json.loads(path.read_text()) | {"digest": path.stem}
            for path in sorted((home / "verdicts").glob("*.json")) if not path.name.startswith("undelivered-")]


@pytest.mark.slow
@pytest.mark.timeout(900, func_only=True)
def test_a_picking_cheaters_groups_are_withheld_while_an_honest_workers_are_trained(tmp_path: Path, demo_model) -> None:
    model = demo_model
    swarm = LocalSwarm(tmp_path / "swarm", run_id=RUN, timing=TIMING)
    cheater_keys: set[str] = set()
    log: list[str] = []  # what the cheater did, for a failure's message
    try:
        trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--model", str(model),
                                          "--tasks", TASKS, "--batch-groups", "4", "--steps", str(LAST_STEP)], ENV)
        honest = swarm.start("honest", ["join", "--role", "inference", "--bootstrap", trainer.addr, "--trainer",
                                        trainer.peer_id, "--model", str(model), "--tasks", TASKS], ENV)
        trio.run(_cheat, tmp_path, trainer, model, cheater_keys, log)
        status = trainer.status()["services"]["trainer"]
    finally:
        swarm.stop_all()

    records = verdict_records(trainer.home)
    worker_of = {r["digest"]: r["worker"] for r in records}
    step_of = {r["digest"]: r["step"] for r in records}
    trained = [key.split(":")[0] for entry in read_jsonl(trainer.home / "trainer" / "ledger.jsonl")
               for key in entry.get("trained", [])]
    gated = [d for d in trained if step_of[d] > OPEN_THROUGH]
    # the honest worker's groups of gated steps are trained on: its first commitments settled
    assert any(worker_of[d] == honest.peer_id for d in gated), (trained, status)
    # the cheater's picks of gated steps were accepted (sound work, paid as committed) ...
    picked = [r for r in records if r["worker"] in cheater_keys and r["step"] > OPEN_THROUGH and r["accepted"]]
    if not picked:  # the scenario did not happen (the trainer ran ahead of this process): say so, visibly
        pytest.skip(f"the cheater delivered no accepted pick on a gated step, so nothing was tested: {log}; "
                    f"{[(r['step'], r['accepted']) for r in records if r['worker'] in cheater_keys]}")
    # ... and none of them was trained on
    assert not [d for d in gated if worker_of[d] in cheater_keys], trained
    standing = json.loads((trainer.home / "delivery.json").read_text())
    assert honest.peer_id in standing, standing


async def _cheat(tmp_path: Path, trainer, model: Path, cheater_keys: set[str], log: list[str]) -> None:
    """Commit one group under fresh keys before each checkpoint; after it, deliver only the keys
    whose group scored; until the trainer has trained LAST_STEP."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = load_task_spec(TASKS)
    engine = TorchEngine.from_checkpoint(model)
    committed: dict[int, list[Identity]] = {}
    captured: dict[int, tuple[bytes, dict]] = {}
    async with trio.open_nursery() as nursery:
        # a light member: advertised as a trainer, it drew the honest worker's deliveries (each
        # failing after 5 attempts), which slowed the run until the cheater found its steps pruned
        sender = make_node(tmp_path, "cheater", RUN, bootstrap=[trainer.addr], roles=("seeder",))
        await nursery.start(sender.run)
        nursery.start_soon(_capture, trainer.home, committed, captured)
        with trio.fail_after(780):
            while max(trained_steps(trainer.home), default=0) < LAST_STEP:
                status = await trio.to_thread.run_sync(trainer.status)
                step = (status["services"].get("trainer") or {}).get("step")
                if step is None:
                    await trio.sleep(1)
                    continue
                for target in (step + 1, step + 2):  # before its checkpoint: stored
                    if target not in committed:
                        keys = [Identity.generate() for _ in range(KEYS_PER_STEP)]
                        answers = [await deliver(sender, trainer.peer_id, codec.encode(
                            WorkCommitment(run_id=RUN, worker=k.peer_id, step=target, groups=1), k, lifetime_s=600),
                            attempts=3) for k in keys]
                        committed[target] = [k for k, answer in zip(keys, answers, strict=True) if answer == "stored"]
                        cheater_keys.update(k.peer_id for k in committed[target])
                for target in [s for s in sorted(committed) if s <= step]:
                    await _pick(sender, trainer, engine, tokenizer, tasks, target, committed.pop(target),
                                captured.pop(target, None), log)
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()


async def _capture(home: Path, committed: dict[int, list[Identity]], captured: dict[int, tuple[bytes, dict]]) -> None:
    """Copy each committed step's checkpoint as soon as the trainer has it: the trainer keeps only
    its newest three, and on a loaded machine it can prune one while this process is still
    generating the previous step's picks."""
    while True:
        for step in [s for s in committed if s not in captured]:
            found = checkpoint(home, step)
            if found is not None:
                captured[step] = found
        await trio.sleep(0.2)


async def _pick(sender, trainer, engine, tokenizer, tasks, step: int, keys: list[Identity],
                found: tuple[bytes, dict] | None, log: list[str]) -> None:
    """Generate each key's group on checkpoint ``step`` (``found``, captured when it appeared);
    deliver those in which a completion scored."""
    found = found or checkpoint(trainer.home, step)
    if found is None or not keys:
        log.append(f"step {step}: checkpoint gone")  # pruned: the trainer ran ahead of this process
        return
    beacon, weights = found
    engine.load_state_dict(weights)
    for key in keys:
        built = await trio.to_thread.run_sync(lambda k=key: build_batch(
            engine, tokenizer, tasks, run_id=RUN, worker=k.peer_id, step=step, manifest_hash=beacon,
            first_counter=0, settings=RolloutShape(groups_per_batch=1)))
        if any(c.reward > 0 for c in built.batch.groups[0].completions):
            answer = await deliver(sender, trainer.peer_id, codec.encode(built.batch, key, lifetime_s=600), attempts=3)
            log.append(f"step {step}: delivered a pick: {answer}")
        else:
            log.append(f"step {step}: withheld a group")
