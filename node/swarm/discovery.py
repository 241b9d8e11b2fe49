"""``Discovery``: finding the run's members and keeping enough of them connected.

Three sources, each covering what the others miss: the DHT provider record of the run (members
whose adverts gossip has not brought), the members exchange with one random peer a round
(anti-entropy, for a node that fell behind on gossip), and dialing known members until
``TARGET_CONNECTIONS`` are connected. Right after joining, the same steps run on a faster schedule
(``catch_up``), because a new swarm is a star around its bootstrap and waits otherwise.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import IHost
from libp2p.kad_dht.kad_dht import KadDHT

from intellect_node.node.swarm.bootstrap import Attempt, dial
from intellect_node.node.swarm.connections import ConnectionManager
from intellect_node.node.swarm.dht_get import DHT_TIMEOUT_S, bounded_get
from intellect_node.node.swarm.member_exchange import MemberExchange
from intellect_node.node.swarm.membership import MemberView, check_advert_record
from intellect_node.node.swarm.nat.relay_client import is_relayed
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.settings import SwarmSettings
from intellect_node.protocol.keys import advert_key, run_members_key

log = logging.getLogger(__name__)
TARGET_CONNECTIONS = 8
EARLY_PULLS_AT_S = (1.0, 2.0, 4.0, 8.0)  # seconds after joining: pull the adverts a random peer holds


class Discovery:
    def __init__(self, host: IHost, dht: KadDHT, settings: SwarmSettings, view: MemberView, scores: PeerScores,
                 connections: ConnectionManager, members: MemberExchange,
                 dial_relayed: Callable[[str, str], Awaitable[Attempt]]) -> None:
        """``dial_relayed(addr, source)``: how a ``/p2p-circuit`` address is dialed (``NatTraversal``)."""
        self.host = host
        self.dht = dht
        self.settings = settings
        self.view = view
        self.scores = scores
        self.connections = connections
        self.members = members
        self.dial_relayed = dial_relayed
        self.peer_id = host.get_id().to_base58()

    async def connect(self, addr: str, source: str = "member") -> Attempt:
        """Dial ``addr`` (directly or through its relay), put the peer in the DHT routing table and
        exchange adverts with it; a bootstrap peer is protected from connection trimming."""
        if is_relayed(addr):
            attempt = await self.dial_relayed(addr, source)
        else:
            attempt = await dial(self.host, addr, source, self.settings.connect_timeout_s)
        if attempt.ok and attempt.peer is not None:
            peer = attempt.peer.peer_id
            if source == "bootstrap":
                self.connections.protect(peer.to_base58(), "bootstrap")
            with trio.move_on_after(self.settings.connect_timeout_s):
                await self.dht.routing_table.add_peer(peer)
                await self.members.exchange(peer)
        return attempt

    async def run(self) -> None:
        """Find members gossip has not brought, and pull from one peer in case gossip fell behind.

        Gossip is push-only: a node that was starved of CPU or cut off for a while has no way to
        catch up from it. So each round also exchanges adverts with one random connected peer
        (anti-entropy: one small stream), besides the DHT provider lookup for unknown members.
        """
        while True:
            await trio.sleep(self.settings.discovery_s)
            await self._discover_through_dht()
            await self.connect_to_members()
            await self.members.pull_from_random_peer()

    async def _discover_through_dht(self) -> None:
        run_id = self.settings.run_id
        with trio.move_on_after(DHT_TIMEOUT_S):
            try:
                providers = await self.dht.find_providers(run_members_key(run_id), 20)
            except Exception as exc:
                log.debug("provider lookup failed: %s", exc)
                return
            for info in providers:
                peer_id = info.peer_id.to_base58()
                if peer_id == self.peer_id or self.view.get(peer_id) is not None:
                    continue
                key = advert_key(run_id, peer_id)
                value = await bounded_get(self.dht, key, check_advert_record, self.scores, owner=info.peer_id)
                if value is not None:
                    self.members.accept(value, delivered_by=None)

    async def catch_up(self) -> None:
        """Spread our advert and learn the members who join right after us, without waiting for
        the first discovery round (``discovery_s``).

        A new swarm is a star around its bootstrap, whose gossip mesh keeps only 6-12 peers: a
        member outside it reaches nobody until the first discovery round. So: dial the members
        the join exchange named at once, and again once later joiners have arrived, and pull the
        adverts a random peer holds a few times in the first seconds (each pull carries ours
        too); the advertiser gossips the advert once the join settled and a mesh exists
        (``Advertiser.run``). In a 20-node start on 2 cores, gossip took several gossip
        heartbeats per hop while every node was busy joining, and the last joiners' adverts
        reached some nodes only through their first discovery round (bench/HISTORY.md).
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pull_early)
            await self.connect_to_members()
            await trio.sleep(1.0)
            await self.connect_to_members()

    async def _pull_early(self) -> None:
        joined_at = trio.current_time()
        for at in EARLY_PULLS_AT_S:
            await trio.sleep_until(joined_at + at)
            await self.members.pull_from_random_peer()

    async def connect_to_members(self) -> None:
        """Keep at least TARGET_CONNECTIONS peers, dialing members we know but are not connected to.

        One at a time: dialing all missing peers at once (libp2p's ``connect`` takes 250 ms of
        wall time, 14 ms of CPU) made a 20-node start on 2 cores a storm of handshakes, over 100 of
        which timed out (5 s). In random order: every joiner learns the same member list from its
        bootstrap, and in list order all of them dialed the same first few members at once, whose
        handshakes then timed out and who heard no gossip meanwhile.
        """
        connected = {peer.to_base58() for peer in self.host.get_connected_peers()}
        members = self.view.members()
        random.shuffle(members)
        for member in members:
            if len(connected) >= TARGET_CONNECTIONS:
                return
            peer_id = member.advert.peer_id
            if peer_id == self.peer_id or peer_id in connected or self.scores.is_banned(peer_id):
                continue
            for addr in member.advert.addrs:
                if "/p2p/" in addr and (await self.connect(addr)).ok:
                    connected.add(peer_id)
                    break
