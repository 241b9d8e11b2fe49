"""The inference role: generate rollouts on the newest verified checkpoint and deliver them.

Each round the worker takes the newest complete checkpoint the shard overlay holds, swaps the
engine's weights when it changed (tensors are mmapped views, no second copy), generates one batch
for the next dense task counters of (worker, step) in a worker thread, signs it, and delivers it to
every trainer and validator it knows. It never generates on a policy older than the newest step
advertised by the run's trainer minus the async window: it waits for the overlay instead.

Counters are persisted per step, so a restart continues where it stopped instead of reusing
counters (which validators treat as replays).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from intellect_node.crypto.toploc import DEFAULT_TOPK
from intellect_node.node.engine.base import Engine
from intellect_node.node.home.durable import write_durably
from intellect_node.node.roles.inference.builder import RolloutSettings, build_batch
from intellect_node.node.roles.policy import PolicyFollower, PolicySetupError
from intellect_node.node.rollouts.exchange import (
    RECEIVER_ROLES,
    DeliveryFailed,
    DeliveryRejected,
    deliver,
)
from intellect_node.node.tasks.schema import Task
from intellect_node.node.tasks.verify import teaches_nothing
from intellect_node.protocol import codec
from intellect_node.protocol.rollouts import RolloutAnnouncement, RolloutBatch

if TYPE_CHECKING:
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.shards.store import Checkpoint
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
BATCH_LIFETIME_S = 3600.0
ANNOUNCEMENT_LIFETIME_S = 600.0
IDLE_POLL_S = 0.5
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
                 settings: RolloutSettings | None = None, async_window: int = 2, groups_per_step: int = 0) -> None:
        self.policy = PolicyFollower(shards, model_dir, engine)
        self.tasks = tasks
        self.settings = settings or RolloutSettings()
        self.async_window = async_window
        self.groups_per_step = groups_per_step
        self.stats = WorkerStats()
        self.name = "inference"
        self._steps: dict[int, StepTally] = {}  # the policy steps inside the async window
        self._paced_step: int | None = None  # the step whose pace wait ran out (one more batch on it)

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
        return self.stats.status()

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.node = node
        self._load_counters()
        engine = await self._load_engine()
        log.info("inference worker ready: %s engine, %d tasks, model %s", engine.name, len(self.tasks),
                 self.policy.model_dir)
        task_status.started()
        while True:
            checkpoint = self._usable_checkpoint()
            if checkpoint is None:
                await trio.sleep(IDLE_POLL_S)
                continue
            if self._share_done(checkpoint.step):
                await self._pace(checkpoint.step)
                continue
            if await self.policy.use(checkpoint):
                log.info("generating on step %d", checkpoint.step)
            await self._one_batch(engine, self.policy.tokenizer, checkpoint)

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
            while (newest := self.policy.newest_complete()) is None or newest.step <= step:
                await trio.sleep(IDLE_POLL_S)
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

    async def _one_batch(self, engine: Engine, tokenizer: Any, checkpoint: Checkpoint) -> None:
        step = checkpoint.step
        tally = self._steps.get(step) or StepTally()
        first = tally.next_counter
        built = await trio.to_thread.run_sync(lambda: build_batch(
            engine, tokenizer, self.tasks, run_id=self.node.config.run_id, worker=self.node.peer_id, step=step,
            manifest_hash=hashlib.sha256(checkpoint.envelope).digest(), first_counter=first, settings=self.settings))
        informative = sum(not teaches_nothing([c.reward for c in g.completions]) for g in built.batch.groups)
        self._steps = {k: v for k, v in self._steps.items() if k >= step - self.async_window}
        self._steps[step] = StepTally(first + self.settings.groups_per_batch, tally.informative + informative)
        self._save_counters()
        self._paced_step = None
        self.stats.batches += 1
        self.stats.tokens += built.generated_tokens
        self.stats.generation_s += built.seconds
        envelope = codec.encode(built.batch, self.node.identity, lifetime_s=BATCH_LIFETIME_S)
        await self._deliver_everywhere(envelope)
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

    async def _deliver_everywhere(self, envelope: bytes) -> None:
        """Deliver to every receiver at once; with none known yet, wait for one (backpressure)."""
        receivers = self._receivers()
        while not receivers:
            await trio.sleep(IDLE_POLL_S)
            receivers = self._receivers()

        async def one(peer_id: str) -> None:
            try:
                status = await deliver(self.node, peer_id, envelope)
            except DeliveryRejected as exc:
                status = "rejected"
                log.warning("%s", exc)
            except DeliveryFailed as exc:
                status = "failed"
                log.warning("batch not delivered to %s: %s", peer_id, exc)
            self.stats.delivered[status] += 1

        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            for peer_id in receivers:
                nursery.start_soon(one, peer_id)
        log.debug("delivered to %d receivers in %.2f s", len(receivers), time.monotonic() - started)
