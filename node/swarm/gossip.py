"""Gossipsub for one run, with validators that decode, check and charge the forwarder.

A message passes only if it decodes as one of the topic's accepted types, its envelope signer is
the gossip originator (so a node cannot relay someone else's words as its own), and the topic's
handler accepts it. Anything else is dropped, never forwarded, counted and charged to the peer that
forwarded it: honest peers validate before forwarding, so they never pay for an attacker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import libp2p.pubsub.gossipsub as gossipsub_module
import libp2p.pubsub.pubsub as pubsub_module
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.pb.rpc_pb2 import RPC
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.utils import maybe_consume_signed_record

from intellect_node.node.swarm.guard import GuardedPubsub, StreamGuard
from intellect_node.node.swarm.mesh_router import SteadyGossipSub
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Rejected, SignerMismatch
from intellect_node.protocol.messages import Message

GOSSIPSUB_PROTOCOL = TProtocol("/meshsub/1.1.0")
MAX_GOSSIP_RPC = 1 << 20  # libp2p drops larger messages silently; we refuse them explicitly
Handler = Callable[[codec.Signed[Any], bytes], bool]
# Each message reaches a node once from every mesh peer that has it: the mesh's size is what a
# message costs every node (~1-2 ms of CPU per delivery in py-libp2p on this machine's cores,
# bench/HISTORY.md "Scale"), so the mesh is kept at 6 (4-8) where go-libp2p allows 12.
MESH_DEGREE, MESH_DEGREE_LOW, MESH_DEGREE_HIGH = 6, 4, 8


RECORD_RECHECK_S = 600.0  # a repeated sender record is consumed again this often (its addresses last 2 h)
MAX_SENDER_RECORDS = 4096  # (host, peer) pairs remembered; the oldest go first


class SenderRecords:
    """Every pubsub RPC carries its sender's signed peer record, and py-libp2p 0.8.1 verifies it
    (Ed25519, protobuf) and rewrites the peer's addresses on each one, twice: the pubsub reader and
    the gossipsub router both call ``maybe_consume_signed_record``. A peer repeats the same bytes on
    every RPC, so the bytes last accepted from each peer are remembered and a repeat is accepted
    without the work (a quarter of a connected node's CPU at rest, bench/HISTORY.md "Scale").
    Anything else (a new, changed or invalid record) takes libp2p's own path, and only bytes it
    accepted from that peer are remembered: a repeat is accepted as libp2p accepted it the first time."""

    def __init__(self) -> None:
        self._accepted: dict[tuple[Any, Any], tuple[bytes, float]] = {}

    def consume(self, msg: RPC, host: IHost, peer_id: ID) -> bool:
        if not msg.HasField("senderRecord"):
            return True
        key, record, now = (host.get_id(), peer_id), msg.senderRecord, time.monotonic()
        held = self._accepted.get(key)
        if held is not None and held[0] == record and now - held[1] < RECORD_RECHECK_S:
            return True
        if not maybe_consume_signed_record(msg, host, peer_id):
            return False
        self._accepted.pop(key, None)
        self._accepted[key] = (record, now)
        while len(self._accepted) > MAX_SENDER_RECORDS:
            del self._accepted[next(iter(self._accepted))]
        return True


SENDER_RECORDS = SenderRecords()
# py-libp2p looks the function up in each module's globals on every RPC
pubsub_module.maybe_consume_signed_record = SENDER_RECORDS.consume  # type: ignore[assignment]
gossipsub_module.maybe_consume_signed_record = SENDER_RECORDS.consume  # type: ignore[assignment]


def build_pubsub(host: IHost, *, messages_per_topic_per_s: float = 100.0,
                 guard: StreamGuard | None = None) -> tuple[Pubsub, SteadyGossipSub]:
    """The run's gossipsub; ``guard`` hears of every exception its reader or message tasks raise."""
    router = SteadyGossipSub(
        protocols=[GOSSIPSUB_PROTOCOL],
        degree=MESH_DEGREE, degree_low=MESH_DEGREE_LOW, degree_high=MESH_DEGREE_HIGH,
        heartbeat_interval=1, heartbeat_initial_delay=0.1,
        max_messages_per_topic_per_second=messages_per_topic_per_s,
        # py-libp2p's "adaptive gossip" widens the mesh (degree_high up to +4) whenever its health
        # score is low, which on a busy machine is always: meshes of 15-16 peers in a 24-node swarm
        adaptive_gossip_enabled=False,
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
