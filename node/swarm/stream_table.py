"""One table of inbound streams per protocol: caps per peer and per address, a capacity, deadlines
for the request, and room for newcomers (specs/guards.md, G3 and G4).

Why a table and not a counter per handler: a handler that counts its own streams (the shard
handler served 64 and waited 10 s for a request) is filled by strangers who open streams and send
one byte; every honest request is then refused until their deadlines run out, and they reopen at
once (issue 50: 36 identities from 5 addresses kept a node's shard streams full for over 10 s).
Admission under pressure for connections (``connections.py``) showed the way out: per-range caps,
and when full, a newcomer from an under-represented range takes the slot of someone from the most
represented one. Here the victim is a stream still in its request, never one being answered: an
honest request is one frame written at once and completes within a round trip, so a stream still
incomplete when the table is full is slow or idle by choice.

The request is the dialer's first length-prefixed frame (``protocol.framing``: every ``/ina/``
protocol opens that way). ``RequestStream`` watches the bytes the handler reads and marks the
request complete once the frame's last byte is read, so handlers stay as they are.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import INetStream

from intellect_node.protocol.framing import HEADER

# A stream that has read nothing yet still ranks by its age: rates use at least this many seconds.
MIN_AGE_S = 0.001


@dataclass(frozen=True)
class SlotPolicy:
    """One protocol's table: concurrent inbound streams allowed per peer and per IP, in all
    (``capacity``; None: no total, only the per-peer and per-IP caps), how long the dialer may take
    to send its first byte (None: no deadline, the protocol allows silence), to complete its request
    frame (``request_s``, from the stream's opening; None: the protocol opens with no frame of ours),
    and how long a stream may live in all (``stream_s``; None: as long as its handler runs).
    Deadlines count from the stream's opening."""

    per_peer: int
    per_ip: int
    first_byte_s: float | None
    capacity: int | None = None
    request_s: float | None = None
    stream_s: float | None = None


class Slot:
    """One admitted stream: who, from where, since when, how much of its request arrived."""

    __slots__ = ("complete", "evicted", "ip", "need", "opened", "peer", "policy", "received", "scope", "_head")

    def __init__(self, peer: str, ip: str, policy: SlotPolicy) -> None:
        self.peer, self.ip, self.policy = peer, ip, policy
        self.opened = trio.current_time()
        self.received = 0
        self.need: int | None = None  # the request frame's length with its header, once the header is read
        self.complete = policy.request_s is None  # nothing to wait for: never in its request
        self.evicted = False
        self._head = bytearray()
        self.scope = trio.CancelScope(deadline=self._deadline())

    def _deadline(self) -> float:
        policy = self.policy
        limit = policy.stream_s if self.complete else policy.request_s
        return self.opened + limit if limit is not None else math.inf

    def saw(self, data: bytes) -> None:
        """``data`` of the request was read; past the frame's last byte the request is complete and
        its deadline becomes the stream's (if any)."""
        if self.complete:
            return
        self.received += len(data)
        if self.need is None:
            self._head += data[: HEADER.size - len(self._head)]
            if len(self._head) == HEADER.size:
                self.need = HEADER.size + HEADER.unpack(self._head)[0]
        if self.need is not None and self.received >= self.need:
            self.complete = True
            self.scope.deadline = self._deadline()

    def rate(self, now: float) -> float:
        """Request bytes per second since the stream opened: the slowest goes first."""
        return self.received / max(now - self.opened, MIN_AGE_S)


class RequestStream:
    """The stream a handler reads, reporting each read to its slot (everything else the wrapped
    stream's). Why count what the handler reads and not what arrives: the handler reads the frame
    as it arrives, and counting there needs no second reader on the stream."""

    def __init__(self, stream: INetStream, slot: Slot) -> None:
        self._stream = stream
        self._slot = slot

    async def read(self, n: int | None = None) -> bytes:
        data = await self._stream.read(n)
        if data:
            self._slot.saw(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class StreamTable:
    """The admitted streams of one protocol, with its caps and eviction rule."""

    def __init__(self, protocol: str, policy: SlotPolicy) -> None:
        self.protocol, self.policy = protocol, policy
        self.slots: set[Slot] = set()
        self.per_peer: Counter[str] = Counter()
        self.per_ip: Counter[str] = Counter()
        # admitted, evicted, no_slot (a peer or IP at its cap), full (no room, no victim),
        # first_byte and request (deadlines missed), stream (stream_s reached)
        self.counts: Counter[str] = Counter()

    def admit(self, peer: str, ip: str) -> Slot | str:
        """A slot for a new stream, or why not: "no_slot" (its peer or IP holds its cap) or "full"
        (the table is full and no stream may be evicted for it). Evicting frees the victim's slot
        here, before any await, and cancels its handler (its guard resets the stream)."""
        policy = self.policy
        if self.per_peer[peer] >= policy.per_peer or (ip and self.per_ip[ip] >= policy.per_ip):
            self.counts["no_slot"] += 1
            return "no_slot"
        if policy.capacity is not None and len(self.slots) >= policy.capacity:
            victim = self.pick_victim(ip)
            if victim is None:
                self.counts["full"] += 1
                return "full"
            victim.evicted = True
            victim.scope.cancel()
            self.release(victim)
            self.counts["evicted"] += 1
        slot = Slot(peer, ip, policy)
        self.slots.add(slot)
        self.per_peer[peer] += 1
        self.per_ip[ip] += 1
        self.counts["admitted"] += 1
        return slot

    def pick_victim(self, ip: str) -> Slot | None:
        """The stream a newcomer from ``ip`` may take the place of, if any: among streams still in
        their request, from the most represented IP, the slowest (fewest request bytes per second),
        then the oldest. The newcomer's IP must hold at least two fewer streams than the victim's
        (``n_new + 1 < n_victim``), so after the swap it is no larger and two IPs never evict each
        other back and forth; a stream being answered is never evicted."""
        candidates = [slot for slot in self.slots if not slot.complete]
        if not candidates:
            return None
        now = trio.current_time()
        victim = min(candidates, key=lambda s: (-self.per_ip[s.ip], s.rate(now), s.opened))
        return victim if self.per_ip[ip] + 1 < self.per_ip[victim.ip] else None

    def release(self, slot: Slot) -> None:
        """Free ``slot`` (once: an evicted slot is freed at eviction, its handler's end is a no-op)."""
        if slot not in self.slots:
            return
        self.slots.remove(slot)
        for counter, key in ((self.per_peer, slot.peer), (self.per_ip, slot.ip)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

    def status(self) -> dict[str, int]:
        return {"open": len(self.slots), **self.counts}
