"""The validator role: judge the batches in the inbox, sign and gossip verdicts, ban proven cheats.

Batches arrive through ``RolloutReceiver`` into ``<home>/inbox``; this service is woken by its
``on_stored`` callback and, at start, takes whatever is still pending there, so a restart loses
nothing. A batch leaves the inbox only after its record (verdict envelope, or the note that it
was not sampled) is durably in ``<home>/verdicts``; those records also rebuild the seen counters.
specs/validation.md is normative.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from intellect_node.node.home.durable import write_durably
from intellect_node.node.roles.inference.builder import RolloutSettings
from intellect_node.node.roles.policy import PolicyFollower
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import (
    BatchVerdict,
    GroupResult,
    RunContext,
    batch_precheck,
    verify_batch,
)
from intellect_node.node.roles.validator.verdict_trust import (
    TrustedVerdicts,
    ban_worker,
)
from intellect_node.node.rollouts.inbox import RolloutInbox
from intellect_node.node.rollouts.run_spec import build_run_spec
from intellect_node.node.tasks.schema import Task
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.rollouts import RolloutBatch, unpack_logprobs
from intellect_node.protocol.run_spec import RunSpec
from intellect_node.protocol.verdicts import UNINFORMATIVE, AcceptedGroup, RejectedGroup, Verdict

if TYPE_CHECKING:
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
VERDICT_LIFETIME_S = 3600.0
RESCAN_S = 2.0  # deferred batches (checkpoint not here yet) are retried this often


@dataclass(frozen=True)
class ValidatorOptions:
    """What the validator role needs beyond the node (the inference flags, reused)."""

    model_dir: Path
    task_spec: str
    engine: str = "auto"
    verify_fraction: float = 1.0
    trusted: tuple[str, ...] = ()
    # a judged-hook user (the trainer) adopts trusted verdicts on unsampled batches; this long it waits
    verdict_wait_s: float = 60.0
    # check 17: groups no trainer learns from are not verified (a trainer that trusts a validator,
    # which catches cheats in them); a validator verifies every group, its verdicts are what bans
    skip_uninformative: bool = False


def load_or_create_secret(path: Path) -> bytes:
    """The local secret the sampling is drawn from; workers never see it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        secret = secrets.token_bytes(32)
        write_durably(path, secret, mode=0o600)
        return secret


def sampled(secret: bytes, digest: str, fraction: float) -> bool:
    """Whether the batch ``digest`` is verified: HMAC(secret, digest) read as a number in [0, 1)."""
    value = int.from_bytes(hmac.new(secret, digest.encode(), hashlib.sha256).digest()[:8], "big") / 2**64
    return value < fraction


JudgedHook = Callable[[str, RolloutBatch, BatchVerdict], Awaitable[None]]


def adopted_result(batch: RolloutBatch, agreed: Verdict) -> BatchVerdict:
    """An agreed trusted verdict as this node's result on ``batch``: the verdict's acceptances and
    recomputed rewards, with the worker's claimed logprobs of each accepted group.

    The claims are what the trusted validators' check 14 bounded to within the engine pair's
    ``logprob_atol`` of their own recomputation (specs/validation.md section 5), so a trainer
    can use them as the sampling policy's without a prefill of its own; recomputing them with
    its current weights instead would make the GRPO ratio blind to the rollout's lag."""
    by_counter = {group.counter: group for group in batch.groups}
    accepted = []
    for group in agreed.accepted:
        claimed = by_counter.get(group.counter)
        logprobs = () if claimed is None else tuple(
            tuple(float(x) for x in unpack_logprobs(c.logprobs)) for c in claimed.completions)
        accepted.append(GroupResult(group.counter, None, tuple(group.rewards), logprobs=logprobs))
    rejected = tuple(GroupResult(g.counter, g.reason) for g in agreed.rejected)
    return BatchVerdict(worker=batch.worker, policy_step=batch.policy_step, groups=(*accepted, *rejected),
                        completions=0)


