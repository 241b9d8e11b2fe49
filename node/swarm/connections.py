"""Inbound admission and a connection manager for the libp2p host (specs/connections.md).

py-libp2p 0.8.1 takes an inbound slot per connection and returns it only when the swarm ends (its
inbound handler waits for the whole swarm after the upgrade), so a node goes deaf after about 250
connections in its life. ``ConnectionManager`` takes over the swarm's inbound path: it does the
same gate check and upgrade, then waits for *that connection* to close and frees its slot. Around
that it adds what a node open to the internet needs:

- admission caps on unproven peers per IP, per /24 and per /16 (IPv6: per address, /64 and /48),
  and on inbound connections in total, so one host or address range cannot take every slot;
- eviction when the inbound table is full (go-libp2p's resource manager refuses, its connection
  manager trims later; a node that only refuses stays full while an attacker reconnects): a
  newcomer from an under-represented range takes the slot of the oldest idle unproven connection
  of the most represented range (``pick_victim``);
- a deadline on the inbound handshake (security and muxer), so a half-open connection cannot
  sit on a slot;
- go-libp2p connmgr-style trimming: above ``high_water`` connections, close unprotected ones
  past their grace period down to ``low_water``, unproven before proven, idle before busy,
  newest first;
- protection for the peers that matter (the run's trainer, peers with accepted work or verified
  checkpoints, bootstrap and relay peers this node chose), given by tag through ``protect``.

Every refusal is counted by reason in ``status()``; nothing a remote sends can raise out of here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import trio
from libp2p.abc import IHost, IMuxedConn, INetConn
from libp2p.io.abc import ReadWriteCloser
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID
from multiaddr import Multiaddr

log = logging.getLogger(__name__)
MAX_PROVEN = 10_000  # peers remembered as proven, most recently proven kept
EVICT_CLOSE_S = 1.0  # an evicted slot's task gives closing its connection this long
CAP_REASONS = ("per_ip", "per_24", "per_16")  # refusal reasons, one per level of ``address_keys``


@dataclass(frozen=True)
class ConnectionPolicy:
    """Limits of one node. The defaults suit a public bootstrap node; py-libp2p's own
    ``max_connections`` (300, both directions) stays above ``max_inbound`` so outbound dials
    this node chooses always have room."""

    max_inbound: int = 200
    high_water: int = 160
    low_water: int = 120
    unproven_per_ip: int = 32
    unproven_per_24: int = 64  # IPv6: per /64
    unproven_per_16: int = 128  # IPv6: per /48
    evict: bool = True  # False: refuse ``inbound_full`` as py-libp2p and this node did before
    handshake_deadline_s: float = 5.0
    grace_s: float = 20.0
    trim_every_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 <= self.low_water <= self.high_water:
            raise ValueError(f"need 0 <= low_water ({self.low_water}) <= high_water ({self.high_water})")
        if min(self.max_inbound, self.unproven_per_ip, self.unproven_per_24, self.unproven_per_16) < 1:
            raise ValueError("max_inbound and the per-IP, per-/24 and per-/16 caps must be at least 1")
        if not self.unproven_per_ip <= self.unproven_per_24 <= self.unproven_per_16:
            raise ValueError(f"need unproven_per_ip ({self.unproven_per_ip}) <= unproven_per_24 "
                             f"({self.unproven_per_24}) <= unproven_per_16 ({self.unproven_per_16})")


Ranges = tuple[str, str, str]  # (host, narrow range, wide range) of one remote address


def address_keys(ip: str) -> Ranges:
    """The ranges a remote address counts against: /32, /24 and /16 for IPv4; /128, /64 and /48
    for IPv6 (a /64 is one site's, a /48 one organisation's usual allocation).

    Each 127.x.y.z is its own host, so loopback tests stand in for machines: 127.1.1.z and
    127.2.2.z are different /24s and /16s. An unparsable address gets its own text as every key:
    it still counts, it never raises.
    """
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ip, ip, ip
    bits = (32, 24, 16) if addr.version == 4 else (128, 64, 48)
    host, narrow, wide = (str(ipaddress.ip_network(f"{ip}/{b}", strict=False)) for b in bits)
    return host, narrow, wide


@dataclass(eq=False)
class _Slot:
    """One inbound connection from accept to close; ``peer_id`` and ``muxed`` are known once the
    handshake ends. Eviction cancels ``scope``, and the slot's own task closes the connection."""

    ranges: Ranges
    peer_id: str | None = None
    muxed: IMuxedConn | None = None
    opened: float = field(default_factory=time.monotonic)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)  # cancelled: evicted


