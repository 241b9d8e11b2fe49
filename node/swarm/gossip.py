"""Gossipsub for one run, with validators that decode, check and charge the forwarder.

A message passes only if it decodes as one of the topic's accepted types, its envelope signer is
the gossip originator (so a node cannot relay someone else's words as its own), and the topic's
handler accepts it. Anything else is dropped, never forwarded, counted and charged to the peer that
forwarded it: honest peers validate before forwarding, so they never pay for an attacker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub

from intellect_node.node.swarm.guard import GuardedPubsub, StreamGuard
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Rejected, SignerMismatch
from intellect_node.protocol.messages import Message

GOSSIPSUB_PROTOCOL = TProtocol("/meshsub/1.1.0")
MAX_GOSSIP_RPC = 1 << 20  # libp2p drops larger messages silently; we refuse them explicitly
Handler = Callable[[codec.Signed[Any], bytes], bool]


def build_pubsub(host: IHost, *, messages_per_topic_per_s: float = 100.0,
                 guard: StreamGuard | None = None) -> tuple[Pubsub, GossipSub]:
    """The run's gossipsub; ``guard`` hears of every exception its reader or message tasks raise."""
    router = GossipSub(
        protocols=[GOSSIPSUB_PROTOCOL],
        degree=6, degree_low=4, degree_high=12,
        heartbeat_interval=1, heartbeat_initial_delay=0.1,
        max_messages_per_topic_per_second=messages_per_topic_per_s,
    )
    pubsub = GuardedPubsub(host, router, max_inbound_rpc_size=MAX_GOSSIP_RPC, guard=guard)
    return pubsub, router


def install_validator(pubsub: Pubsub, topic: str, accept: tuple[type[Message], ...], handler: Handler,
                      scores: PeerScores, max_size: int | None = None) -> None:
    """``handler(signed, raw)`` returns False to drop quietly (a duplicate) or raises ``Rejected``.

    ``max_size``: the topic's bound when it carries more types than ``accept`` (specs/wire.md 4)."""

    def validate(forwarder: ID, msg: Any) -> bool:
        forwarder_id = forwarder.to_base58()
        try:
            signed = codec.decode(msg.data, accept, max_size=max_size)
            if ID(msg.from_id).to_base58() != signed.signer_peer_id:
                raise SignerMismatch("gossip originator is not the envelope signer")
            return handler(signed, msg.data) is not False
        except Rejected as exc:
            scores.reject(forwarder_id, exc.reason, f"gossip on {topic}: {exc}")
            return False
        except ValueError as exc:  # a from_id that is not a peer id
            scores.reject(forwarder_id, "malformed", f"gossip on {topic}: {exc}")
            return False

    pubsub.set_topic_validator(topic, validate, False)
