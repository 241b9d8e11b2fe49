"""What a judge knows of work commitments: which (worker, step) may deliver how many groups.

A commitment counts only if it reached this judge before the judge knew checkpoint ``step``
(then its tasks were unknown to everyone, the worker included); a group beyond its commitment is
``uncommitted``. When a step leaves the async window, each committed counter that was never
delivered is settled as reward 0, so delivering only the groups one likes earns nothing over
delivering them all (specs/rollouts.md, "Committed assignments").

Settling also tells the ``DeliveryLedger`` (``delivery.py``) what each closed commitment asked and
got: a trainer trains on a worker's groups only while it delivers what it commits.

Durable: every stored commitment is appended (fsync) to ``<home>/commitments.jsonl`` before it is
answered ``stored``, so a restart neither forgets a commitment nor lets a worker commit again after
the beacon; the file is rewritten with the live steps only when a step is settled.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from intellect_node.node.home.durable import append_durably, write_durably
from intellect_node.node.roles.validator.delivery import DeliveryLedger
from intellect_node.protocol.commitments import WorkCommitment

log = logging.getLogger(__name__)
AHEAD = 2  # steps past the newest known one a commitment may name (a judge a step behind the worker)
# Checkpoint 0 exists before anyone can commit: its groups are judged without a commitment and
# count in no worker's accepted reward (specs/rollouts.md, "Step 0 is warm-up")
WARM_UP_STEP = 0
MAX_COMMITMENTS = 65536  # live (worker, step) entries in all; past it: busy
STORED, LATE, EARLY, DUPLICATE, BUSY, TOO_MANY = "stored", "late", "early", "duplicate", "busy", "too_many_groups"


@dataclass(frozen=True)
class Undelivered:
    """Committed counters of (worker, step) never delivered: each settles as a group of reward 0."""

    worker: str
    step: int
    counters: tuple[int, ...]


class CommitmentBook:
    """Stored commitments, at most one per (worker, step), for steps not yet settled."""

    def __init__(self, path: Path | None, *, max_groups: int, delivery: DeliveryLedger | None = None) -> None:
        self.path, self.max_groups, self.delivery = path, max_groups, delivery
        self.groups_of: dict[tuple[str, int], int] = {}
        # verify_batch settles in the judge's worker thread while the receiver stores commitments on
        # the trio loop: unlocked, a settle's rewrite of the file replaced a line appended meanwhile
        # (a commitment answered stored, gone after a restart), and an offer mid-settle changed the
        # dict under the settle's loop (the batch being judged was quarantined, its worker charged)
        self._lock = threading.Lock()
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        for line in path.read_text().splitlines():
            try:
                worker, step, groups = json.loads(line)
                self.groups_of[(str(worker), int(step))] = int(groups)
            except (ValueError, TypeError) as exc:  # a torn last line after a crash: never answered stored
                log.warning("unreadable commitment line in %s: %s", path.name, exc)

    def offer(self, commitment: WorkCommitment, newest_known_step: int) -> str:
        """Store ``commitment`` (signature and run already checked) if it precedes its beacon."""
        with self._lock:
            return self._offer(commitment, newest_known_step)

    def _offer(self, commitment: WorkCommitment, newest_known_step: int) -> str:
        key = (commitment.worker, commitment.step)
        if key in self.groups_of:
            return DUPLICATE  # the first one stands: a worker cannot raise its count after the beacon
        if commitment.step <= newest_known_step:
            return LATE
        if commitment.step > newest_known_step + AHEAD:
            return EARLY  # this judge is behind the worker (or the step is far off): asked again later
        if commitment.groups > self.max_groups:
            return TOO_MANY
        if len(self.groups_of) >= MAX_COMMITMENTS:
            return BUSY
        if self.path is not None:
            append_durably(self.path, json.dumps([commitment.worker, commitment.step, commitment.groups]))
        self.groups_of[key] = commitment.groups
        return STORED

    def groups(self, worker: str, step: int) -> int:
        """Groups (worker, step) committed to; 0: none stored, every group is uncommitted."""
        return self.groups_of.get((worker, step), 0)

    def has_step(self, step: int) -> bool:
        """Whether some worker's commitment for ``step`` is stored."""
        with self._lock:
            return any(stored == step for _, stored in self.groups_of)

    def entries(self) -> list[tuple[tuple[str, int], int]]:
        """The stored ((worker, step), groups), copied: a reader on the trio loop iterates them while
        the judge's worker thread may settle."""
        with self._lock:
            return list(self.groups_of.items())

    def covers(self, worker: str, step: int, counter: int) -> bool:
        """Whether ``counter`` of (worker, step) may be judged: under a stored commitment, or warm-up."""
        return step == WARM_UP_STEP or counter < self.groups(worker, step)

    def settle(self, before_step: int, delivered: dict[tuple[str, int], int]) -> list[Undelivered]:
        """Close the steps below ``before_step``: ``delivered[(worker, step)]`` is the next counter
        the judge expected (dense counters: all below it were delivered)."""
        with self._lock:
            return self._settle(before_step, delivered)

    def _settle(self, before_step: int, delivered: dict[tuple[str, int], int]) -> list[Undelivered]:
        closing = [key for key in self.groups_of if key[1] < before_step]
        if not closing:
            return []
        settled, closed = [], []
        for key in closing:
            groups = self.groups_of.pop(key)
            done = min(delivered.get(key, 0), groups)
            closed.append((key[0], key[1], groups, done))
            missing = tuple(range(done, groups))
            if missing:
                settled.append(Undelivered(key[0], key[1], missing))
        if self.delivery is not None:  # before the book forgets them: a crash between settles them again
            self.delivery.record(closed)
        if self.path is not None:
            lines = "".join(json.dumps([w, s, g]) + "\n" for (w, s), g in self.groups_of.items())
            write_durably(self.path, lines.encode())
        return settled
