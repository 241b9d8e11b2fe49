"""``NodeContext``: the narrow view of the node that services and roles are given.

Why a protocol and not ``Node`` itself: a role written against ``Node`` could reach anything (the
DHT object, the pubsub router, the control socket), and a reader could not tell what a role
depends on. Every service and role module names this type instead; ``Node`` satisfies it, and
tests may pass any object that does. What is here is exactly what the roles use today:

- who we are and which run: ``peer_id``, ``identity``, ``config`` (the ``SwarmSettings``: ``run_id``,
  ``layout``, ``listen``);
- whom we know: ``view`` (the run's members), ``scores`` (the one ban path), ``connections``
  (mark peers proven or protected from trimming);
- how we talk: ``announce`` / ``publish_announcement`` / ``on_announcement`` on the run's
  announcements topic, ``provide`` / ``find_providers`` for DHT provider records, ``host`` for
  the few raw stream protocols (rollout delivery), and ``update_advert`` for what we advertise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from libp2p.abc import IHost

    from intellect_node.crypto.identity import Identity
    from intellect_node.node.swarm.connections import ConnectionManager
    from intellect_node.node.swarm.membership import MemberView
    from intellect_node.node.swarm.peer_scores import PeerScores
    from intellect_node.node.swarm.settings import SwarmSettings
    from intellect_node.protocol import codec
    from intellect_node.protocol.messages import Message


class NodeContext(Protocol):
    peer_id: str
    identity: Identity
    config: SwarmSettings
    view: MemberView
    scores: PeerScores
    connections: ConnectionManager
    host: IHost

    def on_announcement(self, cls: type[Message],
                        handler: Callable[[codec.Signed[Any], bytes], bool | None]) -> None:
        """Accept ``cls`` on the run's announcements topic; call before the node runs."""
        ...

    async def announce(self, message: Message, lifetime_s: float) -> bytes:
        """Sign and gossip ``message``; returns the envelope."""
        ...

    async def publish_announcement(self, envelope: bytes) -> None:
        """Gossip an envelope signed earlier (e.g. one recorded durably first)."""
        ...

    async def provide(self, key: str) -> bool: ...

    async def find_providers(self, key: str, count: int = 20) -> list[str]: ...

    def update_advert(self, *, policy_step: int | None = None, extra_addr: str | None = None) -> None: ...
