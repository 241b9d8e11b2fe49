"""Verdict: a validator's signed judgement of one rollout batch, gossiped on the announcements topic.

A verdict names the batch by the sha256 of its envelope instead of carrying it (gossip drops
messages above about 1 MiB, a batch can be 16 MiB), so it stays a few hundred bytes for a normal
batch. Anyone holding the batch can re-check a rejection whose reason is a proven cheat: those
reasons depend only on the signed batch, the public assignment and the checkpoint.
specs/validation.md is normative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from intellect_node.protocol.errors import InvalidValue, SignerMismatch
from intellect_node.protocol.messages import PEER_ID_PATTERN, RUN_ID_PATTERN, Message
from intellect_node.protocol.schema import (
    Bytes,
    Float,
    Int,
    ListOf,
    Nested,
    Record,
    Str,
    wire,
)

# Check 17's reason: a group skipped unverified by a trainer that trusts a validator, because its
# completions all scored alike and no GRPO step learns from it; not a rejection of the worker.
UNINFORMATIVE = "uninformative"
# A group that passed every check in a batch where another group is a proven cheat: the worker is
# banned and none of the batch is used (burn one counter, deliver a good one beside it).
CHEATING_BATCH = "cheating_batch"
# A group whose figures passed every proof bound (twice its engine pair's tolerances) but not the
# tolerances themselves: honest numerics have heavy tails, so this proves nothing (no ban, nobody
# charged), and it is not trained on or rewarded, so a forgery that lands here earns nothing.
INCONCLUSIVE = "inconclusive"
# How far past its engine pair's tolerance a figure proves a cheat (specs/validation.md, "Two
# bounds"): measured honest extremes reach 1.3 times a calibrated tolerance (bench/HISTORY.md).
PROOF_FACTOR = 2.0
# Reasons a group is rejected, in the order validation checks them.
REASONS = (
    "wrong_run", "wrong_sampling", "engine_not_allowed", "stale_step", "unknown_checkpoint",
    "uncommitted", "replayed_counter", "counter_cap", "counter_gap", "wrong_task", "wrong_length_target",
    "wrong_group_size", "wrong_prompt", "duplicate_group", "bad_tokens", "toploc", "logprobs",
    "termination", "sampling", INCONCLUSIVE, CHEATING_BATCH, UNINFORMATIVE,
)
# Reasons any node can re-check from the signed batch (plus, for a replay, the earlier batch):
# no honest worker produces them, so one is enough to ban the worker for the run.
PROVEN_CHEATS = frozenset({
    "wrong_task", "wrong_length_target", "replayed_counter", "wrong_group_size", "wrong_prompt",
    "duplicate_group", "bad_tokens", "toploc", "logprobs", "termination", "sampling",
})
MAX_GROUPS = 1024
MAX_COMPLETIONS = 64


@dataclass(frozen=True)
class AcceptedGroup(Record):
    counter: int = wire(Int(0, 2**32))
    rewards: tuple[float, ...] = wire(ListOf(Float(-1e6, 1e6), max_items=MAX_COMPLETIONS))


@dataclass(frozen=True)
class RejectedGroup(Record):
    counter: int = wire(Int(0, 2**32))
    reason: str = wire(Str(32, choices=frozenset(REASONS)))


@dataclass(frozen=True)
class Verdict(Message):
    TYPE: ClassVar[str] = "rollout_verdict"
    MAX_SIZE: ClassVar[int] = 768 << 10  # 1024 groups x 64 float64 rewards fit; gossip's limit is ~1 MiB
    MAX_LIFETIME_S: ClassVar[float] = 3600.0

    run_id: str = wire(Str(64, pattern=RUN_ID_PATTERN))
    batch_digest: bytes = wire(Bytes(32, min_len=32))
    worker: str = wire(Str(64, pattern=PEER_ID_PATTERN))
    policy_step: int = wire(Int(0, 2**40))
    validator: str = wire(Str(64, pattern=PEER_ID_PATTERN))
    accepted: tuple[AcceptedGroup, ...] = wire(ListOf(Nested(AcceptedGroup), max_items=MAX_GROUPS))
    rejected: tuple[RejectedGroup, ...] = wire(ListOf(Nested(RejectedGroup), max_items=MAX_GROUPS))

    def check(self, path: str) -> None:
        counters = [g.counter for g in self.accepted] + [g.counter for g in self.rejected]
        if len(set(counters)) != len(counters):
            raise InvalidValue(f"{path}: a counter is both accepted and rejected, or appears twice")
        if len(counters) > MAX_GROUPS:
            raise InvalidValue(f"{path}: {len(counters)} groups, at most {MAX_GROUPS}")
        if any(not g.rewards for g in self.accepted):
            raise InvalidValue(f"{path}.accepted: a group without rewards")

    def check_signer(self, signer_peer_id: str) -> None:
        if self.validator != signer_peer_id:
            raise SignerMismatch("verdict names a validator other than its signer")

    @property
    def cheats(self) -> tuple[str, ...]:
        """The proven-cheat reasons among the rejections (empty: no ban)."""
        return tuple(sorted({g.reason for g in self.rejected if g.reason in PROVEN_CHEATS}))
