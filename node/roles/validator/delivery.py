"""Delivery standing: whose accepted groups a trainer trains on (specs/rollouts.md, "Delivery standing").

Committed assignments make picking unpaid (each committed counter never delivered settles at reward
0), but a group a worker chose to deliver is still sound work: accepted, and without this trained
on, so a worker with many keys would still choose which samples shape the policy. A judge
therefore keeps, per worker, what its last ``window_steps`` settled commitments asked and got
(committed ``N``, delivered ``d``: the dense counters credited; a step nobody delivered to is
noted for no one) and trains on a worker's groups only while it has standing:

- at least one settled commitment (a key made for one pick has none while its group can be
  trained: its commitment settles only when its step leaves the window);
- a delivery share ``sum(min(d, cap)) / sum(min(N, cap))`` of at least ``min_share`` at some
  ``cap`` from 1 up to the ``d`` of the worker's median step (the upper one, with an even count);
  its ``cap`` is the largest such.

Why the cap: an honest worker commits about twice what it makes in a step (a commitment that runs
out stalls the step; node/roles/inference/commitments.py), so its raw share ``d / N`` is about a half
whatever it does, and a picker's is too. What separates them is how ``d`` varies: an honest
worker delivers what it makes until the step moves on, about the same each step (in whole batches,
so a slow one's steps read 4, 8, 4, 4: hence the median, which a long or a short step does not
move), while a picker stops at the first task it dislikes, so its ``d`` follows its tasks and its
share falls to about the chance that the next task pleases it, at every cap (at a cap of one
group it is exactly that chance). A step lost to churn (``d`` 0) costs an honest worker
``1 / window_steps`` of its share.

Why the largest cap at or under the median, not the median alone: an honest worker's steps change
length with the trainer's (a trainer that restarts, or slows, or gains workers), and while its
window holds short steps and long ones about half and half, the median is a long step's count and
the short steps read as withholding: at the median alone, ledger ``[(16, 4), (16, 16)]`` (a short
step after a trainer's restart, then a whole one) reads 0.625 and the only worker's groups waited
five minutes for a bridge step. Lowering the cap until the share holds keeps its standing (cap 8
there) and trains fewer of its groups a step until the window settles. A picker gains nothing the
threshold did not already concede: its share at a cap of one group is the chance its next task
pleases it, and it is no higher at any larger cap.

The step cap: of a worker with standing, only a step's counters below ``cap`` are trained on. The
share counts nothing above ``cap``, so a worker could deliver its median step's worth unlooked-at
and go on only while it likes the next task; counters are credited densely and in order, so those
picks are exactly the counters at or above ``cap`` (the step's surplus, delivered last). The
surplus stays accepted and paid (an honest worker's long step has one too); it is not trained on
unless the worker's ``cap`` rises while it is pooled. The decision reads only this ledger and the
group's counter: deterministic, and a restart decides as before.

Groups of the open steps (``0 .. async_window + 1``) need no standing: no commitment can settle
before step ``async_window + 2`` is known, so nobody could have any (step 0 is warm-up anyway).

Bounded: ``window_steps`` entries per worker, at most ``MAX_WORKERS`` workers; past it, those that
delivered least are forgotten first (a forgotten worker has no standing: forgetting never helps).
Durable: written whole (``write_durably``) after each settlement, so a restart keeps every
standing; a settlement repeated after a crash replaces its own entry.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

from intellect_node.node.home.durable import write_durably
from intellect_node.protocol.run_spec import DeliveryRule

log = logging.getLogger(__name__)
MAX_WORKERS = 16384
MAX_FILE_BYTES = 16 << 20  # 16384 workers x 64 steps of three small numbers fit easily


class DeliveryLedger:
    """Per worker: step -> (committed, delivered) of its newest settled commitments."""

    def __init__(self, path: Path | None, rule: DeliveryRule, async_window: int) -> None:
        self.path, self.rule = path, rule
        self.open_through = async_window + 1  # the open steps: groups trained without standing
        self.steps: dict[str, dict[int, tuple[int, int]]] = {}
        self._caps: dict[str, tuple[int, int]] = {}  # worker -> (cap, median), until the next settlement
        self._lock = threading.Lock()  # settled from the judge's worker thread, read on the trio loop
        if path is not None and path.exists():
            self._load(path)

    # ---- what the trainer asks ---------------------------------------------------------------

    def admits(self, worker: str, step: int, counter: int) -> bool:
        """Whether the group ``counter`` of ``worker`` at policy ``step`` may be trained on now."""
        return step <= self.open_through or counter < self.trained_per_step(worker)

    def trained_per_step(self, worker: str) -> int:
        """How many of a step's groups (counters ``0 .. n - 1``) of ``worker`` may be trained on:
        its ``cap`` while it has standing, else none."""
        return self._cap_and_median(worker)[0]

    def standing(self, worker: str) -> bool:
        return self.trained_per_step(worker) > 0

    def fills(self, worker: str) -> bool:
        """Whether the worker's surplus may fill a starved batch: only while its ``cap`` is its
        median step's count. A ``cap`` lowered below it admits the counters under it and nothing
        more: a picker whose share holds only at a lower cap (its picks above it) gains no way
        into training that the median-only rule did not give it."""
        cap, median = self._cap_and_median(worker)
        return cap > 0 and cap == median

    def _cap_and_median(self, worker: str) -> tuple[int, int]:
        with self._lock:
            if worker not in self.steps:
                return 0, 0
            if worker not in self._caps:
                entries = list(self.steps[worker].values())
                self._caps[worker] = (standing_cap(entries, self.rule.min_share), median_delivered(entries))
            return self._caps[worker]

    def share(self, worker: str) -> float | None:
        """The worker's delivery share over its window at its ``cap`` (without standing: at a cap of
        one group); None: no settled commitment."""
        cap = self.trained_per_step(worker)
        with self._lock:
            entries = list(self.steps.get(worker, {}).values())
        return delivery_share(entries, max(cap, 1))

    def status(self) -> dict[str, int]:
        with self._lock:
            workers = list(self.steps)
        standing = sum(self.standing(w) for w in workers)
        return {"workers": len(workers), "with_standing": standing, "without_standing": len(workers) - standing}

    # ---- what settlement tells it ------------------------------------------------------------

    def record(self, settled: Iterable[tuple[str, int, int, int]]) -> None:
        """Add settled commitments ``(worker, step, committed, delivered)``, all of the steps being
        closed (the book settles every commitment of a step at once); keep each worker's newest
        ``window_steps``, at most MAX_WORKERS workers; then write the ledger.

        A step that no worker delivered a group of is not noted for anyone: the trainer moved past
        it before anyone could (a restarted trainer trains its pooled steps in a second), or this
        judge heard nobody then; either way it says nothing of who withholds. Only where every
        committed worker withheld at once does it hide a withheld step, and a swarm in which no
        honest worker delivered anything has no standing to protect."""
        settled = list(settled)
        delivered_at: dict[int, int] = {}
        for _, step, _, delivered in settled:
            delivered_at[step] = delivered_at.get(step, 0) + delivered
        with self._lock:
            self._caps.clear()
            for worker, step, committed, delivered in settled:
                if not delivered_at[step]:
                    continue
                entries = self.steps.setdefault(worker, {})
                entries[step] = (committed, min(delivered, committed))
                for old in sorted(entries)[:-self.rule.window_steps]:
                    del entries[old]
            self._trim()
            data = None if self.path is None else json.dumps(
                {w: [[s, n, d] for s, (n, d) in sorted(e.items())] for w, e in self.steps.items()}).encode()
        if data is not None and self.path is not None:
            write_durably(self.path, data)

    def _trim(self) -> None:
        """Forget the workers past MAX_WORKERS that delivered least (then the longest settled ago)."""
        excess = len(self.steps) - MAX_WORKERS
        if excess <= 0:
            return
        ranked = sorted(self.steps, key=lambda w: (sum(d for _, d in self.steps[w].values()), max(self.steps[w])))
        for worker in ranked[:excess]:
            del self.steps[worker]

    def _load(self, path: Path) -> None:
        """Read the ledger back; a damaged file costs every worker its standing until its next
        settlement (warned), never the node's start."""
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"{path.stat().st_size} bytes, at most {MAX_FILE_BYTES}")
            raw = json.loads(path.read_bytes())
            if not isinstance(raw, dict):
                raise ValueError("not a map of workers")
            steps = {}
            for worker, entries in raw.items():
                parsed = {}
                for step, committed, delivered in entries:
                    if not all(type(x) is int and x >= 0 for x in (step, committed, delivered)):
                        raise ValueError(f"entry of {worker[:16]}: not three counts")
                    parsed[step] = (committed, min(delivered, committed))
                steps[str(worker)] = dict(sorted(parsed.items())[-self.rule.window_steps:])
        except (OSError, ValueError, TypeError) as exc:
            log.warning("unreadable delivery ledger %s (every worker starts without standing): %s", path.name, exc)
            return
        with self._lock:
            self.steps, self._caps = steps, {}
            self._trim()


