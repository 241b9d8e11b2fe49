"""The next delta's base, copied while the swarm works on the current step (specs/deltas.md 5a).

Why: a follower builds a step from a delta by copying its base file, applying the body and
hashing the result; the copy is the largest part (a 269 MB base: 0.1-0.3 s of a node's own, over
a second with four nodes on 2 cores; a 7B bf16 policy is 14 GB), and it needs nothing from the
delta. Made when a step completes here, it leaves the path from a trainer's step to the workers
generating on it; the build then moves the copy in (``ShardStore.take_copy``). The copy is never
trusted: the build hashes every shard of its result against the signed manifest.
"""

from __future__ import annotations

import trio

from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.protocol.lora import LORA_FORMAT


def next_base(store: ShardStore) -> Checkpoint | None:
    """The base the next delta will most likely name: the frozen base where the newest complete
    step is an adapter (adapters always apply to it), else the newest complete step (a sparse
    delta applies to its parent)."""
    newest = store.newest_complete()
    if newest is None:
        return None
    ref = newest.manifest.delta
    if ref is None or ref.format != LORA_FORMAT:
        return newest
    base = store.checkpoints.get(ref.base_step)
    if base is None or not base.complete or base.manifest.checkpoint_hash != ref.base_hash:
        return None
    return base


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
        """A step became complete here: copy the next delta's likely base (from trio's thread)."""
        self._wanted = next_base(self.store)
        if self._wanted is not None:
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
            if base is None or not base.complete or self.store.checkpoints.get(base.step) is not base:
                continue
            self._copying, self._copied = base, trio.Event()
            try:
                # a stopping node does not wait for a copy (minutes for a large policy); one
                # left half-made is a ``.tmp`` that the next copy or a restart deletes
                await trio.to_thread.run_sync(self.store.copy_ahead, base, abandon_on_cancel=True)
            finally:
                self._copying = None
                self._copied.set()
