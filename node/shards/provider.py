"""Provider records: what this node holds, told to the DHT, and a shard's holders, found in it.

The overlay's ``ShardService`` hands every step (its manifest) and verified shard it holds to
``ShardProvider``, which puts one provider record at a time in the DHT, spaced out: each put costs
CPU on every node it touches, and a burst mid-transfer would take it from the transfer. The other
way, ``providers_of`` finds a shard's holders for ``CheckpointFetch`` (peers outside the members
whose have-maps it watches).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from intellect_node.node.shards.store import Checkpoint
from intellect_node.protocol.manifest import manifest_key, shard_key

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
PROVIDE_GAP_S = 0.2  # between provider records: DHT puts cost CPU on every node they touch
PROVIDE_QUEUE = 100_000


class ShardProvider:
    def __init__(self, node: NodeContext) -> None:
        self.node = node
        self.run_id = node.config.run_id
        self._send, self._queue = trio.open_memory_channel[str](PROVIDE_QUEUE)

    def provide_held(self, checkpoint: Checkpoint) -> None:
        self.provide_manifest(checkpoint.step)
        self.provide_shards(checkpoint)

    def provide_manifest(self, step: int) -> None:
        self._provide(manifest_key(self.run_id, step))

    def provide_shards(self, checkpoint: Checkpoint) -> None:
        for index, mark in enumerate(checkpoint.verified):
            if mark:
                self._provide(shard_key(self.run_id, checkpoint.step, index))

    def _provide(self, key: str) -> None:
        try:
            self._send.send_nowait(key)
        except trio.WouldBlock:
            log.debug("provide queue full, skipping %s", key)

    async def provide_loop(self) -> None:
        """Provider records one at a time, spaced out: they matter to peers outside the have-map
        watchers, and a burst of DHT puts mid-transfer would take CPU from the transfer itself."""
        async for key in self._queue:
            await self.node.provide(key)
            await trio.sleep(PROVIDE_GAP_S)

    def providers_of(self, step: int) -> Callable[[int], Awaitable[list[str]]]:
        async def find(shard: int) -> list[str]:
            return await self.node.find_providers(shard_key(self.run_id, step, shard))
        return find