class ValidatorService:
    """``on_judged(digest, batch, result)`` runs after a batch is verified and before it leaves the
    inbox: the trainer keeps the accepted groups there (durably), so the two steps cannot drift."""

    def __init__(self, node: NodeContext, shards: ShardService, options: ValidatorOptions, tasks: list[Task], *,
                 async_window: int = 2, run_spec: RunSpec | None = None,
                 settings: RolloutSettings | None = None, on_judged: JudgedHook | None = None) -> None:
        if not 0.0 <= options.verify_fraction <= 1.0:
            raise ValueError("verify fraction must be in [0, 1]")
        self.policy = PolicyFollower(shards, options.model_dir, options.engine)
        self.options = options
        self.tasks = tasks
        # until the overlay distributes the authority's signed spec, the run's shared settings ([run])
        spec = run_spec or build_run_spec(run_id=node.config.run_id, authority=node.peer_id, tasks=tasks,
                                          settings=settings or RolloutSettings(), async_window=async_window)
        self.run_context = RunContext(spec, tasks)
        self.inbox = RolloutInbox(node.config.layout.inbox)
        self.verdict_dir = node.config.layout.verdicts
        self.verdict_dir.mkdir(parents=True, exist_ok=True)
        self.secret = load_or_create_secret(node.config.layout.validator_secret)
        self.seen = JudgeState()
        self.on_judged = on_judged
        self.name = "validator"
        self.rows = 0
        self.seconds = 0.0
        self.accepted_groups = 0
        self.rejections: Counter[str] = Counter()  # rejected groups by reason ("stale_step" is no cheat)
        self.uninformative_groups = 0  # check 17's, with skip_uninformative
        self._wake = trio.Event()
        self._waiting_since: dict[str, float] = {}  # unsampled batches waiting for trusted verdicts
        self.adopted_batches = 0
        self.trusted_verdicts = TrustedVerdicts(node, options.trusted, own_accepted=self._own_accepted,
                                                on_verdict=lambda digest: self._wake.set())
        self.trusted_verdicts.listen()

    def status(self) -> dict[str, Any]:
        """Is this validator judging: rows verified and their rate, groups accepted, rejected by reason."""
        return {"rows_verified": self.rows, "rows_per_s": round(self.rows / self.seconds, 1) if self.seconds else 0.0,
                "accepted_groups": self.accepted_groups, "rejected_groups": dict(self.rejections),
                "uninformative_groups": self.uninformative_groups,
                "adopted_batches": self.adopted_batches, "waiting_in_inbox": len(self._waiting_since)}

    def notify(self, digest: str, signed: codec.Signed[RolloutBatch]) -> None:
        """RolloutReceiver's ``on_stored``: a new batch is in the inbox."""
        self._wake.set()

    def _load_records(self) -> None:
        for path in self.verdict_dir.glob("*.json"):
            record = json.loads(path.read_text())
            self.seen.credit(record["worker"], record["step"], record["counters"])

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.node = node
        await trio.to_thread.run_sync(self._load_records)
        engine = await self.policy.load()
        log.info("validator ready: %s engine, %d tasks, verifying %.0f%% of batches, %d pending",
                 engine.name, len(self.tasks), 100 * self.options.verify_fraction, len(self.inbox.pending()))
        task_status.started()
        while True:
            self._wake = trio.Event()
            for digest in self.inbox.pending():
                await self._handle(digest)
            with trio.move_on_after(RESCAN_S):
                await self._wake.wait()

    # ---- one batch ----------------------------------------------------------------------------

    def _step_of(self, manifest_hash: bytes) -> int | None:
        checkpoint = self.policy.checkpoint_with_manifest(manifest_hash)
        return checkpoint.step if checkpoint is not None else None

    async def _handle(self, digest: str) -> None:
        engine, tokenizer = self.policy.engine, self.policy.tokenizer
        assert engine is not None
        try:
            signed = codec.decode(self.inbox.load(digest), RolloutBatch)
        except Rejected as exc:  # expired while it waited, or a file damaged on disk
            log.warning("dropping inbox batch %s: %s", digest[:12], exc)
            self.inbox.remove(digest)
            return
        except FileNotFoundError:
            return
        batch = signed.message
        newest = self.policy.newest_known_step(self.node)
        reason = batch_precheck(batch, spec=self.run_context.spec, validator_engine=engine.name,
                                newest_step=newest, checkpoint_step_of=self._step_of)
        if reason == "unknown_checkpoint" or (reason == "stale_step" and batch.policy_step > newest):
            return  # the overlay has not brought that checkpoint yet: the batch waits in the inbox
        counters = [g.counter for g in batch.groups]
        if reason is None and min(counters) > self.seen.expected(batch.worker, batch.policy_step):
            return  # a counter gap: waits for the earlier counters until its step leaves the window
        if reason is None and not sampled(self.secret, digest, self.options.verify_fraction):
            if self.on_judged is not None and self.options.trusted:
                adopted = self._trusted_result(digest, batch)
                if adopted is None:
                    return  # waits in the inbox for a trusted verdict
                if adopted is not False:
                    self.seen.credit(batch.worker, batch.policy_step, counters)
                    self.accepted_groups += len(adopted.accepted)
                    self.adopted_batches += 1
                    await self.on_judged(digest, batch, adopted)
                    self._record(digest, batch, None)
                    return
                # conflicting verdicts, or none in time: verify it here
            else:
                self.seen.credit(batch.worker, batch.policy_step, counters)
                self._record(digest, batch, None)
                return
        checkpoint = self.policy.checkpoint_with_manifest(batch.manifest_hash)
        if reason is None and checkpoint is not None:
            await self.policy.use(checkpoint)
        # judged as the run stands now, not as it stood before the weights swap: the trainer may
        # have stepped meanwhile and the store pruned the batch's checkpoint, which must read as
        # stale_step (it aged out), never as unknown_checkpoint; and the batch's checkpoint is
        # resolved here, once, so pruning during the verification thread cannot change it either
        newest = self.policy.newest_known_step(self.node)
        resolved = {batch.manifest_hash: self._step_of(batch.manifest_hash)}

        def step_of(manifest_hash: bytes) -> int | None:
            return resolved[manifest_hash] if manifest_hash in resolved else self._step_of(manifest_hash)

        started = time.perf_counter()
        result = await trio.to_thread.run_sync(lambda: verify_batch(
            signed, engine=engine, tokenizer=tokenizer, run=self.run_context, checkpoint_step_of=step_of,
            newest_step=newest, state=self.seen, skip_uninformative=self.options.skip_uninformative))
        self.seconds += time.perf_counter() - started
        self.rows += result.completions
        self.accepted_groups += len(result.accepted)
        skipped = sum(g.reason == UNINFORMATIVE for g in result.groups)
        self.uninformative_groups += skipped  # not verified, and no rejection: nobody trains on them
        self.rejections.update(g.reason or "" for g in result.rejected if g.reason != UNINFORMATIVE)
        if self.on_judged is not None:
            await self.on_judged(digest, batch, result)
        envelope = codec.encode(self._verdict(digest, result), self.node.identity, lifetime_s=VERDICT_LIFETIME_S)
        self._record(digest, batch, envelope, (g.counter for g in result.accepted), result.credited)
        await self.node.publish_announcement(envelope)
        verdict = codec.decode(envelope, Verdict).message
        if verdict.cheats:
            ban_worker(self.node, batch.worker, f"{', '.join(verdict.cheats)} (own verdict)")
        elif result.accepted:
            self.node.connections.mark_proven(batch.worker)  # accepted work: trimmed last, off the per-IP caps
        rate = self.rows / self.seconds if self.seconds else 0.0
        log.info("verdict on %s from %s step %d: %d accepted, %d rejected %s; %.1f verified rows/s",
                 digest[:12], batch.worker, batch.policy_step, len(result.accepted), len(result.rejected),
                 sorted({g.reason for g in result.rejected}), rate)

    def _trusted_result(self, digest: str, batch: RolloutBatch) -> BatchVerdict | None | bool:
        """The agreed trusted verdict on an unsampled batch as a result; None: keep waiting;
        False: verify it here (trusted verdicts conflict, or none came within the wait)."""
        agreed = self.trusted_verdicts.agreed(digest)
        if agreed is False:
            self.trusted_verdicts.conflicts += 1
            log.warning("trusted validators disagree on batch %s: verifying it here", digest[:12])
        if agreed is None:
            first = self._waiting_since.setdefault(digest, time.monotonic())
            if time.monotonic() - first < self.options.verdict_wait_s:
                return None
            log.info("no trusted verdict on batch %s within %.0f s: verifying it here", digest[:12],
                     self.options.verdict_wait_s)
        self._waiting_since.pop(digest, None)
        if not isinstance(agreed, Verdict):
            return False
        return adopted_result(batch, agreed)

    def _own_accepted(self, digest: str) -> set[int] | None:
        """Counters this node accepted in ``digest`` by its own verification (None: not judged here)."""
        try:
            record = json.loads((self.verdict_dir / f"{digest}.json").read_text())
        except (OSError, ValueError):
            return None
        return set(record["accepted"]) if record.get("verdict") else None

    def _verdict(self, digest: str, result: BatchVerdict) -> Verdict:
        return Verdict(run_id=self.node.config.run_id, batch_digest=bytes.fromhex(digest), worker=result.worker,
                       policy_step=result.policy_step, validator=self.node.peer_id,
                       accepted=tuple(AcceptedGroup(counter=g.counter, rewards=g.rewards) for g in result.accepted),
                       rejected=tuple(RejectedGroup(counter=g.counter, reason=g.reason or "")
                                      for g in result.rejected))

    def _record(self, digest: str, batch: RolloutBatch, envelope: bytes | None, accepted: Iterable[int] = (),
                credited: Iterable[int] | None = None) -> None:
        """Durably note the batch (and its verdict), then drop it from the inbox. ``counters`` are
        those credited (all of an unjudged batch), so a restart rebuilds the same ledger."""
        counters = [g.counter for g in batch.groups] if credited is None else list(credited)
        record = {"worker": batch.worker, "step": batch.policy_step, "counters": counters,
                  "verdict": envelope.hex() if envelope is not None else None,
                  "accepted": list(accepted)}
        write_durably(self.verdict_dir / f"{digest}.json", json.dumps(record).encode())
        self.inbox.remove(digest)
