"""The trainer role as a node ``Service``: verify, pool, train, save, publish, repeat.

- Every batch delivered to ``<home>/inbox`` is judged by the same checks a validator runs (a
  ``ValidatorService`` inside the trainer, verdicts signed and gossiped), so a swarm without a
  dedicated validator is still safe. With ``verify_fraction`` < 1 the batches it does not sample
  wait for agreeing verdicts of trusted validators instead (and are verified here if those
  conflict or do not come). Accepted groups that can teach something (their task rewards
  differ) enter the durable pool; the rest are counted.
- A step takes the newest ``batch_groups`` pooled groups whose policy step is inside the async
  window (``policy_step >= step - async_level``), waiting while there are too few (but taking
  what is there once nothing it can take arrived for ``STARVED_S``); staler groups are dropped. The
  learner trains on them in a worker thread.
- A step after step 0 with nothing to train on while workers wait for it is a *bridge*: once no
  usable group arrived for ``bridge_after_s`` (``BRIDGE_OWED_FACTOR`` times that while a committed
  counter of the window is still owed), and some worker's commitment for the next step is in this
  trainer's book, the same weights are published as the next step. Workers generate a step only on the
  counters they committed before its checkpoint existed, so a trainer that got ahead of every
  commitment (resuming from its pool after an outage publishes several steps at once) or whose
  window's commitments all taught nothing would otherwise wait for groups that nobody may make
  (specs/rollouts.md, "Bridge steps").
- Held-out evaluations (at the start, then every ``eval_every`` steps or ``eval_every_s``, and of
  the last step of a ``max_steps`` run) run on a copy of the policy beside the loop
  (``BackgroundEvaluations``), each with its own line in ``metrics.jsonl`` (``eval_measured``)
  when done: the loop does not wait for them.
- Then, in this order: the ledger notes which groups the step trained on, one line goes to
  ``metrics.jsonl``, the state (weights, optimizer, step, consumed keys) is saved atomically, the
  consumed groups leave the pool, and the new weights are written to the publish directory where
  the shard overlay signs and broadcasts them. A crash between the first two and the state save
  makes the restart redo that step, so ledger and metrics may hold a step twice (the last line
  holds) but never miss one.

``ledger.jsonl`` is the audit trail of every accepted group's fate, written ahead (fsynced) of
the action it records: ``{"step": s, "trained": [keys]}`` for the groups step s trained on (a
restart that redoes step s appends a second line for it; the last one holds), and
``{"step": s, "stale": [keys], "banned": [keys]}`` for groups that aged out of the async window
unused, or whose worker was banned before they were trained on. It is what
credits workers for accepted rollouts, and what the crash tests check for lost groups.

A restart resumes from the saved state with the same step numbering; the overlay still holds the
published checkpoints, and a step whose state was saved but whose checkpoint was not yet handed
over is published again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import trio

from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.home.durable import append_durably
from intellect_node.node.roles.trainer.background_eval import BackgroundEvaluations
from intellect_node.node.roles.trainer.config import LoraConfig, TrainerOptions
from intellect_node.node.roles.trainer.evaluation import greedy_accuracy, held_out_tasks
from intellect_node.node.roles.trainer.groups import TrainingGroup
from intellect_node.node.roles.trainer.learner import GRPOLearner
from intellect_node.node.roles.trainer.lora import apply_lora
from intellect_node.node.roles.trainer.lora_publish import round_frozen_weights
from intellect_node.node.roles.trainer.pool import GroupPool
from intellect_node.node.roles.trainer.publish_checkpoint import write_checkpoint
from intellect_node.node.roles.trainer.ranks import LeadLearner, distributed, make_learner
from intellect_node.node.roles.trainer.state import load_state, save_state
from intellect_node.node.roles.validator.commitments import WARM_UP_STEP
from intellect_node.node.roles.validator.config import ValidatorOptions
from intellect_node.node.roles.validator.service import ValidatorService
from intellect_node.node.roles.validator.validation import BatchVerdict
from intellect_node.node.tasks.schema import Task
from intellect_node.node.tasks.verify import teaches_nothing
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import (
    RolloutBatch,
    unpack_tokens,
)
from intellect_node.protocol.run_spec import RunSpec
from intellect_node.protocol.verdicts import UNINFORMATIVE

if TYPE_CHECKING:
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
# a step takes the groups it has once none it can take arrived for this long: workers generate a step only on
# the counters they committed before its checkpoint existed, and when most of those teach nothing
# the commitments run out before the trainer has its batch; the workers then wait for the next
# step and the trainer for groups (seen in the demo: stuck at step 84 with 14 of 16 groups)
# a step's groups above their worker's cap (delivery standing's surplus) fill a batch once no admitted group
# arrived for this long: shorter than a worker's pacing wait (10 s), so a swarm whose workers made their
# share of a step never waits on the cap, and long against a batch's arrival, so the surplus is the last
# resort it is meant to be (specs/rollouts.md, "Delivery standing")
SURPLUS_AFTER_S = 5.0
STARVED_S = 30.0  # longer than a worker's pacing wait (10 s) and a batch of a small model
METRICS_FILE = "metrics.jsonl"
LEDGER_FILE = "ledger.jsonl"
CONSUMED_KEPT_STEPS = 8  # a re-verified batch older than this is outside any async window anyway
# a committed counter of the window still owed (a worker generating it, or gone) defers a bridge this many
# times longer: a slow honest worker's groups should not age out of the window behind bridges
BRIDGE_OWED_FACTOR = 5


@dataclass
class TrainerCounters:
    """Running totals, persisted with the state so a restart keeps counting."""

    filtered_groups: int = 0  # all-equal task rewards: accepted, or not verified (check 17)
    stale_groups: int = 0
    banned_groups: int = 0  # accepted, then dropped unused: their worker was banned in the window
    bridge_steps: int = 0  # steps published with unchanged weights (nothing to train on, workers waiting)
    train_s: float = 0.0
    wait_s: float = 0.0
    elapsed_s: float = 0.0  # wall time of the run before this process started
    last_eval: float | None = None

    def to_state(self) -> dict[str, Any]:
        return {"filtered_groups": self.filtered_groups, "stale_groups": self.stale_groups,
                "banned_groups": self.banned_groups, "bridge_steps": self.bridge_steps,
                "train_s": self.train_s, "wait_s": self.wait_s,
                "elapsed_s": self.elapsed_s,
                "last_eval": self.last_eval}


class TrainerService:
    def __init__(self, node: NodeContext, shards: ShardService, options: TrainerOptions, tasks: list[Task], *,
                 rollout: RolloutShape | None = None, run_spec: RunSpec | None = None) -> None:
        """``rollout``: the run's rollout shape ([run] max_tokens, group_size), which its own
        verification judges batches by; ``run_spec``: the spec it judges by (with the run's
        calibrated engine pairs), else one built from ``rollout`` with the torch/torch pair."""
        if shards.config.publish_dir is None:
            raise ValueError("the trainer publishes through the shard overlay: it needs a publish directory")
        self.node = node
        self.shards = shards
        self.options = options
        self.directory = node.config.layout.trainer
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pool = GroupPool(self.directory / "pool")
        self.counters = TrainerCounters()
        self.name = "trainer"
        self.consumed: dict[int, list[str]] = {}  # step -> group keys it trained on
        kinds = sorted({t.verification_info["kind"] for t in tasks if t.task_type == "toy"})
        self.eval_tasks = held_out_tasks(options.eval_tasks, kinds) if kinds else []
        # evaluations answer within the run's completion budget: the swarm never generates longer
        self.eval_max_tokens = (rollout or RolloutShape()).max_tokens
        self.evaluations = BackgroundEvaluations(self._evaluate, self._record_evaluation)
        self.validator = ValidatorService(
            node, shards, ValidatorOptions(model_dir=options.model_dir, task_spec=options.task_spec,
                                           engine=options.engine, verify_fraction=options.verify_fraction,
                                           trusted=options.trusted, skip_uninformative=bool(options.trusted)),
            tasks, async_window=options.async_level, settings=rollout, run_spec=run_spec, on_judged=self._on_judged)
        self._pool_changed = trio.Event()
        self._started = time.monotonic()
        self._first_trained_at: float | None = None  # this process's first trained step
        self._last_eval_at: float | None = None  # this process's last evaluation after a trained step
        self.learner: GRPOLearner | LeadLearner | None = None
        self.tied_embeddings = False
        self.tokenizer: Any = None
        self.lora = (LoraConfig(options.lora_rank, options.lora_alpha, options.lora_targets)
                     if options.lora_rank else None)
        self.lora_base_step: int | None = None  # the step whose checkpoint is the adapters' frozen base

    # ---- intake (the validator's hook) ------------------------------------------------------------

    async def _on_judged(self, digest: str, batch: RolloutBatch, result: BatchVerdict) -> None:
        rewards = {g.counter: g.rewards for g in result.accepted}
        # logprobs from this trainer's own verification prefill, or for an adopted verdict the
        # worker's claims that the trusted validators' check 14 bounded (validator.service.adopted_result)
        logprobs = {g.counter: g.logprobs for g in result.accepted}
        recent = {key for keys in self.consumed.values() for key in keys}
        self.counters.filtered_groups += sum(g.reason == UNINFORMATIVE for g in result.groups)  # not verified
        fresh = []
        for group in batch.groups:
            if group.counter not in rewards:
                continue
            if teaches_nothing(rewards[group.counter]):
                self.counters.filtered_groups += 1
                continue
            key = f"{digest}:{group.counter}"
            if key in recent:
                continue  # trained on already; the batch was re-verified after a crash
            fresh.append(TrainingGroup(
                key=key, worker=batch.worker, policy_step=batch.policy_step, task_id=group.task_id,
                length_target=group.length_target, prompt=tuple(unpack_tokens(group.prompt_ids).tolist()),
                completions=tuple(tuple(unpack_tokens(c.token_ids).tolist()) for c in group.completions),
                task_rewards=tuple(rewards[group.counter]),
                logprobs=logprobs[group.counter]))
        if fresh:
            await trio.to_thread.run_sync(self.pool.persist, fresh)
            self.pool.admit(fresh)
            self._pool_changed.set()

    # ---- set-up and restart ---------------------------------------------------------------------

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        options = self.options
        model = AutoModelForCausalLM.from_pretrained(options.model_dir, dtype=torch.float32)
        if self.lora is not None:
            if distributed():
                raise ValueError("LoRA runs on one trainer process (lora_rank with several ranks is not supported)")
            apply_lora(model, self.lora, seed=options.seed)
            round_frozen_weights(model, getattr(torch, options.policy_dtype))
        self.tokenizer = AutoTokenizer.from_pretrained(options.model_dir)
        reference = None
        if options.loss.kl_coef:
            reference = AutoModelForCausalLM.from_pretrained(options.model_dir, dtype=torch.float32).eval()
        self.tied_embeddings = bool(model.config.tie_word_embeddings)
        # several processes (launch.py): rank 0 leads a sharded learner, the rest follow it
        self.learner = make_learner(model, int(self.tokenizer.pad_token_id), optim=options.optim, loss=options.loss,
                                    rewards=options.rewards, reference=reference, seed=options.seed)
        state = load_state(self.directory)
        if state is not None:
            self.learner.load_state_dict(state["learner"])
            self.lora_base_step = state.get("lora_base_step")
            self.consumed = {int(k): list(v) for k, v in state["consumed"].items()}
            saved = state["counters"]
            for name, value in saved.items():
                setattr(self.counters, name, value)
        self.pool.load(key for keys in self.consumed.values() for key in keys)

    @property
    def step(self) -> int:
        assert self.learner is not None
        return self.learner.updates

    def status(self) -> dict[str, Any]:
        """Is this trainer training: its step, groups pooled, and the share of time spent waiting."""
        busy = self.counters.train_s + self.counters.wait_s
        return {"step": self.step if self.learner is not None else None, "pooled_groups": len(self.pool),
                "waiting_share": round(self.counters.wait_s / busy, 3) if busy else None,
                "filtered_groups": self.counters.filtered_groups, "stale_groups": self.counters.stale_groups,
                "bridge_steps": self.counters.bridge_steps, "last_eval": self.counters.last_eval,
                "withheld_groups": len(self.pool) - len(self.pool.newest_first(self.validator.delivery.admits)),
                "verification": self.validator.status()}

    def _write_checkpoint(self, step: int) -> None:
        """Hand the weights to the overlay (``publish_checkpoint``). Runs in a worker thread between
        steps (the weights do not change meanwhile)."""
        assert self.learner is not None
        self.lora_base_step = write_checkpoint(
            self.learner, step, self.options.publish_dir, getattr(torch, self.options.policy_dtype),
            self.shards.store, lora=self.lora, lora_base_step=self.lora_base_step,
            tied_embeddings=self.tied_embeddings)

    def _save(self) -> None:
        assert self.learner is not None
        counters = self.counters.to_state() | {"elapsed_s": self._elapsed()}
        save_state(self.directory, {"learner": self.learner.state_dict(), "consumed": self.consumed,
                                    "counters": counters, "lora_base_step": self.lora_base_step})

    def _elapsed(self) -> float:
        """Wall time of the run, across restarts (the time a crashed trainer was down excluded)."""
        return self.counters.elapsed_s + (time.monotonic() - self._started)

    # ---- the loop -------------------------------------------------------------------------------

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self._load)
        self._started = time.monotonic()
        held = max(self.shards.store.checkpoints, default=-1)
        if held < self.step:  # first start, or the last step's checkpoint never reached the overlay
            await trio.to_thread.run_sync(self._write_checkpoint, self.step)
        log.info("trainer ready at step %d: %d groups pooled, batches of %d groups, async level %d",
                 self.step, len(self.pool), self.options.batch_groups, self.options.async_level)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.validator.run, node)
            nursery.start_soon(self.evaluations.run)
            task_status.started()
            if self.counters.last_eval is None and self.eval_tasks:  # the starting point, as step 0's line
                await self.evaluations.submit_copy(self.step, self.learner.inference_model)
            while self.options.max_steps is None or self.step < self.options.max_steps:
                await self._one_step()
            if self.eval_tasks and self.evaluations.submitted_step != self.step:  # the run's last policy, measured
                await self.evaluations.submit_copy(self.step, self.learner.inference_model)
            log.info("trainer reached step %d (--steps); serving checkpoints until stopped", self.step)
            await trio.sleep_forever()

    async def _usable(self) -> tuple[list[TrainingGroup], list[TrainingGroup]]:
        """Pooled groups inside the async window, newest policy first (``GroupPool.newest_first``):
        those the delivery ledger admits (standing, and under the worker's step cap), then the
        surplus of workers whose cap is their median (specs/rollouts.md, "Delivery standing": the
        rest stay pooled); staler ones, and those of a worker banned since they were accepted (a
        cheat proven later in the same window), leave the pool (noted in the ledger first, off the
        trio loop: it fsyncs)."""
        oldest = self.step - self.options.async_level
        stale = [key for key, g in self.pool.groups.items() if g.policy_step < oldest]
        banned = [key for key, g in self.pool.groups.items()
                  if g.policy_step >= oldest and self.node.scores.is_banned_for_the_run(g.worker)]
        if stale or banned:
            self.counters.stale_groups += len(stale)
            self.counters.banned_groups += len(banned)
            await trio.to_thread.run_sync(self._write_ledger, {"step": self.step, "stale": stale, "banned": banned})
            self.pool.discard(stale + banned)
        delivery = self.validator.delivery
        return self.pool.admitted_then_surplus(delivery.admits, fills=delivery.fills)

    async def _gather(self) -> list[TrainingGroup] | None:
        """The next step's groups, or None when it is due to be a bridge step."""
        clock = ArrivalClock(time.monotonic())
        admitted_seen, admitted_at = -1, clock.since
        while True:
            self._pool_changed = trio.Event()
            admitted, surplus = await self._usable()
            now = time.monotonic()
            if len(admitted) != admitted_seen:
                admitted_seen, admitted_at = len(admitted), now
            usable = batch_candidates(admitted, surplus, now - admitted_at)
            idle_s = clock.idle_s(len(usable), now)
            take = groups_to_take(len(usable), self.options.batch_groups, idle_s, STARVED_S)
            if take:
                if take < self.options.batch_groups:
                    log.info("step %d takes %d of %d groups: no usable group arrived for %.0f s (the workers' "
                             "commitments for this step may be used up)",
                             self.step + 1, take, self.options.batch_groups, STARVED_S)
                return usable[:take]
            if not usable and bridge_due(self.step, idle_s, *self._commitments_around(), self.options.bridge_after_s):
                return None
            with trio.move_on_after(1.0):
                await self._pool_changed.wait()

    def _commitments_around(self) -> tuple[bool, int]:
        """From this trainer's own commitment book: whether some worker committed for the next step,
        and how many committed counters of the window's steps are not credited yet."""
        window = range(self.step - self.options.async_level, self.step + 1)
        return self.validator.book.has_step(self.step + 1), self.validator.seen.owed(window)

    async def _one_step(self) -> None:
        assert self.learner is not None
        waited = time.monotonic()
        groups = await self._gather()
        wait_s = time.monotonic() - waited
        if groups is None:
            await self._bridge(wait_s)
            return
        started = time.monotonic()
        metrics = await trio.to_thread.run_sync(self.learner.step, groups)
        step = self.step
        self._consume(step, [g.key for g in groups])
        now = time.monotonic()
        if self._first_trained_at is None:
            self._first_trained_at = now
        evaluated = bool(self.eval_tasks) and evaluation_due(
            step, self.options, since_eval_s=None if self._last_eval_at is None else now - self._last_eval_at,
            since_first_step_s=now - self._first_trained_at)
        if evaluated:  # measured in the background (BackgroundEvaluations): its own line when done
            await self.evaluations.submit_copy(self.step, self.learner.inference_model)
            self._last_eval_at = time.monotonic()
        train_s = time.monotonic() - started
        self.counters.train_s += train_s
        self.counters.wait_s += wait_s
        staleness = [step - 1 - g.policy_step for g in groups]
        line = {"step": step, "wall_s": round(self._elapsed(), 3), **{k: round(v, 6) for k, v in metrics.items()},
                "eval_accuracy": self.counters.last_eval, "eval_measured": False,
                "staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness),
                "train_s": round(train_s, 3), "wait_s": round(wait_s, 3),
                "utilization": round(self.counters.train_s
                                     / max(1e-9, self.counters.train_s + self.counters.wait_s), 4),
                "accepted_groups": self.validator.accepted_groups,
                "rejected_groups": sum(n for r, n in self.validator.rejections.items() if r != "stale_step"),
                "rejections": dict(self.validator.rejections),
                "adopted_batches": self.validator.adopted_batches,
                "verdict_conflicts": self.validator.trusted_verdicts.conflicts,
                "filtered_groups": self.counters.filtered_groups, "stale_groups": self.counters.stale_groups,
                "pooled_groups": len(self.pool) - len(groups)}
        await self._hand_over(step, line)
        log.info("step %d: task reward %.3f, eval %s, %d tokens, grad norm %.3f, clip %.3f, staleness %.1f, "
                 "trained %.2f s after waiting %.2f s", step, metrics["task_reward"],
                 "-" if self.counters.last_eval is None else f"{self.counters.last_eval:.3f}", int(metrics["tokens"]),
                 metrics["grad_norm"], metrics["clip_fraction"], line["staleness_mean"], train_s, wait_s)

    async def _bridge(self, wait_s: float) -> None:
        """Publish the weights unchanged as the next step (``bridge_due``): the beacon moves, so the
        workers' commitments for it count and they generate again."""
        assert self.learner is not None
        await trio.to_thread.run_sync(self.learner.bridge)
        step = self.step
        self._consume(step, [])
        self.counters.wait_s += wait_s
        self.counters.bridge_steps += 1
        log.warning("step %d is a bridge step (the weights of step %d): no group to train on for %.0f s while workers "
                    "wait to generate on it", step, step - 1, wait_s)
        await self._hand_over(step, {"step": step, "wall_s": round(self._elapsed(), 3), "bridge": True,
                                     "wait_s": round(wait_s, 3), "eval_accuracy": self.counters.last_eval,
                                     "eval_measured": False, "pooled_groups": len(self.pool)})

    def _consume(self, step: int, keys: list[str]) -> None:
        """Note the groups ``step`` trained on, at once: a batch re-verified meanwhile must not re-enter the pool."""
        self.consumed[step] = keys
        self.consumed = {s: kept for s, kept in self.consumed.items() if s > step - CONSUMED_KEPT_STEPS}

    async def _hand_over(self, step: int, line: dict[str, Any]) -> None:
        """Record ``step`` and publish it: ledger and metrics line first (a crash before the state is
        saved repeats a step's lines, never loses one), then the state, the pool, the checkpoint."""
        entry = {"step": step, "trained": self.consumed[step]} | ({"bridge": True} if line.get("bridge") else {})
        await trio.to_thread.run_sync(self._write_ledger, entry)
        await trio.to_thread.run_sync(self._append_metrics, line)
        handing_over = time.monotonic()
        await trio.to_thread.run_sync(self._save)
        self.pool.discard(self.consumed[step])
        await trio.to_thread.run_sync(self._write_checkpoint, step)
        self.counters.train_s += time.monotonic() - handing_over  # busy, not waiting: in the next line's figure

    def _write_ledger(self, entry: dict[str, Any]) -> None:
        append_durably(self.directory / LEDGER_FILE, json.dumps(entry))

    def _append_metrics(self, line: dict[str, Any]) -> None:
        """One line in one write to a file opened for appending: the loop's and the evaluations'
        lines never interleave."""
        append_durably(self.directory / METRICS_FILE, json.dumps(line))

    def _evaluate(self, model: torch.nn.Module) -> float:
        engine = TorchEngine(model, max_batch_rows=256)
        return greedy_accuracy(engine, self.tokenizer, self.eval_tasks, max_tokens=self.eval_max_tokens)

    async def _record_evaluation(self, step: int, accuracy: float) -> None:
        """An evaluation's own line: the step whose policy it measured, and when it was known."""
        self.counters.last_eval = accuracy
        await trio.to_thread.run_sync(self._append_metrics, {
            "step": step, "wall_s": round(self._elapsed(), 3), "eval_accuracy": accuracy, "eval_measured": True})
        log.info("held-out accuracy of step %d: %.3f", step, accuracy)


def evaluation_due(step: int, options: TrainerOptions, since_eval_s: float | None, since_first_step_s: float) -> bool:
    """Whether the trainer evaluates after ``step``: every ``eval_every`` steps, or once
    ``eval_every_s`` passed since the last evaluation after a trained step, or (none yet in this
    process) ``first_eval_s`` after its first trained step."""
    if step % options.eval_every == 0:
        return True
    if since_eval_s is None:
        return since_first_step_s >= options.first_eval_s
    return since_eval_s >= options.eval_every_s


def bridge_due(step: int, idle_s: float, next_step_committed: bool, owed_in_window: int,
               bridge_after_s: float) -> bool:
    """Whether a trainer at ``step`` with no usable group, none arrived for ``idle_s``, publishes a
    bridge step now: never from step 0 (its groups need no commitment: any worker may still make
    them, however slowly, so nothing waits on the trainer), only while some worker has committed for
    the next step (a trainer nobody works for has no reason to step), after ``bridge_after_s``, or
    ``BRIDGE_OWED_FACTOR`` times that while ``owed_in_window`` committed counters of the window may
    still come."""
    if step == WARM_UP_STEP or not next_step_committed:
        return False
    return idle_s >= bridge_after_s * (BRIDGE_OWED_FACTOR if owed_in_window else 1)


@dataclass
class ArrivalClock:
    """How long since a group the next step could take last arrived (``STARVED_S`` and the bridge
    wait run on it). Only those count: arrivals the step cannot take (a worker without standing
    pacing a batch every 10 s) once reset the clock on every pool change and held the demo's
    trainer 70 s at 14 of 16 groups."""

    since: float
    seen: int = -1  # usable groups at the last look

    def idle_s(self, usable: int, now: float) -> float:
        if usable > self.seen:
            self.since = now
        self.seen = usable
        return now - self.since


def batch_candidates(admitted: list[TrainingGroup], surplus: list[TrainingGroup],
                     admitted_idle_s: float) -> list[TrainingGroup]:
    """What the next step may take, in order: the admitted groups, and behind them, once no admitted
    group arrived for ``SURPLUS_AFTER_S``, the surplus of workers whose cap is their median. Without
    that, a step the admitted groups cannot fill waits while the workers, done with their share of
    it, pace one batch above their cap every 10 s, each resetting ``groups_to_take``'s starvation
    clock (the tiny demo stalled 30-170 s at a time, busy 0.30)."""
    return admitted + surplus if admitted_idle_s >= SURPLUS_AFTER_S else admitted


def groups_to_take(usable: int, batch_groups: int, idle_s: float, starved_s: float) -> int:
    """How many pooled groups the next step takes now (0: keep waiting): a full batch as soon as
    one is there; what is there (at least one group) once nothing new arrived for ``starved_s``."""
    if usable >= batch_groups:
        return batch_groups
    return usable if usable and idle_s >= starved_s else 0
