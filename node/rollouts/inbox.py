"""Durable storage of received rollout batches, keyed by the sha256 of their envelope.

A batch is acknowledged only after it is on disk (``intellect_node.node.home.durable``), so an
acknowledged batch survives a crash, and a crash mid-write leaves only a temporary file that the
next start removes: nothing half-written ever looks like a batch.

The inbox is bounded, per worker and in total, in batches and in bytes (``InboxLimits``): batches
wait here while their checkpoint travels or their earlier counters are judged, and a worker that
floods it with batches that can never be judged (counter gaps, checkpoints that never come) must
fill only its own share. A batch over a bound is refused before it is written (``InboxFull``), and
the worker is told to come back later. The receiver and the judge of one node share one inbox
object per directory (``shared_inbox``), so both see the same accounting.

Delivery is idempotent: the same envelope again is not stored, whether it still waits here or its
judge has recorded it already (``judged``, set by the judge). A worker whose ``stored`` answer was
lost on the way delivers again; judged a second time, its counters would read as replayed, a
proven cheat, and the honest worker would be banned.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from intellect_node.crypto.envelope import MAGIC
from intellect_node.crypto.identity import PUBLIC_KEY_SIZE, peer_id_from_public_key
from intellect_node.node.home.durable import write_durably

SUFFIX = ".batch"
TMP_MARK = ".tmp-"


@dataclass(frozen=True)
class InboxLimits:
    """How much may wait in one node's inbox. An honest worker has a few batches pending per step of
    the async window; the per-worker bounds leave it several times that."""

    per_worker_batches: int = 32
    per_worker_bytes: int = 256 << 20
    total_batches: int = 2048
    total_bytes: int = 4 << 30


class InboxFull(Exception):
    """Storing this batch would pass one of the inbox's bounds (named in the message)."""


def envelope_signer(envelope: bytes) -> str:
    """The signer's peer id from an envelope's fixed header (the store checked its signature)."""
    if len(envelope) < len(MAGIC) + PUBLIC_KEY_SIZE or not envelope.startswith(MAGIC):
        raise ValueError("not an intellect-node envelope")
    return peer_id_from_public_key(envelope[len(MAGIC):len(MAGIC) + PUBLIC_KEY_SIZE])


