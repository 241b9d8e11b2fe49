"""``Announcements``: the run's announcements topic, shared by every service that gossips.

One topic carries several message types (checkpoint manifests, shard complaints, rollout
announcements, verdicts: specs/wire.md 4); each service registers the types it understands with a
handler before the node runs, and several may hear one type (each sees what the ones before
accepted). The topic accepts exactly those types, so a node that handles none of a kind drops it
as an unknown type (free for the forwarder) instead of relaying what it cannot judge; and its size
bound is the topic's own (``ANNOUNCE_MAX_BYTES``), not that of the types this node happens to handle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libp2p.pubsub.pubsub import Pubsub

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.gossip import install_validator
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec
from intellect_node.protocol.keys import ANNOUNCE_MAX_BYTES, announcements_topic
from intellect_node.protocol.messages import Message

# (signed message, raw envelope) -> False to drop quietly; raise Rejected to refuse.
AnnouncementHandler = Callable[[codec.Signed[Any], bytes], bool | None]


class Announcements:
    def __init__(self, run_id: str, identity: Identity, pubsub: Pubsub, scores: PeerScores) -> None:
        self.topic = announcements_topic(run_id)
        self.identity = identity
        self.pubsub = pubsub
        self.scores = scores
        self.handlers: dict[str, tuple[type[Message], list[AnnouncementHandler]]] = {}

    def on(self, cls: type[Message], handler: AnnouncementHandler) -> None:
        """Accept ``cls`` on the topic, and pass each one to ``handler`` too; call before ``install``."""
        self.handlers.setdefault(cls.TYPE, (cls, []))[1].append(handler)

    def install(self) -> bool:
        """Validate the topic's gossip by the registered types; False (nothing to subscribe) if none."""
        if not self.handlers:
            return False
        accepted = tuple(cls for cls, _ in self.handlers.values())
        install_validator(self.pubsub, self.topic, accepted, self.dispatch, self.scores, max_size=ANNOUNCE_MAX_BYTES)
        return True

    def dispatch(self, signed: codec.Signed[Any], raw: bytes) -> bool:
        """Accepted if every handler of its type accepts it, in the order they registered."""
        _, handlers = self.handlers[signed.message.TYPE]
        return all(handler(signed, raw) is not False for handler in handlers)

    async def announce(self, message: Message, lifetime_s: float) -> bytes:
        """Sign and gossip ``message``; returns the envelope."""
        envelope = codec.encode(message, self.identity, lifetime_s=lifetime_s)
        await self.publish(envelope)
        return envelope

    async def publish(self, envelope: bytes) -> None:
        """Gossip an envelope signed earlier (a verdict is recorded durably before it goes out)."""
        await self.pubsub.publish(self.topic, envelope)
