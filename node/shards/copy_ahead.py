"""The next delta's base, copied while the swarm works on the current step (specs/deltas.md 5a).

Why: a follower builds a step from a delta by copying its base file, applying the body and
hashing the result; the copy is the largest part (a 269 MB base: 0.1-0.3 s of a node's own, over
a second with four nodes on 2 cores; a 7B bf16 policy is 14 GB), and it needs nothing from the
delta. Made when a step completes here, it leaves the path from a trainer's step to the workers
generating on it; the build then moves the copy in (``take_copy``). The copy is never trusted:
the build hashes every shard of its result against the signed manifest. A run whose steps ship in
full wants no copy: none is made, and one made before is deleted (a full checkpoint's worth of disk).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import trio

from intellect_node.node.home.durable import fsync_file
from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.protocol.lora import LORA_FORMAT

log = logging.getLogger(__name__)
COPY_AHEAD = "copy-ahead-"  # a base copied for the next delta; never a step (a restart deletes it)


def next_base(store: ShardStore) -> Checkpoint | None:
    """The base the next delta will most likely name: the frozen base where the newest complete
    step is an adapter (adapters always apply to it), else the newest complete step (a sparse
    delta applies to its parent). None where the two newest complete steps both shipped in full: a
    run that ships no deltas (a dense fp32 policy, deltas switched off) would have every follower
    copy the whole checkpoint each step for nothing."""
    complete = sorted((c for c in store.held() if c.complete), key=lambda c: c.step)
    if not complete or (len(complete) > 1 and all(c.manifest.delta is None for c in complete[-2:])):
        return None
    newest = complete[-1]
    ref = newest.manifest.delta
    if ref is None or ref.format != LORA_FORMAT:
        return newest
    base = store.checkpoints.get(ref.base_step)
    if base is None or not base.complete or base.manifest.checkpoint_hash != ref.base_hash:
        return None
    return base


def copy_base(store: ShardStore, base: Checkpoint) -> bool:
    """Copy complete ``base``'s data file for the next delta built on it, deleting any other such
    copy; False where the disk has no room for it and a step beside it, or the base went meanwhile.
    Blocking (a worker thread)."""
    ready = _copy_path(store, base)
    if ready.exists():
        return True
    drop_copies(store)
    if shutil.disk_usage(store.root).free < 2 * base.manifest.total_size:
        return False
    partial = store.root / (ready.name + ".tmp")
    try:
        shutil.copyfile(base.data_path, partial)
        fsync_file(partial)  # its blocks allocated and written now: the step's build overwrites them in place
        os.rename(partial, ready)
    except OSError as exc:  # pruned, or the disk filled meanwhile: the build copies then
        log.info("no copy of step %d ahead: %s", base.step, exc)
        partial.unlink(missing_ok=True)
        return False
    return True


def drop_copies(store: ShardStore) -> None:
    """Delete every copy made ahead (and a half-made one). Blocking (a worker thread)."""
    for old in store.root.glob(COPY_AHEAD + "*"):
        old.unlink(missing_ok=True)


def take_copy(store: ShardStore, base: Checkpoint, target: Path) -> bool:
    """Move a whole copy of ``base`` made ahead to ``target`` (a partial step's data file); False
    where there is none (or another thread's new copy deleted it first)."""
    try:
        os.replace(_copy_path(store, base), target)
    except FileNotFoundError:
        return False
    return True


def _copy_path(store: ShardStore, base: Checkpoint) -> Path:
    return store.root / f"{COPY_AHEAD}{base.step:012d}-{base.manifest.checkpoint_hash.hex()[:16]}"


def same_step(a: Checkpoint | None, b: Checkpoint) -> bool:
    return a is not None and a.step == b.step and a.manifest.checkpoint_hash == b.manifest.checkpoint_hash


class CopyAhead:
    """One copy at a time, in a worker thread, of the base ``next_base`` names after each
    completion; a build on that base waits for a copy under way instead of copying it twice."""

    def __init__(self, store: ShardStore) -> None:
        self.store = store
        self._wanted: Checkpoint | None = None
        self._copying: Checkpoint | None = None
        self._copied = trio.Event()
        self._wake = trio.Event()

    def after_completion(self) -> None:
        """A step became complete here: copy the next delta's likely base, or drop the copy where
        none is wanted (from trio's thread)."""
        self._wanted = next_base(self.store)
        self._wake.set()

    async def settled(self, base: Checkpoint) -> None:
        """Return once no copy of ``base`` is under way (the build then takes it, whole)."""
        while same_step(self._copying, base):
            await self._copied.wait()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            base, self._wanted = self._wanted, None
            if base is None:
                await trio.to_thread.run_sync(drop_copies, self.store)
                continue
            if not base.complete or self.store.checkpoints.get(base.step) is not base:
                continue
            self._copying, self._copied = base, trio.Event()
            try:
                # a stopping node does not wait for a copy (minutes for a large policy); one
                # left half-made is a ``.tmp`` that the next copy or a restart deletes
                await trio.to_thread.run_sync(copy_base, self.store, base, abandon_on_cancel=True)
            finally:
                self._copying = None
                self._copied.set()
