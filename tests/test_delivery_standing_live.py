"""A picking cheater's groups are accepted but not trained on; an honest worker's are.

Real processes: a trainer and an honest inference worker of the demo's tiny model on toy reversal.
Beside them, in this process, a picking cheater: before each checkpoint it commits one group under
each of several fresh keys (stored: the tasks are unknown), and once the checkpoint is out it
generates each key's group on the trainer's published weights and delivers it only when some
completion scored. Its groups pass every check (they are sound work) and are accepted, but a key
made for one pick has no settled commitment while its group can be trained, so the trainer
withholds them; the honest worker's first commitments settle and its groups are trained on
(specs/rollouts.md, "Delivery standing"). Steps up to ``async_window + 1`` (3) are open to both.

Paced so that the scenario happens every time, on a fast machine and a loaded one (it raced: on a
quiet 2-core machine the trainer trained its 7 steps in 14 s before this process delivered an
accepted pick on a gated step, and the test skipped, or failed):

- the run lasts until the scenario is complete, not a fixed step count: ``PICKS`` accepted picks of
  gated steps, each followed by every step that could have trained it (``async_window + 1`` more),
  and ``LAST_STEP`` trained (the honest worker's gated groups by then). The trainer's ``--steps``
  (``MAX_STEPS``) only bounds a run where that never comes, which then fails, saying why;
- a commitment answered "early" is sent again: the trainer's judge learns of a step from the
  overlay, a moment after the trainer's status shows it, and answers "early" for a step more than
  two past what it knows; dropped, many steps had no stored key;
- a step is picked once its checkpoint is captured, not when the trainer's status reaches it (the
  overlay has it a moment later: read at once, many steps were "checkpoint gone"); of several, only
  the newest, so a slow start or a slow step never puts the cheater further behind;
- the honest worker is paced by ``--groups-per-step`` and the trainer skips its evaluations
  (``eval_tasks = 0``): unpaced, the worker filled the trainer's pool with step-0 groups while it
  evaluated, the trainer then trained steps 1-3 at once, the worker delivered nothing of step 1,
  and its share of its first settled steps stayed under ``min_share`` (no standing, bridges until
  the test timed out: bench/HISTORY.md, "Live test tests/test_delivery_standing_live.py").
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
from intellect_node.node.rollouts.exchange import DeliveryFailed, deliver
from intellect_node.node.shards.store import DATA_FILE, MANIFEST_FILE
from intellect_node.node.tasks.spec import load_task_spec
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.rollout_shape import RolloutShape
from tests.support.inprocess_nodes import make_node
from tests.support.trainer_runs import ENV, TASKS, TIMING, read_jsonl, trained_steps

RUN = "standing-test"
ASYNC_WINDOW = 2  # the run's default async level: a group of policy step s is trained in steps s+1 .. s+3
OPEN_THROUGH = ASYNC_WINDOW + 1  # no commitment can settle before step 4 is known
LAST_STEP = 7  # trained through step 7 at least: its batch takes groups of steps 4 to 6, all gated
MAX_STEPS = 30  # the trainer's bound: the scenario completes near step 10 on a quiet or a loaded machine
BATCH_GROUPS = 4
KEYS_PER_STEP = 3
PICKS = 2  # accepted picks of gated steps the scenario waits for


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
    records = []
    for path in sorted((home / "verdicts").glob("*.json")):
        if not path.name.startswith("undelivered-"):
            try:
                records.append(json.loads(path.read_text()) | {"digest": path.stem})
            except ValueError:  # being written (the run is still going): read on the next look
                pass
    return records


def accepted_picks(home: Path, cheater_keys: set[str]) -> list[int]:
    """The gated steps of the cheater's accepted picks, in order."""
    return sorted(r["step"] for r in verdict_records(home)
                  if r["worker"] in cheater_keys and r["step"] > OPEN_THROUGH and r["accepted"])


def scenario_complete(home: Path, cheater_keys: set[str]) -> bool:
    """``PICKS`` picks accepted, every step that could train them trained, and ``LAST_STEP``; or
    the trainer at its bound (the assertions then say what is missing)."""
    trained = max(trained_steps(home), default=0)
    picks = accepted_picks(home, cheater_keys)
    return trained >= MAX_STEPS or (len(picks) >= PICKS and trained >= max(LAST_STEP, picks[PICKS - 1] + OPEN_THROUGH))


@pytest.mark.slow
@pytest.mark.timeout(900, func_only=True)
def test_a_picking_cheaters_groups_are_withheld_while_an_honest_workers_are_trained(tmp_path: Path, demo_model) -> None:
    model = demo_model
    swarm = LocalSwarm(tmp_path / "swarm", run_id=RUN, timing=TIMING)
    (swarm.root / "trainer").mkdir(parents=True)
    (swarm.root / "trainer" / "config.toml").write_text("[trainer]\neval_tasks = 0\n")
    cheater_keys: set[str] = set()
    log: list[str] = []  # what the cheater did, for a failure's message
    try:
        trainer = swarm.start("trainer", ["join", "--role", "trainer", "--new-swarm", "--model", str(model), "--tasks",
                                          TASKS, "--batch-groups", str(BATCH_GROUPS), "--steps", str(MAX_STEPS)], ENV)
        honest = swarm.start("honest", ["join", "--role", "inference", "--bootstrap", trainer.addr, "--trainer",
                                        trainer.peer_id, "--model", str(model), "--tasks", TASKS,
                                        "--groups-per-step", str(BATCH_GROUPS)], ENV)
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
    assert len(accepted_picks(trainer.home, cheater_keys)) >= PICKS, (
        log, [(r["step"], r["accepted"]) for r in records if r["worker"] in cheater_keys], status)
    # ... and none of them was trained on
    assert not [d for d in gated if worker_of[d] in cheater_keys], (trained, log)
    standing = json.loads((trainer.home / "delivery.json").read_text())
    assert honest.peer_id in standing, standing


