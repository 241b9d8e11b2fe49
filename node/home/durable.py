"""The one durable writer: what is acknowledged to a peer, or needed after a crash, survives it.

Replacing a file: write to a temporary name, fsync it, rename over the target, fsync the
directory. After a crash the target holds either the old bytes or the new ones, never a mix, and a
leftover temporary file is recognisable by its name. Appending a line (ledgers, metrics): write,
flush, fsync, so a line the caller moved past is on disk.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(path: Path, data: bytes, tmp_suffix: str = ".tmp", mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically; ``mode`` applies from the first byte (secrets: 0o600)."""
    tmp = path.with_name(path.name + tmp_suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with open(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def append_durably(path: Path, line: str) -> None:
    """Append one line (a newline is added) and fsync it before returning."""
    with open(path, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def rename_durably(source: Path, target: Path) -> None:
    """Move a finished file or directory into place; the rename itself survives a crash."""
    os.replace(source, target)
    fsync_directory(target.parent)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: Path) -> None:
    """Make renames and creations inside ``path`` durable (the directory entry, not the data)."""
    fsync_file(path)
