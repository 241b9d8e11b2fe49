"""DCUtR hole punching over relayed connections, counted by outcome for ``status``.

py-libp2p 0.8.1's ``DCUtRProtocol`` drives itself: every 2 s it looks for peers connected only
through a relay and, up to 3 times per peer, first tries a plain direct dial to their known
addresses, then the DCUtR exchange (CONNECT with observed addresses, SYNC, simultaneous dials from
the listen port). Its result is only logged, so this subclass counts each initiated attempt:
``direct_dial`` (the plain dial worked: no punch needed), ``succeeded``, ``failed``; and each
exchange it answered as the other side (``answered``). Its stream handler is registered through
the host, so the stream guard wraps it.

The plain dial is bounded to ``UNILATERAL_DIAL_S`` instead of the library's 10 s dial timeout: a
peer behind NAT has only private listen addresses besides its relayed one, and their dial is
dropped unanswered, so every punch waited the whole 10 s before its exchange began (measured in
bench/holepunch.py: ~10.7 s from the relayed connection to the direct one, of which the exchange
itself took ~50 ms). A reachable address answers a TCP dial within a few round trips.
"""

from __future__ import annotations

from collections import Counter

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from multiaddr import Multiaddr

UNILATERAL_DIAL_S = 3.0  # a public peer answers a TCP dial (and its handshakes) well within this


class CountingDCUtR(DCUtRProtocol):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.outcomes: Counter[str] = Counter()
        self.last_punched: list[str] = []  # the addresses the last punch dialed: why it failed, often

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr], as_responder: bool = False) -> bool:
        self.last_punched = [str(addr) for addr in addrs][:4]
        return await super()._perform_hole_punch(peer_id, addrs, as_responder)

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        with trio.move_on_after(UNILATERAL_DIAL_S):
            return await super()._try_unilateral_upgrade(peer_id)
        return await self._verify_direct_connection(peer_id)  # a dial may have won just before the bound

    async def _initiate_hole_punch_locked(self, peer_id: ID) -> bool:
        before = self._hole_punch_attempts.get(peer_id, 0)
        ok = await super()._initiate_hole_punch_locked(peer_id)
        punched = self._hole_punch_attempts.get(peer_id, 0) > before
        if punched:
            self.outcomes["attempted"] += 1
            self.outcomes["succeeded" if ok else "failed"] += 1
        elif ok:
            self.outcomes["direct_dial"] += 1
        return ok

    async def _handle_dcutr_stream(self, stream: INetStream) -> None:
        self.outcomes["answered"] += 1
        await super()._handle_dcutr_stream(stream)

    def status(self) -> dict[str, object]:
        counts: dict[str, object] = {key: self.outcomes.get(key, 0)
                                     for key in ("attempted", "succeeded", "failed", "direct_dial", "answered")}
        return {**counts, "last_punched": self.last_punched}
