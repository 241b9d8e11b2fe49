"""The validator role: judge the batches in the inbox, sign and gossip verdicts, ban proven cheats.

Batches arrive through ``RolloutReceiver`` into ``<home>/inbox``; this service is woken by its
``on_stored`` callback and, at start, takes whatever is still pending there, so a restart loses
nothing. A batch leaves the inbox only after its record (verdict envelope, or the note that it
was not sampled) is durably in ``<home>/verdicts`` (``verdict_records``); those records also rebuild
the seen counters.
specs/validation.md is normative.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from intellect_node.node.home.durable import write_durably
from intellect_node.node.roles.policy import PolicyFollower
from intellect_node.node.roles.validator.commitments import CommitmentBook
from intellect_node.node.roles.validator.config import ValidatorOptions
from intellect_node.node.roles.validator.delivery import DeliveryLedger
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import (
    BatchVerdict,
    GroupResult,
    RunContext,
    batch_precheck,
    verify_batch,
)
from intellect_node.node.roles.validator.verdict_records import VerdictRecords, batch_record, unjudged_record
from intellect_node.node.roles.validator.verdict_trust import (
    TrustedVerdicts,
    ban_worker,
)
from intellect_node.node.rollouts.inbox import shared_inbox
from intellect_node.node.tasks.schema import Task
from intellect_node.node.tasks.verify import teaches_nothing
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import RolloutBatch, unpack_logprobs
from intellect_node.protocol.run_spec import RunSpec, build_run_spec
from intellect_node.protocol.verdicts import (
    CHEATING_BATCH,
    PROVEN_CHEATS,
    UNINFORMATIVE,
    AcceptedGroup,
    RejectedGroup,
    Verdict,
)

if TYPE_CHECKING:
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
VERDICT_LIFETIME_S = 3600.0
RESCAN_S = 2.0  # deferred batches (checkpoint not here yet) are looked at again this often
QUARANTINE_KEEP = 32  # batches whose judging failed, kept for inspection (the newest)


@dataclass(frozen=True)
class WaitingBatch:
    """What the judge keeps of a batch between looks, decoded once: the batch without its groups
    (all the batch-wide checks read), its counters and its expiry. A deferred batch is looked at
    again from this alone; the full batch is decoded a second time only when it is judged."""

    header: RolloutBatch
    counters: tuple[int, ...]
    expiry_ms: int

    @classmethod
    def of(cls, signed: codec.Signed[RolloutBatch]) -> WaitingBatch:
        batch = signed.message
        return cls(replace(batch, groups=()), tuple(g.counter for g in batch.groups), signed.envelope.expiry_ms)

    @property
    def worker(self) -> str:
        return self.header.worker


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
                 settings: RolloutShape | None = None, on_judged: JudgedHook | None = None) -> None:
        if not 0.0 <= options.verify_fraction <= 1.0:
            raise ValueError("verify fraction must be in [0, 1]")
        self.policy = PolicyFollower(shards, options.model_dir, options.engine)
        self.options = options
        self.tasks = tasks
        # until the overlay distributes the authority's signed spec, the run's shared settings ([run])
        spec = run_spec or build_run_spec(run_id=node.config.run_id, authority=node.peer_id, tasks=tasks,
                                          settings=settings or RolloutShape(), async_window=async_window)
        self.run_context = RunContext(spec, tasks)
        self.inbox = shared_inbox(node.config.layout.inbox)
        self.records = VerdictRecords(node.config.layout.verdicts)
        self.quarantine_dir = node.config.layout.quarantine
        self.inbox.judged = self._judged  # a batch delivered again after its verdict is a duplicate
        self._waiting: dict[str, WaitingBatch] = {}  # decoded once, judged later (deferred)
        self.dropped: Counter[str] = Counter()  # batches dropped unjudged: banned worker, expired
        self.failed_batches = 0  # judging raised: the batch is quarantined, its worker charged
        self.secret = load_or_create_secret(node.config.layout.validator_secret)
        # work commitments (specs/rollouts.md, "Committed assignments"): the receiver offers them here
        # who has delivery standing: what a trainer's own judge settled (specs/rollouts.md, "Delivery standing")
        self.delivery = DeliveryLedger(node.config.layout.commitments.with_name("delivery.json"), spec.delivery,
                                       spec.async_window)
        self.book = CommitmentBook(node.config.layout.commitments, max_groups=spec.max_groups_per_step,
                                   delivery=self.delivery)
        self.seen = JudgeState(commitments=self.book)
        self.undelivered_groups = 0  # committed counters settled as reward 0 (never delivered)
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
        self.trusted_verdicts = TrustedVerdicts(node, options.trusted, own_accepted=self.records.own_accepted,
                                                on_verdict=lambda digest: self._wake.set())
        self.trusted_verdicts.listen()

    def status(self) -> dict[str, Any]:
        """Is this validator judging: rows verified and their rate, groups accepted, rejected by reason."""
        return {"rows_verified": self.rows, "rows_per_s": round(self.rows / self.seconds, 1) if self.seconds else 0.0,
                "accepted_groups": self.accepted_groups, "rejected_groups": dict(self.rejections),
                "uninformative_groups": self.uninformative_groups,
                "adopted_batches": self.adopted_batches, "waiting_for_verdicts": len(self._waiting_since),
                "deferred": len(self._waiting), "dropped_batches": dict(self.dropped),
                "failed_batches": self.failed_batches, "commitments": len(self.book.groups_of),
                "undelivered_groups": self.undelivered_groups}

    def notify(self, digest: str, signed: codec.Signed[RolloutBatch]) -> None:
        """RolloutReceiver's ``on_stored``: a new batch is in the inbox."""
        self._wake.set()

    def offer_commitment(self, signed: codec.Signed[WorkCommitment]) -> str:
        """RolloutReceiver's ``on_commitment``: the book's answer, judged against the newest
        checkpoint this node knows now (held, or advertised by a trainer)."""
        return self.book.offer(signed.message, self.policy.newest_known_step(self.node))

    def _settle(self) -> None:
        """Close the steps that left the async window: each committed counter never delivered is
        recorded as a group of reward 0 (the records survive a restart, the book forgets them)."""
        self.seen.forget_before(self.policy.newest_known_step(self.node) - self.run_context.spec.async_window)
        settled, self.seen.settled = self.seen.settled, []
        for item in settled:
            self.undelivered_groups += len(item.counters)
            self.records.write_undelivered(item)

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.node = node
        for worker, why in await trio.to_thread.run_sync(self.records.load, self.seen):
            ban_worker(node, worker, f"{why} (own verdict, before a restart)")
        engine = await self.policy.load()
        log.info("validator ready: %s engine, %d tasks, verifying %.0f%% of batches, %d pending",
                 engine.name, len(self.tasks), 100 * self.options.verify_fraction, len(self.inbox.pending()))
        task_status.started()
        while True:
            self._wake = trio.Event()
            for digest in self.inbox.pending():
                await self._judge_guarded(digest)
            self._settle()
            with trio.move_on_after(RESCAN_S):
                await self._wake.wait()

    # ---- one batch ----------------------------------------------------------------------------

    async def _judge_guarded(self, digest: str) -> None:
        """``_handle`` inside a guard: whatever one batch does to the judge costs its sender, never
        the service. The batch leaves the inbox for the quarantine (so it is not judged again in
        a loop) and its worker is charged ``judge_error``."""
        try:
            await self._handle(digest)
        except Exception as exc:  # noqa: BLE001 - the guard's whole point; trio.Cancelled is a BaseException
            self.failed_batches += 1
            worker = self.inbox.worker_of(digest)
            log.exception("judging batch %s from %s failed; quarantined", digest[:12], worker)
            self._quarantine(digest)
            if worker is not None:
                self.node.scores.reject(worker, "judge_error", f"batch {digest[:12]}: {type(exc).__name__}: {exc}")

    def _quarantine(self, digest: str) -> None:
        self._forget(digest)
        try:
            self.inbox.move_out(digest, self.quarantine_dir)
            kept = sorted(self.quarantine_dir.iterdir(), key=lambda p: p.stat().st_mtime)
            for old in kept[:-QUARANTINE_KEEP]:
                old.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not quarantine batch %s: %s", digest[:12], exc)
            self.inbox.remove(digest)

    def _drop(self, digest: str, why: str) -> None:
        """Leave a batch unjudged: nothing of it is credited or used."""
        self.dropped[why] += 1
        self._forget(digest)
        self.inbox.remove(digest)

    def _forget(self, digest: str) -> None:
        """What the judge kept of a batch while it waited (its header, its wait for verdicts)."""
        self._waiting.pop(digest, None)
        self._waiting_since.pop(digest, None)

    def _decode(self, digest: str) -> codec.Signed[RolloutBatch] | None:
        try:
            return codec.decode(self.inbox.load(digest), RolloutBatch)
        except Rejected as exc:  # expired while it waited, or a file damaged on disk
            log.warning("dropping inbox batch %s: %s", digest[:12], exc)
            self._drop(digest, exc.reason)
        except FileNotFoundError:  # removed by hand: the inbox lists a batch only once its file is whole
            log.warning("dropping inbox batch %s: its file is gone", digest[:12])
            self._drop(digest, "missing")
        return None

    def _step_of(self, manifest_hash: bytes) -> int | None:
        checkpoint = self.policy.checkpoint_with_manifest(manifest_hash)
        return checkpoint.step if checkpoint is not None else None

    async def _handle(self, digest: str) -> None:
        engine = self.policy.engine
        assert engine is not None
        signed = None
        waiting = self._waiting.get(digest)
        if waiting is None:
            signed = self._decode(digest)
            if signed is None:
                return
            waiting = self._waiting[digest] = WaitingBatch.of(signed)
        if self.node.scores.is_banned_for_the_run(waiting.worker):
            self._drop(digest, "banned_worker")  # e.g. the good counter delivered beside a burnt one
            return
        if waiting.expiry_ms <= time.time() * 1000:
            self._drop(digest, "expired")
            return
        header = waiting.header
        newest = self.policy.newest_known_step(self.node)
        reason = batch_precheck(header, spec=self.run_context.spec, validator_engine=engine.name,
                                newest_step=newest, checkpoint_step_of=self._step_of)
        if reason == "unknown_checkpoint" or (reason == "stale_step" and header.policy_step > newest):
            return  # the overlay has not brought that checkpoint yet: the batch waits in the inbox
        counters = list(waiting.counters)
        if reason is None and min(counters) > self.seen.expected(header.worker, header.policy_step):
            return  # a counter gap: waits for the earlier counters until its step leaves the window
        if reason is None and not sampled(self.secret, digest, self.options.verify_fraction):
            if self.on_judged is not None and self.options.trusted:
                agreed = self._trusted_verdict(digest)
                if agreed is None:
                    return  # waits in the inbox for a trusted verdict
                if agreed is not False:
                    signed = signed or self._decode(digest)
                    if signed is None:
                        return
                    adopted = adopted_result(signed.message, agreed)
                    self.seen.credit(header.worker, header.policy_step, counters)
                    self.accepted_groups += len(adopted.accepted)
                    self.adopted_batches += 1
                    await self.on_judged(digest, signed.message, adopted)
                    self._record(digest, batch_record(signed.message, None))
                    return
                # conflicting verdicts, or none in time: verify it here
            else:
                self.seen.credit(header.worker, header.policy_step, counters)
                self._record(digest, unjudged_record(header, counters))
                return
        signed = signed or self._decode(digest)
        if signed is None:
            return
        await self._verify(digest, signed)

    async def _verify(self, digest: str, signed: codec.Signed[RolloutBatch]) -> None:
        """Judge ``signed`` with this node's own prefill, record and gossip the verdict."""
        engine, tokenizer = self.policy.engine, self.policy.tokenizer
        assert engine is not None
        batch = signed.message
        checkpoint = self.policy.checkpoint_with_manifest(batch.manifest_hash)
        if checkpoint is not None:
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
        uninformative = self._uninformative_counters(digest) if self.options.skip_uninformative else frozenset()
        result = await trio.to_thread.run_sync(lambda: verify_batch(
            signed, engine=engine, tokenizer=tokenizer, run=self.run_context, checkpoint_step_of=step_of,
            newest_step=newest, state=self.seen, uninformative=uninformative))
        result = without_cheating_batch(result)
        self.seconds += time.perf_counter() - started
        self.rows += result.completions
        self.accepted_groups += len(result.accepted)
        skipped = sum(g.reason == UNINFORMATIVE for g in result.groups)
        self.uninformative_groups += skipped  # not verified, and no rejection: nobody trains on them
        self.rejections.update(g.reason or "" for g in result.rejected if g.reason != UNINFORMATIVE)
        if self.on_judged is not None:
            await self.on_judged(digest, batch, result)
        envelope = codec.encode(self._verdict(digest, result), self.node.identity, lifetime_s=VERDICT_LIFETIME_S)
        verdict = codec.decode(envelope, Verdict).message
        self._record(digest, batch_record(batch, envelope, (g.counter for g in result.accepted), result.credited,
                                          cheats=verdict.cheats))
        await self.node.publish_announcement(envelope)
        if verdict.cheats:
            ban_worker(self.node, batch.worker, f"{', '.join(verdict.cheats)} (own verdict)")
        elif result.accepted:
            self.node.connections.mark_proven(batch.worker)  # accepted work: trimmed last, off the per-IP caps
        rate = self.rows / self.seconds if self.seconds else 0.0
        log.info("verdict on %s from %s step %d: %d accepted, %d rejected %s; %.1f verified rows/s",
                 digest[:12], batch.worker, batch.policy_step, len(result.accepted), len(result.rejected),
                 sorted({g.reason for g in result.rejected}), rate)

    def _uninformative_counters(self, digest: str) -> frozenset[int]:
        """Check 17 from an agreed trusted verdict on this batch, if one is here: the counters whose
        rewards (computed by the trusted validators on tokens they verified) are all equal. This
        node never scores, or runs, a worker's tokens it has not verified itself."""
        agreed = self.trusted_verdicts.agreed(digest)
        if not isinstance(agreed, Verdict):
            return frozenset()
        return frozenset(g.counter for g in agreed.accepted if teaches_nothing(g.rewards))

    def _trusted_verdict(self, digest: str) -> Verdict | None | bool:
        """The agreed trusted verdict on an unsampled batch; None: keep waiting; False: verify it
        here (trusted verdicts conflict, or none came within the wait)."""
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
        return agreed if isinstance(agreed, Verdict) else False

    def _judged(self, digest: str) -> bool:
        """Whether this node recorded ``digest`` (judged, passed over or adopted) or quarantined it;
        called by the inbox before it stores a delivery (``digest`` is a checked sha256 hex)."""
        return self.records.holds(digest) or self.inbox.moved_path(digest, self.quarantine_dir).exists()

    def _verdict(self, digest: str, result: BatchVerdict) -> Verdict:
        return Verdict(run_id=self.node.config.run_id, batch_digest=bytes.fromhex(digest), worker=result.worker,
                       policy_step=result.policy_step, validator=self.node.peer_id,
                       accepted=tuple(AcceptedGroup(counter=g.counter, rewards=g.rewards) for g in result.accepted),
                       rejected=tuple(RejectedGroup(counter=g.counter, reason=g.reason or "")
                                      for g in result.rejected))

    def _record(self, digest: str, record: dict[str, Any]) -> None:
        """Durably note the batch (``verdict_records``), then drop it from the inbox."""
        self.records.write(digest, record)
        self._forget(digest)
        self.inbox.remove(digest)


def without_cheating_batch(result: BatchVerdict) -> BatchVerdict:
    """A batch in which any group is a proven cheat gives nothing: its sound groups become
    ``cheating_batch`` (their counters stay credited), so burning one counter and delivering a
    good one beside it in the same batch earns nothing either."""
    if not any(g.reason in PROVEN_CHEATS for g in result.groups):
        return result
    groups = tuple(GroupResult(g.counter, CHEATING_BATCH, detail="another group of the batch is a proven cheat")
                   if g.reason is None else g for g in result.groups)
    return replace(result, groups=groups)
