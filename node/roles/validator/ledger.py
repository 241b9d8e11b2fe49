"""What a validator remembers between batches: dense counters and the content index.

Counters. A worker's task at (step, counter) is assigned, but it could still skip the counters
whose task a cheap pre-check calls hard, or farm far-away counters. Counters are therefore
credited only in order: counter k of (worker, step) is judged once 0 .. k-1 have been, and never
at or beyond the run's per-step cap. A gap stalls the worker's later counters (the service keeps
such a batch waiting in its inbox until its step leaves the async window) instead of paying it.
Only the next expected counter is kept per (worker, step): dense counters need no set.

Content. A group already seen (same prompt and completion tokens), from any worker and under any
counter, is refused: resubmitting one's own or someone else's accepted work costs no decoding.
Both maps forget steps that left the async window, which bounds their size.

Commitments. With a ``CommitmentBook``, a group is judged only under a commitment stored before
its step's checkpoint, and leaving the window settles the committed counters never delivered
(``commitments.py``); they wait in ``settled`` for the caller to record and pay as reward 0.

Flips. Each worker's flips (tokens inside the sampling slack that were not the replay's exact
choice) and the number its engine pair's noise explains, summed over its accepted groups: the flip
test of one group leaves a cheater a few steered near ties; summed, steady steering shows
(specs/sampling.md section 4). Under a pair at the wire's slack bound, its tokens past the proof
bound likewise, over every group judged within the other proof bounds. Kept per worker for the
node's life (two numbers each).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from intellect_node.node.roles.validator.commitments import CommitmentBook, Undelivered

CONTENT_DOMAIN = b"intellect-node/content/group/v1"


def group_digest(prompt_ids: bytes, completion_token_ids: Sequence[bytes]) -> bytes:
    """sha256 of a group's prompt and completion tokens (packed u32), each length-prefixed."""
    h = hashlib.sha256(CONTENT_DOMAIN)
    for part in (prompt_ids, *completion_token_ids):
        h.update(struct.pack(">I", len(part)) + part)
    return h.digest()


@dataclass
class JudgeState:
    """Counters and content seen by one validator (rebuilt from its records at start)."""

    next_counter: dict[tuple[str, int], int] = field(default_factory=dict)
    contents: dict[bytes, int] = field(default_factory=dict)  # group digest -> policy step
    flips: dict[str, tuple[int, float]] = field(default_factory=dict)  # worker -> (flips, expected)
    deep_flips: dict[str, tuple[int, float]] = field(default_factory=dict)  # past the proof bound, likewise
    commitments: CommitmentBook | None = None  # None: counters are capped by the run spec alone
    settled: list[Undelivered] = field(default_factory=list)  # settled by forget_before, for the caller

    def add_flips(self, worker: str, flips: int, expected: float, deep: bool = False) -> tuple[int, float]:
        """The worker's flips (``deep``: its tokens past the proof bound, specs/sampling.md section 4)
        and their honest expectation with one more group's added."""
        history = self.deep_flips if deep else self.flips
        seen, explained = history.get(worker, (0, 0.0))
        history[worker] = total = (seen + flips, explained + expected)
        return total

    def expected(self, worker: str, step: int) -> int:
        return self.next_counter.get((worker, step), 0)

    def owed(self, steps: range) -> int:
        """Committed counters of ``steps`` not credited yet (0 without a commitment book)."""
        if self.commitments is None:
            return 0
        return sum(max(0, groups - self.expected(worker, step))
                   for (worker, step), groups in self.commitments.entries() if step in steps)

    def counter_problem(self, worker: str, step: int, counter: int, cap: int) -> str | None:
        """Why ``counter`` cannot be credited now, or None when it is the next one (then credited)."""
        if self.commitments is not None and not self.commitments.covers(worker, step, counter):
            return "uncommitted"  # before anything is credited: no stored commitment covers it
        expected = self.expected(worker, step)
        if counter < expected:
            return "replayed_counter"
        if counter >= cap:
            return "counter_cap"
        if counter > expected:
            return "counter_gap"
        self.next_counter[(worker, step)] = counter + 1
        return None

    def credit(self, worker: str, step: int, counters: Iterable[int]) -> None:
        """Mark counters used without judging them (unsampled or adopted batches, records)."""
        top = max(counters, default=-1)
        self.next_counter[(worker, step)] = max(self.expected(worker, step), top + 1)

    def content_seen(self, digest: bytes, step: int) -> bool:
        """Whether ``digest`` was seen; if not, it is now (for ``step``)."""
        if digest in self.contents:
            return True
        self.contents[digest] = step
        return False

    def forget_before(self, step: int) -> None:
        """Drop what belongs to steps below ``step`` (out of the async window: refused as stale),
        settling their committed counters first."""
        if self.commitments is not None:
            self.settled.extend(self.commitments.settle(step, self.next_counter))
        self.next_counter = {k: v for k, v in self.next_counter.items() if k[1] >= step}
        self.contents = {k: v for k, v in self.contents.items() if v >= step}
