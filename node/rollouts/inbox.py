"""Durable storage of received rollout batches, keyed by the sha256 of their envelope.

A batch is acknowledged only after it is on disk (``intellect_node.node.home.durable``), so an acknowledged batch survives a crash, and a crash mid-write leaves only a
temporary file that the next start removes: nothing half-written ever looks like a batch.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from intellect_node.node.home.durable import write_durably

SUFFIX = ".batch"
TMP_MARK = ".tmp-"


class RolloutInbox:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob(f"*{SUFFIX}{TMP_MARK}*"):
            leftover.unlink(missing_ok=True)

    def _path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256 hex digest: {digest[:70]!r}")
        return self.directory / f"{digest}{SUFFIX}"

    def __contains__(self, digest: str) -> bool:
        return self._path(digest).exists()

    def store(self, envelope: bytes) -> tuple[str, bool]:
        """Write ``envelope`` durably; returns (digest, True) if new, (digest, False) if already held."""
        digest = hashlib.sha256(envelope).hexdigest()
        final = self._path(digest)
        if final.exists():
            return digest, False
        write_durably(final, envelope, tmp_suffix=f"{TMP_MARK}{os.getpid()}")
        return digest, True

    def pending(self) -> list[str]:
        """Digests of the held batches, oldest first."""
        paths = sorted(self.directory.glob(f"*{SUFFIX}"), key=lambda p: (p.stat().st_mtime, p.name))
        return [p.name[: -len(SUFFIX)] for p in paths]

    def load(self, digest: str) -> bytes:
        return self._path(digest).read_bytes()

    def remove(self, digest: str) -> None:
        """Forget a batch once its rows are consumed (trained on, or verdict given)."""
        self._path(digest).unlink(missing_ok=True)
