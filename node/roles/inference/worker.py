"""The inference role: generate rollouts on the newest verified checkpoint and deliver them.

Each round the worker takes the newest complete checkpoint the shard overlay holds, swaps the
engine's weights when it changed (tensors are mmapped views, no second copy), generates one batch
for the next dense task counters of (worker, step) in a worker thread, signs it, and delivers it to
every trainer and validator it knows. It never generates on a policy older than the newest step
advertised by the run's trainer minus the async window: it waits for the overlay instead.

Counters are persisted per step, so a restart continues where it stopped instead of reusing
counters (which validators treat as replays).

Commitments (specs/rollouts.md, "Committed assignments"): as soon as the worker holds checkpoint
``s`` it commits for ``s + 1`` to every judge it delivers to, before anyone knows that step's
tasks, and it generates on a step >= 1 only the counters some judge stored a commitment for. When
it learned of the newest step too late to commit for it, it generates the committed counters of an
older step of the window instead of waiting for a step that needs its groups first.
Step 0 is warm-up (no commitment can precede it) and is paced by ``groups_per_step`` alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from intellect_node.crypto.toploc import DEFAULT_TOPK
from intellect_node.node.engine.base import Engine
from intellect_node.node.home.durable import write_durably
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.roles.inference.commitments import CommitmentPlan
from intellect_node.node.roles.inference.dispatch import Dispatch
from intellect_node.node.roles.policy import PolicyFollower, PolicySetupError
from intellect_node.node.rollouts.exchange import RECEIVER_ROLES
from intellect_node.node.tasks.schema import Task
from intellect_node.node.tasks.verify import teaches_nothing
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import RolloutAnnouncement, RolloutBatch

if TYPE_CHECKING:
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.shards.store import Checkpoint
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
BATCH_LIFETIME_S = 3600.0
ANNOUNCEMENT_LIFETIME_S = 600.0
IDLE_POLL_S = 0.5
COMMITMENT_LIFETIME_S = 3600.0
PACE_WAIT_S = 10.0  # a worker past its groups_per_step waits this long for a newer policy, then generates one batch


class WorkerSetupError(Exception):
    """The worker cannot start (model, engine); the message says what to fix."""


@dataclass
class WorkerStats:
    batches: int = 0
    tokens: int = 0
    generation_s: float = 0.0
    paced: int = 0  # waits for a newer policy after groups_per_step on one step
    delivered: dict[str, int] = field(default_factory=lambda: {"stored": 0, "duplicate": 0, "rejected": 0, "failed": 0})

    def status(self) -> dict[str, Any]:
        """Is this worker producing: batches, tokens/s of generation, delivery outcomes."""
        rate = self.tokens / self.generation_s if self.generation_s else 0.0
        return {"batches": self.batches, "tokens": self.tokens, "tokens_per_s": round(rate, 1),
                "paced_waits": self.paced, "delivered": dict(self.delivered)}

    def line(self, step: int) -> str:
        rate = self.tokens / self.generation_s if self.generation_s else 0.0
        d = self.delivered
        return (f"step {step}: {rate:,.0f} tokens/s, {self.batches} batches; delivered {d['stored']} "
                f"(+{d['duplicate']} dup), rejected {d['rejected']}, undelivered {d['failed']}")


@dataclass(frozen=True)
class StepTally:
    """What this worker made on one policy step: the next batch's first group counter (persisted:
    counters never repeat across restarts, check 6) and the groups whose completions scored
    differently (the pace counts those; lost on restart, which costs at most one step's share)."""

    next_counter: int = 0
    informative: int = 0


class InferenceWorker:
    def __init__(self, shards: ShardService, model_dir: Path, tasks: list[Task], *, engine: str = "auto",
                 settings: RolloutShape | None = None, async_window: int = 2, groups_per_step: int = 0) -> None:
        self.policy = PolicyFollower(shards, model_dir, engine)
        self.tasks = tasks
        self.settings = settings or RolloutShape()
        self.async_window = async_window
        self.groups_per_step = groups_per_step
        self.stats = WorkerStats()
        self.name = "inference"
        self._steps: dict[int, StepTally] = {}  # the policy steps inside the async window
        self._paced_step: int | None = None  # the step whose pace wait ran out (one more batch on it)
        self.commitments = CommitmentPlan(self.settings.groups_per_batch, groups_per_step, async_window)
        self.dispatch: Dispatch | None = None  # made once the node runs

    # ---- setup -------------------------------------------------------------------------------

    async def _load_engine(self) -> Engine:
        try:
            engine = await self.policy.load()
        except PolicySetupError as exc:
            raise WorkerSetupError(str(exc)) from None
        if engine.hidden_size < DEFAULT_TOPK:
            raise WorkerSetupError(f"hidden size {engine.hidden_size} is below TOPLOC's top-k {DEFAULT_TOPK}: "
                                   "a one-token chunk could not be proven")
        return engine

    @property
    def _state_path(self) -> Path:
        return self.node.config.layout.inference_counters

    def _load_counters(self) -> None:
        try:
            data = json.loads(self._state_path.read_text())
            self._steps = {int(k): StepTally(next_counter=int(v)) for k, v in data.items()}
        except FileNotFoundError:
            self._steps = {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise WorkerSetupError(f"{self._state_path} is corrupt ({exc}); remove it to start counting at 0") from None

    def _save_counters(self) -> None:
        counters = {str(step): tally.next_counter for step, tally in self._steps.items()}
        write_durably(self._state_path, json.dumps(counters).encode())

    def status(self) -> dict[str, Any]:
        outbox = self.dispatch.status() if self.dispatch is not None else {}
        return {**self.stats.status(), "commitments": dict(self.commitments.answers), "outbox": outbox}

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.node = node
        self.dispatch = Dispatch(node, self._receivers,
                                 lambda: self.policy.newest_known_step(node) - self.async_window, self.stats.delivered)
        self._load_counters()
        engine = await self._load_engine()
        log.info("inference worker ready: %s engine, %d tasks, model %s", engine.name, len(self.tasks),
                 self.policy.model_dir)
        task_status.started()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.dispatch.run)
            await self._generate_forever(engine)

    async def _generate_forever(self, engine: Engine) -> None:
        while True:
            newest = self._usable_checkpoint()
            if newest is None:
                await trio.sleep(IDLE_POLL_S)
                continue
            await self._commit_ahead(newest.step)
            checkpoint = self._checkpoint_to_generate_on(newest)
            tally = self._steps.get(checkpoint.step) or StepTally()
            covered = self.commitments.covered(checkpoint.step, tally.next_counter)
            if covered == 0 or self._share_done(checkpoint.step):
                await self._pace(checkpoint.step)
                continue
            if await self.policy.use(checkpoint):
                log.info("generating on step %d", checkpoint.step)
            groups = self.settings.groups_per_batch if covered is None else min(self.settings.groups_per_batch, covered)
            await self._one_batch(engine, self.policy.tokenizer, checkpoint, groups)

    async def _commit_ahead(self, held: int) -> None:
        """Commit for the step after the newest one this node knows to every judge this worker
        delivers to that was not sent it yet (one that joined later gets it too; one not reached
        is tried again after a while), for the next two steps."""
        step = max(held, self.policy.newest_known_step(self.node)) + 1
        self.commitments.forget_before(held - self.async_window)
        made_before = (self._steps.get(held - 1) or StepTally()).next_counter
        # the next two steps (a judge stores up to two ahead of what it knows): the trainer often
        # publishes step + 1 before this worker holds step, which would make a commitment for it late
        for target in (step, step + 1):
            judges = self.commitments.to_send(target, self._receivers(), self.commitments.size(held, made_before))
            if judges:
                commitment = WorkCommitment(run_id=self.node.config.run_id, worker=self.node.peer_id, step=target,
                                            groups=self.commitments.steps[target].groups)
                envelope = codec.encode(commitment, self.node.identity, lifetime_s=COMMITMENT_LIFETIME_S)
                assert self.dispatch is not None
                for judge, answer in (await self.dispatch.send(envelope, judges)).items():
                    self.commitments.answered(target, judge, answer)
                log.info("commitment of %d groups for step %d: %s", commitment.groups, target,
                         self.commitments.steps[target].answers)

    def _checkpoint_to_generate_on(self, newest: Checkpoint) -> Checkpoint:
        """``newest``, or an older checkpoint of the window when this worker missed committing
        for ``newest`` (CommitmentPlan.step_to_generate says when and why)."""
        held = {c.step: c for c in self.policy.complete_since(self.policy.newest_known_step(self.node)
                                                              - self.async_window)}  # newest among them
        step = self.commitments.step_to_generate(
            sorted(held, reverse=True), lambda s: (self._steps.get(s) or StepTally()).next_counter, self._share_done)
        if step != newest.step and step != self.policy.loaded_step:
            log.info("no commitment of this worker stands for step %d: generating its committed groups of step %d",
                     newest.step, step)
        return held[step]

    def _share_done(self, step: int) -> bool:
        """This worker generated ``groups_per_step`` informative groups on ``step`` (and the pace
        wait did not just end: then it generates one more batch). Only groups whose completions
        scored differently count: the others teach nothing, and how many those are depends on how
        well the policy does, so a count of all groups would starve the trainer early in a run."""
        tally = self._steps.get(step)
        done = bool(self.groups_per_step) and tally is not None and tally.informative >= self.groups_per_step
        return done and self._paced_step != step

    async def _pace(self, step: int) -> None:
        """Wait up to PACE_WAIT_S for a policy newer than ``step``. Groups beyond the trainer's need
        arrive stale, and every verifier pays for them; but a trainer that still needs this
        step's groups (many taught nothing) gets one more batch after each wait, never a stall."""
        self.stats.paced += 1
        with trio.move_on_after(PACE_WAIT_S):
            await self.policy.wait_complete_after(step)
            return
        self._paced_step = step

    def _usable_checkpoint(self) -> Checkpoint | None:
        """The newest complete checkpoint, unless it is older than the async window allows."""
        checkpoint = self.policy.newest_complete()
        if checkpoint is None:
            return None
        if checkpoint.step < self.policy.newest_known_step(self.node) - self.async_window:
            return None  # too stale to be trained on: wait for the overlay to bring a newer one
        return checkpoint

    async def _one_batch(self, engine: Engine, tokenizer: Any, checkpoint: Checkpoint, groups: int) -> None:
        step = checkpoint.step
        tally = self._steps.get(step) or StepTally()
        first = tally.next_counter
        settings = replace(self.settings, groups_per_batch=groups)
        built = await trio.to_thread.run_sync(lambda: build_batch(
            engine, tokenizer, self.tasks, run_id=self.node.config.run_id, worker=self.node.peer_id, step=step,
            manifest_hash=hashlib.sha256(checkpoint.envelope).digest(), first_counter=first, settings=settings))
        informative = sum(not teaches_nothing([c.reward for c in g.completions]) for g in built.batch.groups)
        self._steps = {k: v for k, v in self._steps.items() if k >= step - self.async_window}
        self._steps[step] = StepTally(first + groups, tally.informative + informative)
        self._save_counters()
        self._paced_step = None
        self.stats.batches += 1
        self.stats.tokens += built.generated_tokens
        self.stats.generation_s += built.seconds
        envelope = codec.encode(built.batch, self.node.identity, lifetime_s=BATCH_LIFETIME_S)
        assert self.dispatch is not None
        await self.dispatch.batch(envelope, step)
        await self._announce(built.batch, envelope)
        log.info("%s", self.stats.line(step))

    async def _announce(self, batch: RolloutBatch, envelope: bytes) -> None:
        announcement = RolloutAnnouncement(
            run_id=batch.run_id, worker=batch.worker, policy_step=batch.policy_step,
            batch_digest=hashlib.sha256(envelope).digest(), groups=len(batch.groups),
            completions=sum(len(g.completions) for g in batch.groups))
        try:
            await self.node.announce(announcement, lifetime_s=ANNOUNCEMENT_LIFETIME_S)
        except Exception as exc:  # gossip is best effort; the batch itself was delivered
            log.debug("announcement failed: %s", exc)

    def _receivers(self) -> list[str]:
        return [m.advert.peer_id for m in self.node.view.members()
                if m.advert.peer_id != self.node.peer_id and RECEIVER_ROLES & set(m.advert.roles)]
