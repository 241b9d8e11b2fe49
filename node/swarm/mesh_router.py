"""``SteadyGossipSub``: py-libp2p's gossipsub router with the mesh upkeep the v1.1 spec describes,
and counts of the control traffic it sends and hears.

Why (bench/HISTORY.md "Scale"): py-libp2p 0.8.1 runs three extra mesh maintenances on every 1 s
heartbeat where the spec runs one a minute or none, and each costs every node a share of a core that
grows with the swarm:

- **opportunistic grafting** grafts up to 2 peers per heartbeat whose score is at least half the
  mesh's median. With no score weights set every score is 0, so every peer outside the mesh
  qualifies: the mesh goes past ``degree_high`` each second and is pruned back, 2 GRAFTs and 2-3
  PRUNEs a second on every node for as long as it runs, as long as there are peers outside its mesh
  and out of backoff (at N=10 they all sit in their 60 s prune backoff; at N=100 ~90 never do).
  Here it runs as the spec says: every ``OPPORTUNISTIC_GRAFT_TICKS`` heartbeats, only when the mesh's
  median score is below the threshold, grafting only peers that score above that median.
- **IP diversity grafting** grafts 2 more per heartbeat while the mesh holds fewer than 3 addresses
  (a mesh of relayed or co-located peers can never get there): on the same once-a-minute tick.
- **mesh quality upkeep** swaps the worst-scored mesh peer for a better one on every heartbeat, a
  PRUNE and a GRAFT each time scores move; not in the spec, and the spec's opportunistic grafting
  already brings better peers in: off.

And gossip (IHAVE) goes to a fixed ``GOSSIP_PEERS`` peers outside the mesh per heartbeat, where
py-libp2p sends it to a quarter of them (go-libp2p's GossipFactor 0.25): 23 peers a second at 99
connections, each an RPC that costs ~1 ms in this Python stack. The mesh delivers every message
and the members protocol's pulls repair what a mesh misses (specs/dht.md), so gossip's repair goes
to one peer a heartbeat: 3 peers cost a light member 2.4 IHAVE RPCs a second sent (and as many
received) at N=10 and 25, about a third of its gossip at rest (bench/scale.py, 2026-12-06), for a
repair the mesh seldom needs.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any, DefaultDict

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2

OPPORTUNISTIC_GRAFT_TICKS = 60  # heartbeats between opportunistic grafts (the spec's default: 1 min at 1 s)
OPPORTUNISTIC_GRAFT_PEERS = 2
OPPORTUNISTIC_GRAFT_THRESHOLD = 0.0  # a mesh whose median score is below this takes better peers
GOSSIP_PEERS = 1  # peers outside the mesh told of recent message ids each heartbeat (IHAVE)
CONTROL_KINDS = ("ihave", "iwant", "graft", "prune")


class SteadyGossipSub(GossipSub):
    """GossipSub whose mesh changes only when a mesh is under or over its bounds, a peer leaves, or
    once a minute to take better-scored peers; ``rpcs`` counts what it sends and hears, by kind."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heartbeats = 0
        self.rpcs: dict[str, Counter[str]] = {"sent": Counter(), "received": Counter()}

    # ---- mesh upkeep ---------------------------------------------------------------------

    def mesh_heartbeat(self) -> tuple[DefaultDict[ID, list[str]], DefaultDict[ID, list[str]]]:
        self.heartbeats += 1
        return super().mesh_heartbeat()

    def _on_slow_tick(self) -> bool:
        return self.heartbeats % OPPORTUNISTIC_GRAFT_TICKS == 0

    def _perform_opportunistic_grafting(self, topic: str, peers_to_graft: DefaultDict[ID, list[str]]) -> int:
        if self.scorer is None or self.pubsub is None or not self._on_slow_tick():
            return 0
        mesh = self.mesh.get(topic, set())
        if not mesh:
            return 0
        median = statistics.median(self.scorer.score(peer, [topic]) for peer in mesh)
        if median >= OPPORTUNISTIC_GRAFT_THRESHOLD:
            return 0
        better = [peer for peer in self.pubsub.peer_topics.get(topic, set())
                  if peer not in mesh and not self._check_back_off(peer, topic)
                  and self.scorer.score(peer, [topic]) > median]
        chosen = random.sample(better, min(OPPORTUNISTIC_GRAFT_PEERS, len(better)))
        for peer in chosen:
            mesh.add(peer)
            self._notify_mesh_peer_added(peer, topic)
            self.scorer.on_join_mesh(peer, topic)
            peers_to_graft[peer].append(topic)
        return len(chosen)

    def _ensure_mesh_diversity(self, topic: str) -> list[ID]:
        if not self._on_slow_tick():
            return []
        return super()._ensure_mesh_diversity(topic)

    async def _maintain_mesh_quality(self, topic: str) -> None:
        return None

    def _get_adaptive_gossip_peers_count(self, topic: str, total_peers: int) -> int:
        return GOSSIP_PEERS

    # ---- counts --------------------------------------------------------------------------

    def send_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, priority: bool = False) -> None:
        sent = self.rpcs["sent"]
        sent["rpcs"] += 1
        sent["messages"] += len(rpc.publish)
        _count_control(sent, rpc.control)
        super().send_rpc(peer_id, rpc, priority)

    async def handle_rpc(self, rpc: rpc_pb2.RPC, sender_peer_id: ID) -> None:
        # pubsub hands the router only the RPCs that carry control entries (messages go elsewhere)
        _count_control(self.rpcs["received"], rpc.control)
        await super().handle_rpc(rpc, sender_peer_id)

    def rpc_counts(self) -> dict[str, dict[str, int]]:
        """``sent``: RPCs, messages and control entries; ``received``: control entries."""
        return {direction: dict(counts) for direction, counts in self.rpcs.items()}


def _count_control(counts: Counter[str], control: rpc_pb2.ControlMessage) -> None:
    for kind in CONTROL_KINDS:
        entries: Sequence[Any] = getattr(control, kind)
        counts[kind] += len(entries)