class ConnectionManager:
    """Owns the host's inbound path and trims its connections; ``run`` is its background task."""

    def __init__(self, host: IHost, policy: ConnectionPolicy | None = None) -> None:
        self.policy = policy or ConnectionPolicy()
        self._swarm = host.get_network()
        self._slots: set[_Slot] = set()
        self._changes = 0  # bumped whenever the census below may be stale
        self._census_cache: _Census | None = None
        self._protected: dict[str, set[str]] = {}  # peer id -> tags
        self._proven: dict[str, None] = {}  # insertion-ordered; the oldest go past MAX_PROVEN
        self.accepted = 0
        self.trimmed = 0
        self.evicted = 0
        self.refused: Counter[str] = Counter()
        self._trim_wanted = trio.Event()
        # The listener's handler looks this attribute up per connection, so an instance attribute
        # replaces the upstream inbound path without touching the installed package.
        self._swarm._handle_inbound_connection = self._handle_inbound  # type: ignore[attr-defined]

    # ---- who matters -----------------------------------------------------------------------

    def protect(self, peer_id: str, tag: str) -> None:
        """Never trim ``peer_id`` while any tag holds (e.g. "trainer", "bootstrap", "relay").

        Mirrored into py-libp2p's own tag store, so its pruner (above its ``high_watermark``,
        200 by default) spares the same peers."""
        self._protected.setdefault(peer_id, set()).add(tag)
        self._changes += 1
        with _ignored_bad_id():
            self._swarm.protect(ID.from_base58(peer_id), tag)

    def unprotect(self, peer_id: str, tag: str) -> None:
        tags = self._protected.get(peer_id)
        if tags is not None:
            tags.discard(tag)
            if not tags:
                del self._protected[peer_id]
            self._changes += 1
        with _ignored_bad_id():
            self._swarm.unprotect(ID.from_base58(peer_id), tag)

    def mark_proven(self, peer_id: str) -> None:
        """A peer that did useful work (accepted rollouts, a verified checkpoint): it no longer
        counts against the per-IP caps and is trimmed after unproven peers."""
        self._proven.pop(peer_id, None)
        self._proven[peer_id] = None
        self._changes += 1
        while len(self._proven) > MAX_PROVEN:
            del self._proven[next(iter(self._proven))]

    def is_protected(self, peer_id: str) -> bool:
        return peer_id in self._protected

    def _is_proven(self, peer_id: str | None) -> bool:
        return peer_id is not None and (peer_id in self._proven or peer_id in self._protected)

    # ---- the inbound path ------------------------------------------------------------------

    def _census(self) -> _Census:
        """Unproven slots counted per host, /24 and /16, and the most represented ones. Recounted
        only after a change: a refused flood changes nothing, so a refusal costs a few lookups
        (counting 200 slots per refused attempt starved the handshakes at 1,000 attempts a second)."""
        if self._census_cache is None or self._census_cache.changes != self._changes:
            unproven = [slot for slot in self._slots if not self._is_proven(slot.peer_id)]
            counts = tuple(Counter(slot.ranges[level] for slot in unproven) for level in range(3))

            def representation(slot: _Slot) -> tuple[int, int, int]:
                return counts[2][slot.ranges[2]], counts[1][slot.ranges[1]], counts[0][slot.ranges[0]]

            top = max(map(representation, unproven), default=None)
            crowd = [slot for slot in unproven if representation(slot) == top]
            self._census_cache = _Census(self._changes, counts, crowd)
        return self._census_cache

    def _add(self, slot: _Slot) -> None:
        self._slots.add(slot)
        self._changes += 1

    def _drop(self, slot: _Slot) -> None:
        if slot in self._slots:
            self._slots.discard(slot)
            self._changes += 1

    def _admission(self, ranges: Ranges) -> str | None:
        """The reason to refuse a new inbound connection from these ranges, or None. The caps come
        first: a newcomer over its range's cap gains nothing from an eviction."""
        counts = self._census().counts
        caps = (self.policy.unproven_per_ip, self.policy.unproven_per_24, self.policy.unproven_per_16)
        for level, (reason, cap) in enumerate(zip(CAP_REASONS, caps, strict=True)):
            if counts[level][ranges[level]] >= cap:
                return reason
        if len(self._slots) >= self.policy.max_inbound:
            return "inbound_full"
        return None

    def pick_victim(self, ranges: Ranges) -> _Slot | None:
        """The connection a newcomer from ``ranges`` may take the slot of, or None.

        Candidates: unproven, unprotected inbound slots, established or still in their handshake
        (a flood of stalled handshakes must not hold the table either). The victim is from the
        most represented range (most unproven slots per /16, then per /24, then per host), idle
        (or handshaking) before busy, oldest first: a reconnecting flood keeps its connections
        young, and an old idle unproven one has had its chance to prove itself. The newcomer must be
        under-represented where its ranges and the victim's part: its range holds at least two
        fewer unproven slots than the victim's, so after the swap it is still no larger, and two
        ranges never evict each other back and forth.
        """
        census = self._census()
        fits: dict[Ranges, bool] = {}  # the crowd may tie several ranges; each is judged once
        for slot in census.crowd:
            if slot.ranges not in fits:
                fits[slot.ranges] = _outnumbers(slot.ranges, ranges, census.counts)
        eligible = [slot for slot in census.crowd if fits[slot.ranges]]
        if not eligible:
            return None
        return max(eligible, key=lambda slot: (not self._busy(slot), -slot.opened))

    def _conn(self, slot: _Slot) -> INetConn | None:
        """The swarm's connection of an established slot (None once the swarm dropped it)."""
        if slot.muxed is None:
            return None
        return next((conn for conn in self._swarm.get_connections(slot.muxed.peer_id)
                     if conn.muxed_conn is slot.muxed), None)

    def _busy(self, slot: _Slot) -> bool:
        conn = self._conn(slot)
        return conn is not None and bool(conn.get_streams())

    async def _handle_inbound(self, stream: ReadWriteCloser, listen_addr: Multiaddr) -> None:
        """Admit (evicting when full), upgrade under a deadline, then hold the slot exactly as long
        as the connection."""
        if isinstance(stream, IMuxedConn):  # QUIC and the like, which this node does not listen on
            await type(self._swarm)._handle_inbound_connection(self._swarm, stream, listen_addr)
            return
        ranges = address_keys(_remote_ip(stream))
        reason = self._admission(ranges)
        victim = self.pick_victim(ranges) if reason == "inbound_full" and self.policy.evict else None
        if reason is not None and victim is None:
            self.refused[reason] += 1
            await _close_quietly(stream)
            return
        if victim is not None:  # its slot is free from now on; its own task closes its connection
            self._drop(victim)
            victim.scope.cancel()
            self.evicted += 1
        slot = _Slot(ranges)
        self._add(slot)
        try:
            with slot.scope:
                muxed = await self._upgrade(stream, listen_addr)
                if muxed is None:
                    return
                slot.peer_id, slot.muxed = muxed.peer_id.to_base58(), muxed
                self._changes += 1  # a proven peer's slot leaves the census
                self.accepted += 1
                if len(self._swarm.get_connections()) > self.policy.high_water:
                    self._trim_wanted.set()
                await _closed(muxed)
            if slot.scope.cancelled_caught:
                await self._close_evicted(slot, stream)
        finally:
            self._drop(slot)

    async def _close_evicted(self, slot: _Slot, stream: ReadWriteCloser) -> None:
        """Close an evicted slot's connection: the swarm's (so it is unregistered and notified)
        when established, the socket when it was still in its handshake."""
        with trio.move_on_after(EVICT_CLOSE_S):
            try:
                await (self._conn(slot) or slot.muxed or stream).close()
            except Exception as exc:  # the peer already dropped it
                log.debug("closing evicted %s failed: %s", slot.peer_id or "handshake", exc)

    async def _upgrade(self, stream: ReadWriteCloser, listen_addr: Multiaddr) -> IMuxedConn | None:
        """The upstream gate and upgrade (which registers the connection), or None, counted."""
        swarm = self._swarm
        remote_maddr = swarm._build_remote_multiaddr(stream)
        if remote_maddr is not None and not await swarm.connection_gate.is_allowed(remote_maddr):
            self.refused["gate"] += 1
            await _close_quietly(stream)
            return None
        raw = RawConnection(stream, False)
        with trio.move_on_after(self.policy.handshake_deadline_s) as deadline:
            try:
                return await swarm.upgrade_inbound_raw_conn(raw, listen_addr)
            except Exception as exc:  # a hostile or broken dialer fails the upgrade in many ways
                log.debug("inbound upgrade from %s failed: %s", remote_maddr, exc)
                self.refused["handshake_failed"] += 1
        if deadline.cancelled_caught:
            self.refused["handshake_timeout"] += 1
        await _close_quietly(raw)
        return None

    # ---- trimming --------------------------------------------------------------------------

    async def run(self) -> None:
        """Trim when an accept pushed the count over the high mark, and every ``trim_every_s``
        (connections still in their grace period at one trim may be trimmable at the next)."""
        while True:
            with trio.move_on_after(self.policy.trim_every_s):
                await self._trim_wanted.wait()
            self._trim_wanted = trio.Event()
            await self.trim()

    def trim_candidates(self) -> list[INetConn]:
        """The connections to close now, in order: unproven before proven, idle before busy,
        newest first; protected peers and connections younger than the grace period never."""
        conns = self._swarm.get_connections()
        excess = len(conns) - self.policy.low_water
        if len(conns) <= self.policy.high_water or excess <= 0:
            return []
        now = time.time()
        eligible = [conn for conn in conns
                    if not self.is_protected(_peer(conn)) and now - _opened(conn) >= self.policy.grace_s]
        eligible.sort(key=lambda conn: (self._is_proven(_peer(conn)), bool(conn.get_streams()), -_opened(conn)))
        return eligible[:excess]

    async def trim(self) -> int:
        """Close ``trim_candidates()``; returns how many were closed."""
        victims = self.trim_candidates()
        for conn in victims:
            try:
                await conn.close()
            except Exception as exc:  # closing a connection the peer already dropped
                log.debug("trim close of %s failed: %s", _peer(conn), exc)
        self.trimmed += len(victims)
        if victims:
            log.info("trimmed %d connections (now %d)", len(victims), len(self._swarm.get_connections()))
        return len(victims)

    # ---- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        conns = self._swarm.get_connections()
        inbound = sum(slot.muxed is not None for slot in self._slots)  # py-libp2p leaves direction unset
        return {
            "inbound": inbound,
            "outbound": len(conns) - inbound,
            "handshaking": sum(slot.peer_id is None for slot in self._slots),
            "accepted": self.accepted,
            "trimmed": self.trimmed,
            "evicted": self.evicted,
            "refused": dict(self.refused),
            "protected": len(self._protected),
        }


