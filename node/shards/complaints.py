"""Bad shards on gossip: the signed ``ShardComplaint`` this node makes, and those it hears.

A peer that served a shard whose hash the signed manifest refutes is penalised locally by the
fetcher; the complaint tells the rest of the run, whose peer books count it against the accused.
The newest ``MAX_COMPLAINTS_KEPT`` each way go into the overlay's status file.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from intellect_node.node.shards.fetcher import PeerBook
from intellect_node.node.shards.store import Checkpoint
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue
from intellect_node.protocol.manifest import ShardComplaint

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
MAX_COMPLAINTS_KEPT = 100


class ShardComplaints:
    def __init__(self, node: NodeContext, book: PeerBook, on_change: Callable[[], None]) -> None:
        self.node, self.book, self.on_change = node, book, on_change
        self.run_id = node.config.run_id
        self.made: deque[dict[str, Any]] = deque(maxlen=MAX_COMPLAINTS_KEPT)
        self.heard: deque[dict[str, Any]] = deque(maxlen=MAX_COMPLAINTS_KEPT)

    def on_gossip(self, signed: codec.Signed[ShardComplaint], raw: bytes) -> bool:
        complaint = signed.message
        if complaint.run_id != self.run_id:
            raise InvalidValue(f"complaint for run {complaint.run_id!r}")
        record = self.book.peers.get(complaint.accused)
        if record is not None:
            record.complaints += 1
        self.heard.append({"reporter": signed.signer_peer_id, "accused": complaint.accused,
                           "step": complaint.step, "shard": complaint.shard})
        self.on_change()
        return True

    def against(self, checkpoint: Checkpoint, shard: int, peer_id: str, digest: bytes) -> ShardComplaint:
        """The complaint that ``peer_id`` served ``digest`` for ``shard``, recorded here; ``publish`` gossips it."""
        complaint = ShardComplaint(run_id=self.run_id, step=checkpoint.step,
                                   checkpoint_hash=checkpoint.manifest.checkpoint_hash, shard=shard,
                                   accused=peer_id, received_hash=digest)
        self.made.append({"accused": peer_id, "step": checkpoint.step, "shard": shard})
        log.warning("peer %s served a bad shard %d of step %d; complaining", peer_id, shard, checkpoint.step)
        return complaint

    async def publish(self, complaint: ShardComplaint) -> None:
        try:
            await self.node.announce(complaint, lifetime_s=ShardComplaint.MAX_LIFETIME_S)
        except Exception as exc:  # gossip not ready or no peers: the local penalty still stands
            log.info("complaint could not be published: %s", exc)
