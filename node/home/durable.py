"""Durable file replacement: what is acknowledged to a peer must survive a crash.

Write to a temporary name, fsync it, rename over the target, fsync the directory: after a crash
the target holds either the old bytes or the new ones, never a mix, and a leftover temporary file
is recognisable by its name.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(path: Path, data: bytes, tmp_suffix: str = ".tmp") -> None:
    tmp = path.with_name(path.name + tmp_suffix)
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
