"""Delivery standing: whose accepted groups a trainer trains on (specs/rollouts.md, "Delivery standing").

Committed assignments make picking unpaid (each committed counter never delivered settles at reward
0), but a group a worker chose to deliver is still sound work: accepted, and without this trained
on, so a worker with many keys would still choose which samples shape the policy. A judge
therefore keeps, per worker, what its last ``window_steps`` settled commitments asked and got
(committed ``N``, delivered ``d``: the dense counters credited) and trains on a worker's groups
only while it has standing:

- at least one settled commitment (a key made for one pick has none while its group can be
  trained: its commitment settles only when its step leaves the window);
- a delivery share ``sum(min(d, cap)) / sum(min(N, cap))`` of at least ``min_share``, where
  ``cap`` is the ``d`` of the worker's median step (the upper one, with an even count).

Why the cap: an honest worker commits about twice what it makes in a step (a commitment that runs
out stalls the step; node/roles/inference/commitments.py), so its raw share ``d / N`` is about a half
whatever it does, and a picker's is too. What separates them is how ``d`` varies: an honest
worker delivers what it makes until the step moves on, about the same each step (in whole batches,
so a slow one's steps read 4, 8, 4, 4: hence the median, which a long or a short step does not
move), while a picker stops at the first task it dislikes, so its ``d`` follows its tasks and its
share falls to about the chance that the next task pleases it. A step
lost to churn (``d`` 0) costs an honest worker ``1 / window_steps`` of its share.

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
        with self._lock:
            entries = list(self.steps.get(worker, {}).values())
        share = delivery_share(entries)
        return median_delivered(entries) if share is not None and share >= self.rule.min_share else 0

    def standing(self, worker: str) -> bool:
        share = self.share(worker)
        return share is not None and share >= self.rule.min_share

    def share(self, worker: str) -> float | None:
        """The worker's delivery share over its window (None: no settled commitment)."""
        with self._lock:
            entries = list(self.steps.get(worker, {}).values())
        return delivery_share(entries)

    def status(self) -> dict[str, int]:
        with self._lock:
            workers = list(self.steps)
        standing = sum(self.standing(w) for w in workers)
        return {"workers": len(workers), "with_standing": standing, "without_standing": len(workers) - standing}

    # ---- what settlement tells it ------------------------------------------------------------

    def record(self, settled: Iterable[tuple[str, int, int, int]]) -> None:
        """Add settled commitments ``(worker, step, committed, delivered)``; keep each worker's
        newest ``window_steps``, at most MAX_WORKERS workers; then write the ledger."""
        with self._lock:
            for worker, step, committed, delivered in settled:
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
        self.steps = steps
        self._trim()


def delivery_share(entries: Iterable[tuple[int, int]]) -> float | None:
    """``sum(min(d, cap)) / sum(min(N, cap))`` over (committed N, delivered d), ``cap`` the median
    ``d`` (the upper one of an even count: two steps, one lost, read as a half); None without
    entries, 0 when the median step delivered nothing."""
    entries = list(entries)
    if not entries:
        return None
    cap = median_delivered(entries)
    asked = sum(min(n, cap) for n, _ in entries)
    return sum(min(d, cap) for _, d in entries) / asked if asked else 0.0


def median_delivered(entries: list[tuple[int, int]]) -> int:
    """``cap``: the ``d`` of the median step (the upper one of an even count); 0 without entries."""
    delivered = sorted((d for _, d in entries), reverse=True)
    return delivered[(len(delivered) - 1) // 2] if delivered else 0
