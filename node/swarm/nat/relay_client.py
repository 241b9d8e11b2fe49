"""Circuit relay v2, client side: a NATed node keeps slots on a few public relays and is dialed
through them; any node dials a ``/p2p-circuit`` address through here.

Why it is needed: py-libp2p 0.8.1's swarm drops every ``/p2p-circuit`` address before dialing (it
has no relay transport of its own), so ``host.connect`` cannot reach a NATed peer. Dialing goes
through upstream's ``CircuitV2Transport.dial`` instead, which opens the hop stream and upgrades it
(Noise, yamux) into an ordinary connection of the swarm; after that ``host.new_stream`` uses it
like any other. Reserving uses the transport's ``_make_reservation`` (one RESERVE on a fresh
stream); refreshing and choosing relays are ours (upstream's refresh worker only refreshes, and
never replaces a relay that went away).

A private node holds at most ``RELAY_SLOTS`` reservations, bootstrap peers first, refreshes each at
half its lifetime and replaces one whose relay disconnected or refused. Its relayed addresses are
``<the address it reached the relay at>/p2p/<relay>/p2p-circuit/p2p/<self>``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from intellect_node.node.swarm.nat.relay_service import HOP_PROTOCOL

log = logging.getLogger(__name__)
RELAY_SLOTS = 2
RESERVE_TIMEOUT_S = 10.0
REFUSED_BACKOFF_S = 300.0  # a peer that refused (no hop, full) is not asked again for this long
CIRCUIT = "/p2p-circuit"

# (relay peer id, the direct multiaddr to reach it, without /p2p/); bootstrap relays first
Candidates = Callable[[], list[tuple[str, str]]]


def is_relayed(addr: str) -> bool:
    return CIRCUIT in addr


@dataclass
class Held:
    """One reservation this node holds."""

    relay: str
    relay_addr: str  # /ip4/<ip>/tcp/<port>
    expires_at: float  # unix time, as the relay said
    reserved_at: float

    def circuit_addr(self, own_peer_id: str) -> str:
        return f"{self.relay_addr}/p2p/{self.relay}{CIRCUIT}/p2p/{own_peer_id}"


class RelayClient:
    """Reservations on relays while this node is private, and dialing of relayed addresses."""

    def __init__(self, host: IHost, protocol: CircuitV2Protocol) -> None:
        self.host = host
        self.transport = CircuitV2Transport(host, protocol, RelayConfig(roles=RelayRole.STOP))
        self.held: dict[str, Held] = {}
        self.refused: dict[str, float] = {}  # relay -> monotonic time of refusal
        self.reserve_outcomes: dict[str, int] = {"ok": 0, "refused": 0, "failed": 0}
        self.dials: dict[str, int] = {"ok": 0, "failed": 0}

    def relayed_addrs(self) -> list[str]:
        own = self.host.get_id().to_base58()
        return [held.circuit_addr(own) for held in self.held.values()]

    def status(self) -> dict[str, object]:
        now = time.time()
        return {"reservations": {h.relay: {"addr": h.relay_addr, "expires_in_s": round(h.expires_at - now)}
                                 for h in self.held.values()},
                "relayed_addrs": self.relayed_addrs(), "reserve_outcomes": dict(self.reserve_outcomes),
                "relayed_dials": dict(self.dials), **self.peers_by_path()}

    def peers_by_path(self) -> dict[str, list[str]]:
        """Connected peers reached only through a relay (every connection a circuit), and those
        with a direct connection (the ones a hole punch must leave behind when it works)."""
        relayed, direct = [], []
        for peer, conns in list(self.host.get_network().connections.items()):
            conns = conns if isinstance(conns, list) else [conns]
            addrs = [str(a) for conn in conns for a in _transport_addrs(conn)]
            if addrs and all(CIRCUIT in a for a in addrs):
                relayed.append(peer.to_base58())
            elif addrs:
                direct.append(peer.to_base58())
        return {"peers_through_relay": sorted(relayed), "peers_direct": sorted(direct)}

    async def keep(self, candidates: Candidates) -> bool:
        """One round: drop reservations whose relay is gone or expired, refresh those past half their
        lifetime, and fill up to RELAY_SLOTS from ``candidates``. True when the held set changed."""
        before = set(self.held)
        connected = {peer.to_base58() for peer in self.host.get_connected_peers()}
        now = time.time()
        for relay, held in list(self.held.items()):
            if relay not in connected or held.expires_at <= now:
                log.info("relay reservation on %s lost (%s)", relay,
                         "disconnected" if relay not in connected else "expired")
                del self.held[relay]
            elif now - held.reserved_at >= (held.expires_at - held.reserved_at) / 2:
                if not await self._reserve(relay, held.relay_addr):
                    del self.held[relay]
        for relay, addr in candidates():
            if len(self.held) >= RELAY_SLOTS:
                break
            refused_at = self.refused.get(relay)
            if relay in self.held or (refused_at is not None and time.monotonic() - refused_at < REFUSED_BACKOFF_S):
                continue
            await self._reserve(relay, addr)
        return set(self.held) != before

    def drop_all(self) -> bool:
        """No longer private: reservations lapse on their own; stop advertising them."""
        had = bool(self.held)
        self.held.clear()
        return had

    async def _reserve(self, relay: str, relay_addr: str) -> bool:
        peer = ID.from_base58(relay)
        with trio.move_on_after(RESERVE_TIMEOUT_S):
            try:
                stream = await self.host.new_stream(peer, [HOP_PROTOCOL])
            except Exception as exc:  # the peer offers no relay service (not public, or switched off)
                log.debug("relay %s: no hop stream: %s", relay, exc)
                self.refused[relay] = time.monotonic()
                self.reserve_outcomes["refused"] += 1
                return False
            try:
                ok = await self.transport._make_reservation(stream, peer)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                    try:
                        await stream.close()
                    except Exception:
                        pass
            if not ok:
                self.refused[relay] = time.monotonic()
                self.reserve_outcomes["refused"] += 1
                return False
            now = time.time()
            self.held[relay] = Held(relay, relay_addr, float(self.transport._reservations.get(peer, now)), now)
            self.reserve_outcomes["ok"] += 1
            log.info("relay reservation on %s (%s), %d s", relay, relay_addr, self.held[relay].expires_at - now)
            return True
        self.reserve_outcomes["failed"] += 1
        return False

    async def dial(self, addr: str) -> ID:
        """Open a connection to the peer at the end of a relayed address; its ID once connected.
        Raises on failure (the caller bounds the time)."""
        maddr = multiaddr.Multiaddr(addr)
        _, target = self.transport.parse_circuit_ma(maddr)
        if self.host.get_network().connections.get(target):
            return target
        try:
            await self.transport.dial(maddr)
        except BaseException:
            self.dials["failed"] += 1
            raise
        self.dials["ok"] += 1
        return target


def _transport_addrs(conn: object) -> list[object]:
    try:
        return list(conn.get_transport_addresses())  # type: ignore[attr-defined]
    except Exception:
        return []