def _outnumbers(crowded: Ranges, newcomer: Ranges, counts: tuple[Counter[str], ...]) -> bool:
    """Whether ``crowded`` holds at least two more unproven slots than ``newcomer`` at the widest
    level where they differ (/16, else /24, else host); never for the same host."""
    for level in (2, 1, 0):
        if newcomer[level] != crowded[level]:
            return counts[level][newcomer[level]] + 1 < counts[level][crowded[level]]
    return False


@dataclass(frozen=True)
class _Census:
    changes: int  # ``ConnectionManager._changes`` when counted
    counts: tuple[Counter[str], ...]  # unproven slots per host, /24, /16 (``address_keys`` order)
    crowd: list[_Slot]  # the unproven slots of the most represented ranges


def _remote_ip(stream: ReadWriteCloser) -> str:
    try:
        remote = stream.get_remote_address()
    except Exception:  # a socket already reset by the peer
        remote = None
    return remote[0] if remote else "unknown"


def _peer(conn: INetConn) -> str:
    return conn.muxed_conn.peer_id.to_base58()


def _opened(conn: INetConn) -> float:
    """Wall time the connection was registered (py-libp2p's own pruner reads the same field)."""
    return float(getattr(conn, "_created_at", 0.0))


async def _closed(muxed: IMuxedConn) -> None:
    """Return once the connection is closed, by either side, for any reason: the muxer sets its
    ``event_closed`` then. host.py configures Yamux only, which has it (so has py-libp2p's Mplex);
    a muxer without it is a wiring mistake, named here rather than polled for."""
    event = getattr(muxed, "event_closed", None)
    if not isinstance(event, trio.Event):
        raise TypeError(f"{type(muxed).__name__} has no event_closed to wait on: configure Yamux (host.py)")
    await event.wait()


def _ignored_bad_id() -> contextlib.AbstractContextManager[None]:
    """A peer id that is not base58 (a test's label) is kept in our table only."""
    return contextlib.suppress(ValueError)


async def _close_quietly(closer: ReadWriteCloser | RawConnection) -> None:
    with trio.move_on_after(1.0):
        try:
            await closer.close()
        except Exception:  # already reset by the peer
            pass