async def _cheat(tmp_path: Path, trainer, model: Path, cheater_keys: set[str], log: list[str]) -> None:
    """Commit one group under fresh keys before each checkpoint; once it is out, deliver only the
    keys whose group scored; until ``scenario_complete``."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = load_task_spec(TASKS)
    engine = TorchEngine.from_checkpoint(model)
    unanswered: dict[int, list[Identity]] = {}  # keys the trainer did not store yet ("early", or not reached)
    committed: dict[int, list[Identity]] = {}  # keys it stored, until their step is picked or passed by
    captured: dict[int, tuple[bytes, dict]] = {}
    async with trio.open_nursery() as nursery:
        # a light member: advertised as a trainer, it drew the honest worker's deliveries (each
        # failing after 5 attempts), which slowed the run until the cheater found its steps pruned
        sender = make_node(tmp_path, "cheater", RUN, bootstrap=[trainer.addr], roles=("seeder",))
        await nursery.start(sender.run)
        nursery.start_soon(_capture, trainer.home, committed, captured)
        log.append(f"ready at trainer step {await _trainer_step(trainer)}")
        with trio.fail_after(780):
            while not scenario_complete(trainer.home, cheater_keys):
                step = await _trainer_step(trainer)
                if step is None:
                    await trio.sleep(1)
                    continue
                # before its checkpoint: stored. The trainer's judge learns of a step from the overlay,
                # a moment after the trainer made it, and answers "early" for two steps past what it knows
                for target in (step + 1, step + 2):
                    if target not in unanswered and target not in committed:
                        unanswered[target] = [Identity.generate() for _ in range(KEYS_PER_STEP)]
                        cheater_keys.update(k.peer_id for k in unanswered[target])
                    if unanswered.get(target):
                        stored, unanswered[target] = await _commit(sender, trainer, target, unanswered[target], log)
                        committed.setdefault(target, []).extend(stored)
                unanswered = {s: keys for s, keys in unanswered.items() if s > step and keys}
                # due once its checkpoint is captured (the trainer's step moves before the overlay has it);
                # of several, only the newest is still in time, and one never captured is given up
                due = sorted(s for s in committed if s in captured)
                passed = due[:-1] + [s for s in committed if s not in captured and s < step - 1]
                for target in passed:
                    committed.pop(target)
                    captured.pop(target, None)
                    log.append(f"step {target}: passed by")
                if due:
                    target = due[-1]
                    await _pick(sender, trainer, engine, tokenizer, tasks, target, committed.pop(target),
                                captured.pop(target), log)
                await trio.sleep(0.2)
        nursery.cancel_scope.cancel()


async def _trainer_step(trainer) -> int | None:
    """The trainer's newest step, None while its control socket does not answer."""
    status = await trio.to_thread.run_sync(trainer.status_or_empty)
    return (status.get("services", {}).get("trainer") or {}).get("step")


async def _commit(sender, trainer, step: int, keys: list[Identity],
                  log: list[str]) -> tuple[list[Identity], list[Identity]]:
    """Commit one group of ``step`` under each of ``keys``: the keys the trainer stored, and those
    to try again (answered "early", or not reached); a key answered otherwise is dropped."""
    stored, again = [], []
    for key in keys:
        commitment = WorkCommitment(run_id=RUN, worker=key.peer_id, step=step, groups=1)
        try:
            answer = await deliver(sender, trainer.peer_id, codec.encode(commitment, key, lifetime_s=600), attempts=3)
        except DeliveryFailed as exc:
            answer = f"failed ({exc})"
        if answer == "stored":
            stored.append(key)
        elif answer == "early" or answer.startswith("failed"):
            again.append(key)
        else:
            log.append(f"step {step}: commitment {answer}")
    return stored, again


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
                found: tuple[bytes, dict], log: list[str]) -> None:
    """Generate each key's group on checkpoint ``step`` (``found``, captured when it appeared);
    deliver those in which a completion scored, while the trainer is still a step short of
    leaving ``step`` out of its window (a pick judged later is refused as stale)."""
    beacon, weights = found
    engine.load_state_dict(weights)
    for key in keys:
        now = await _trainer_step(trainer)
        if now is not None and now > step + ASYNC_WINDOW - 1:
            log.append(f"step {step}: left behind at step {now}")
            return
        built = await trio.to_thread.run_sync(lambda k=key: build_batch(
            engine, tokenizer, tasks, run_id=RUN, worker=k.peer_id, step=step, manifest_hash=beacon,
            first_counter=0, settings=RolloutShape(groups_per_batch=1)))
        if any(c.reward > 0 for c in built.batch.groups[0].completions):
            try:
                answer = await deliver(sender, trainer.peer_id, codec.encode(built.batch, key, lifetime_s=600),
                                       attempts=3)
            except DeliveryFailed as exc:
                answer = f"failed ({exc})"
            log.append(f"step {step}: delivered a pick at trainer step {now}: {answer}")
        else:
            log.append(f"step {step}: withheld a group at trainer step {now}")
