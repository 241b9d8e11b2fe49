"""Batches a receiver could not take yet, kept for it until they are no use (no I/O).

``deliver`` retries a receiver for about 16 s. A trainer or validator restarting (after a crash, an
upgrade, a kill -9) is away longer than that, and without an outbox every batch the worker made
meanwhile would be lost: its counters are spent (they never repeat), the groups are settled as
undelivered commitments (reward 0), and a trainer that needed them to finish its step waits for a
worker that waits for the trainer's next step. So a batch that failed to reach a receiver waits
here and is offered to that receiver again, with backoff, until it is taken, refused, or too old to
be trained on (its step left the async window).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# at most this many batches wait (the oldest is dropped first): a receiver gone for good must not
# grow the worker's memory; 64 batches are minutes of generation
MAX_WAITING = 64
# the first retry this long after the failure, then doubling up to RETRY_MAX_S
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 60.0
# answers that end a receiver's wait (anything else is "failed": not reached, tried again)
FINAL = frozenset({"stored", "duplicate", "rejected"})


@dataclass
class Waiting:
    """One batch and the receivers it has not reached yet."""

    step: int
    envelope: bytes
    receivers: set[str]
    next_try: float
    delay: float = RETRY_FIRST_S


@dataclass
class Outbox:
    """The waiting batches, oldest first; ``counts`` says what became of them (for status)."""

    waiting: list[Waiting] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def keep(self, step: int, envelope: bytes, failed: list[str], now: float) -> None:
        """Keep a batch of ``step`` for the receivers in ``failed`` (nothing when it is empty)."""
        if not failed:
            return
        self.waiting.append(Waiting(step, envelope, set(failed), now + RETRY_FIRST_S))
        self.counts["kept"] += 1
        while len(self.waiting) > MAX_WAITING:
            self.waiting.pop(0)
            self.counts["dropped_full"] += 1

    def due(self, now: float, oldest_useful_step: int) -> list[tuple[Waiting, list[str]]]:
        """The batches to offer again now and to whom; batches of steps before
        ``oldest_useful_step`` are dropped first (every receiver would refuse them as stale)."""
        stale = [w for w in self.waiting if w.step < oldest_useful_step]
        if stale:
            self.counts["dropped_stale"] += len(stale)
            self.waiting = [w for w in self.waiting if w.step >= oldest_useful_step]
        return [(w, sorted(w.receivers)) for w in self.waiting if w.next_try <= now]

    def settle(self, entry: Waiting, answers: dict[str, str], now: float) -> None:
        """The receivers' answers to one retry of ``entry``: a final answer ends that receiver's
        wait (the batch leaves with its last receiver); if any failed again, the wait before the
        next try doubles."""
        for receiver, answer in answers.items():
            if answer in FINAL:
                entry.receivers.discard(receiver)
                self.counts[f"redelivered_{answer}"] += 1
        if not entry.receivers:
            if entry in self.waiting:
                self.waiting.remove(entry)
            return
        entry.delay = min(2 * entry.delay, RETRY_MAX_S)
        entry.next_try = now + entry.delay

    def status(self) -> dict[str, int]:
        return {"waiting": len(self.waiting), **self.counts}
