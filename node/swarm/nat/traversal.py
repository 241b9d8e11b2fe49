"""``NatTraversal``: a running node's side of NAT, from "are we dialable" to "be reached anyway".

The parts in this folder each do one thing; this decides when they act and what comes of it:
dial-back checks soon after joining, again while nobody has answered, then every
``REACHABILITY_RECHECK_S``; the relay hop offered only while public; reservations held only while
private, on connected members with a direct address; and which of our addresses an advert may
carry (``advertised``). Whatever changes the advert is reported through ``on_change``, so peers
stop dialing a private address quickly instead of at the next refresh (specs/reachability.md).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.peerinfo import PeerInfo

from intellect_node.node.swarm.bootstrap import OK, UNREACHABLE, Attempt
from intellect_node.node.swarm.connections import ConnectionManager
from intellect_node.node.swarm.host import listen_addrs
from intellect_node.node.swarm.membership import MemberView
from intellect_node.node.swarm.nat.holepunch import CountingDCUtR
from intellect_node.node.swarm.nat.reachability import DialBackServer, Reachability, check, tcp_port
from intellect_node.node.swarm.nat.relay_client import RelayClient, is_relayed
from intellect_node.node.swarm.nat.relay_service import RelayService, relay_limits
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.settings import SwarmSettings

log = logging.getLogger(__name__)
REACHABILITY_RETRY_S = (1.0, 5.0, 10.0)  # after joining, while no peer has answered
REACHABILITY_RECHECK_S = 300.0  # addresses and NATs change; a decided node asks again this often
RELAY_KEEP_S = 5.0  # while private: how often reservations are checked, refreshed and filled


class NatTraversal:
    def __init__(self, host: IHost, scores: PeerScores, settings: SwarmSettings, view: MemberView,
                 connections: ConnectionManager, on_change: Callable[[], None]) -> None:
        self.host = host
        self.settings = settings
        self.view = view  # where relay candidates come from
        self.connections = connections  # a held relay is protected from trimming
        self.on_change = on_change
        self.reachability = Reachability()
        self.dialback = DialBackServer(host, scores)
        self.relay = RelayService(host, relay_limits(settings.relay_max_reservations, settings.relay_reservation_ttl_s,
                                                     settings.relay_circuit_duration_s, settings.relay_circuit_bytes))
        self.relay_client = RelayClient(host, self.relay)
        self.holepunch = CountingDCUtR(host)

    def install(self) -> None:
        """Answer peers' dial-back requests (once the host runs)."""
        self.dialback.install()

    def advertised(self, addrs: list[str], data_addrs: list[str]) -> list[str]:
        """Of our libp2p and data-plane addresses, those peers can use, as reachability allows
        (node/swarm/nat/reachability.py), with the relayed ones while private."""
        relayed = self.relay_client.relayed_addrs() if self.reachability.state == "private" else []
        return [*self.reachability.advertised(addrs), *relayed, *self.reachability.advertised_data(data_addrs)]

    async def dial_relayed(self, addr: str, source: str) -> Attempt:
        """A ``/p2p-circuit`` address: through the relay it names (libp2p's own dial skips these)."""
        timeout_s = self.settings.connect_timeout_s
        failure = f"no relayed connection within {timeout_s:g} s"
        with trio.move_on_after(timeout_s):
            try:
                peer = await self.relay_client.dial(addr)
                return Attempt(addr, source, OK, peer=PeerInfo(peer, []))
            except Exception as exc:  # noqa: BLE001 - bad address, relay gone, no reservation, handshake
                failure = str(exc)
        return Attempt(addr, source, UNREACHABLE, failure)

    async def reachability_loop(self) -> None:
        """Ask connected peers to dial this node back: soon after joining, again while nobody has
        answered, then every REACHABILITY_RECHECK_S. A changed verdict re-signs the advert (settled)."""
        delays = iter(REACHABILITY_RETRY_S)
        while True:
            decided = self.reachability.state != "unknown"
            await trio.sleep(REACHABILITY_RECHECK_S if decided else next(delays, REACHABILITY_RETRY_S[-1]))
            port = tcp_port(listen_addrs(self.host))
            peers = self.host.get_connected_peers()
            if port is None or not peers:
                continue
            random.shuffle(peers)
            before = (self.reachability.state, self.reachability.observed_ip)
            self.reachability = await check(self.host, peers, port, self.reachability)
            self.relay.set_hop(self.reachability.state == "public" and self.settings.relay_service)
            if self.reachability.state != "private":
                self.relay_client.drop_all()
            if (self.reachability.state, self.reachability.observed_ip) != before:
                log.info("reachability: %s (observed IP %s)", self.reachability.state, self.reachability.observed_ip)
                self.on_change()

    async def relay_loop(self) -> None:
        """While private: hold reservations on up to RELAY_SLOTS public peers, bootstrap peers first
        (node/swarm/nat/relay_client.py); a change of the relayed addresses re-signs the advert (settled)."""
        while True:
            await trio.sleep(RELAY_KEEP_S)
            if self.reachability.state != "private":
                continue
            if await self.relay_client.keep(self._relay_candidates):
                log.info("relayed addresses: %s", self.relay_client.relayed_addrs() or "none")
                self.on_change()
            for relay in self.relay_client.held:
                self.connections.protect(relay, "relay")

    def _relay_candidates(self) -> list[tuple[str, str]]:
        """Connected members with a direct address, as (peer id, address without /p2p/): bootstrap
        peers first, then the rest in random order (so NATed nodes spread over the relays)."""
        own = self.host.get_id().to_base58()
        connected = {peer.to_base58() for peer in self.host.get_connected_peers()}
        bootstrap = {addr.rsplit("/p2p/", 1)[-1] for addr in self.settings.bootstrap}
        found = []
        for member in self.view.members():
            peer_id = member.advert.peer_id
            direct = [a for a in member.advert.addrs if "/p2p/" in a and not is_relayed(a)]
            if peer_id != own and peer_id in connected and direct:
                found.append((peer_id, direct[0][:direct[0].index("/p2p/")]))
        random.shuffle(found)
        return sorted(found, key=lambda item: item[0] not in bootstrap)

    def status(self) -> dict[str, Any]:
        """The ``reachability`` and ``relay`` parts of ``intellect-node status``."""
        return {"reachability": {**self.reachability.summary(), "dialbacks_served": dict(self.dialback.outcomes)},
                "relay": {**self.relay.status(), **self.relay_client.status(), "hole_punches": self.holepunch.status()}}