class RolloutInbox:
    def __init__(self, directory: Path, limits: InboxLimits | None = None) -> None:
        self.directory = directory
        self.limits = limits or InboxLimits()
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob(f"*{SUFFIX}{TMP_MARK}*"):
            leftover.unlink(missing_ok=True)
        # digest -> (worker, bytes), in arrival order; ``store`` runs in a worker thread while the
        # judge removes batches on the trio loop, so every change holds the lock. A batch being
        # written has its room taken (counted) but is not held yet: the judge sees only whole files
        self._held: dict[str, tuple[str, int]] = {}
        self._writing: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self._batches: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()
        self._total_bytes = 0
        # the judge's "already recorded" test for a digest; it records a batch before removing it
        # from here, so a digest is at every moment either held or judged (checked in that order)
        self.judged: Callable[[str], bool] = lambda digest: False
        found = sorted(directory.glob(f"*{SUFFIX}"), key=lambda p: (p.stat().st_mtime, p.name))
        for path in found:
            try:
                with open(path, "rb") as handle:
                    worker = envelope_signer(handle.read(len(MAGIC) + PUBLIC_KEY_SIZE))
                self._account(path.name[: -len(SUFFIX)], worker, path.stat().st_size)
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # not a batch this inbox wrote: nothing to judge

    def _path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256 hex digest: {digest[:70]!r}")
        return self.directory / f"{digest}{SUFFIX}"

    def _account(self, digest: str, worker: str, size: int) -> None:
        self._held[digest] = (worker, size)
        self._count(worker, size)

    def _count(self, worker: str, size: int) -> None:
        self._batches[worker] += 1
        self._bytes[worker] += size
        self._total_bytes += size

    def __contains__(self, digest: str) -> bool:
        return self._path(digest).exists()

    def held_by(self, worker: str) -> int:
        """How many batches of ``worker`` wait here."""
        return self._batches[worker]

    def total_bytes(self) -> int:
        return self._total_bytes

    def _check_room(self, worker: str, size: int) -> None:
        limits = self.limits
        if self._batches[worker] + 1 > limits.per_worker_batches:
            raise InboxFull(f"{self._batches[worker]} batches of this worker wait, at most {limits.per_worker_batches}")
        if self._bytes[worker] + size > limits.per_worker_bytes:
            raise InboxFull(f"{self._bytes[worker]} bytes of this worker wait, at most {limits.per_worker_bytes}")
        if len(self._held) + 1 > limits.total_batches:
            raise InboxFull(f"{len(self._held)} batches wait, at most {limits.total_batches}")
        if self.total_bytes() + size > limits.total_bytes:
            raise InboxFull(f"{self.total_bytes()} bytes wait, at most {limits.total_bytes}")

    def store(self, envelope: bytes) -> tuple[str, bool]:
        """Write ``envelope`` durably; returns (digest, True) if new, (digest, False) if already held
        or already judged. ``InboxFull`` when it would pass a bound (nothing is written then)."""
        digest = hashlib.sha256(envelope).hexdigest()
        final = self._path(digest)
        worker = envelope_signer(envelope)
        with self._lock:  # room is taken before the write, so two stores cannot both pass a bound
            if digest in self._held or digest in self._writing or self.judged(digest):
                return digest, False
            self._check_room(worker, len(envelope))
            self._writing[digest] = (worker, len(envelope))
            self._count(worker, len(envelope))
        try:
            write_durably(final, envelope, tmp_suffix=f"{TMP_MARK}{os.getpid()}")
        except BaseException:
            with self._lock:
                self._uncount(*self._writing.pop(digest))
            raise
        # held only now: a judge that listed it while it was written would find no file, drop it
        # as missing, and the worker's later counters would wait behind the gap for good
        with self._lock:
            self._held[digest] = self._writing.pop(digest)
        return digest, True

    def pending(self) -> list[str]:
        """Digests of the held batches, oldest first."""
        with self._lock:
            return list(self._held)

    def worker_of(self, digest: str) -> str | None:
        held = self._held.get(digest)
        return held[0] if held else None

    def load(self, digest: str) -> bytes:
        return self._path(digest).read_bytes()

    def remove(self, digest: str) -> None:
        """Forget a batch once its rows are consumed (trained on, or verdict given)."""
        self._path(digest).unlink(missing_ok=True)
        self._forget(digest)

    def move_out(self, digest: str, directory: Path) -> None:
        """Move a held batch's file into ``directory`` (kept for inspection) and forget it here."""
        directory.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(self._path(digest), self.moved_path(digest, directory))
        finally:
            self._forget(digest)

    def moved_path(self, digest: str, directory: Path) -> Path:
        """Where ``move_out`` puts ``digest``'s file in ``directory``."""
        return directory / self._path(digest).name

    def _forget(self, digest: str) -> None:
        with self._lock:
            held = self._held.pop(digest, None)
            if held is not None:
                self._uncount(*held)

    def _uncount(self, worker: str, size: int) -> None:
        self._batches[worker] -= 1
        self._bytes[worker] -= size
        self._total_bytes -= size
        if self._batches[worker] <= 0:
            del self._batches[worker], self._bytes[worker]


_SHARED: weakref.WeakValueDictionary[Path, RolloutInbox] = weakref.WeakValueDictionary()


def shared_inbox(directory: Path, limits: InboxLimits | None = None) -> RolloutInbox:
    """The one inbox object of ``directory`` in this process: the receiver that stores batches and
    the judge that removes them must count the same batches."""
    key = directory.resolve()
    inbox = _SHARED.get(key)
    if inbox is None:
        inbox = RolloutInbox(directory, limits)
        _SHARED[key] = inbox
    return inbox