def delivery_share(entries: Iterable[tuple[int, int]], cap: int | None = None) -> float | None:
    """``sum(min(d, cap)) / sum(min(N, cap))`` over (committed N, delivered d), ``cap`` by default
    the median ``d`` (``median_delivered``); None without entries, 0 when ``cap`` is 0."""
    entries = list(entries)
    if not entries:
        return None
    cap = median_delivered(entries) if cap is None else cap
    asked = sum(min(n, cap) for n, _ in entries)
    return sum(min(d, cap) for _, d in entries) / asked if asked else 0.0


def standing_cap(entries: Iterable[tuple[int, int]], min_share: float) -> int:
    """The worker's ``cap``: the largest ``cap`` from 1 up to its median ``d`` at which its share is at
    least ``min_share``; 0 (no standing) when there is none.

    Not a scan of every cap (a run spec allows a million groups a step, and this runs on the
    trainer's loop): between two neighbouring values of the window's ``d`` and ``N`` each
    ``min(x, cap)`` is either constant or ``cap``, so the share is a ratio of two linear functions
    of ``cap``, monotone there. From the top interval down: its top cap holds, or, if the share
    falls across it, the largest cap that holds is found by bisection; else the next one down.
    An honest worker's share holds at its median, the first cap tried."""
    entries = list(entries)
    median = median_delivered(entries)
    points = sorted({v for pair in entries for v in pair if 0 < v < median} | {0, median})

    def holds(cap: int) -> bool:
        share = delivery_share(entries, cap)
        return share is not None and share >= min_share

    for low, high in reversed(list(pairwise(points))):
        if holds(high):
            return high
        if high - low > 1 and holds(low + 1):  # the share falls across (low, high]: bisect
            good, bad = low + 1, high
            while bad - good > 1:
                middle = (good + bad) // 2
                good, bad = (middle, bad) if holds(middle) else (good, middle)
            return good
    return 0


def median_delivered(entries: list[tuple[int, int]]) -> int:
    """``cap``: the ``d`` of the median step (the upper one of an even count); 0 without entries."""
    delivered = sorted((d for _, d in entries), reverse=True)
    return delivered[(len(delivered) - 1) // 2] if delivered else 0
