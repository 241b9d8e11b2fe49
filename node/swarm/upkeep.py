"""``Upkeep``: what a node must keep doing so that its state stays true: members whose adverts
expired are dropped, the peer cache reaches disk within ``PEER_CACHE_SAVE_S`` after it changes (a
crash skips the save at shutdown; a cache a few changes behind costs a restart nothing), written
in a worker thread (two fsyncs must not stall the node's event loop), a banned peer's gossip
and connection go as soon as the ban is decided, and a ban for now is lifted once it is due.
"""

from __future__ import annotations

import logging
import math

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub

from intellect_node.node.home.durable import write_durably
from intellect_node.node.swarm.membership import MemberView
from intellect_node.node.swarm.peer_cache import PeerCache
from intellect_node.node.swarm.peer_scores import PeerScores

log = logging.getLogger(__name__)
UPKEEP_S = 1.0
PEER_CACHE_SAVE_S = 30.0


class Upkeep:
    def __init__(self, host: IHost, pubsub: Pubsub, view: MemberView, peer_cache: PeerCache,
                 scores: PeerScores) -> None:
        self.host = host
        self.scores = scores
        self.pubsub = pubsub
        self.view = view
        self.peer_cache = peer_cache
        # bans decided (synchronously, inside a handler) -> disconnected by ``run``
        self._to_disconnect, self._banned = trio.open_memory_channel[ID](math.inf)

    def on_ban(self, peer_id: str) -> None:
        """Drop a banned peer's gossip now and its connection soon (``PeerScores``' ban hook).

        Not ``Pubsub.add_to_blacklist``: in libp2p 0.8.1 its teardown races the dead-peer handler
        (KeyError in ``_teardown_if_connected``) and takes the pubsub service, and the node, down.
        Adding to the blacklist set and closing the connection reaches the same state safely.
        """
        try:
            peer = ID.from_base58(peer_id)
        except ValueError:
            return
        self.pubsub.blacklisted_peers.add(peer)
        self._to_disconnect.send_nowait(peer)

    def on_lift(self, peer_id: str) -> None:
        """A ban for now ended (``PeerScores``' lift hook): the peer's gossip is welcome again."""
        try:
            self.pubsub.blacklisted_peers.discard(ID.from_base58(peer_id))
        except ValueError:
            return

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._disconnect_banned, nursery)
            saved_at = -math.inf
            while True:
                await trio.sleep(UPKEEP_S)
                for peer_id in self.view.prune():
                    log.info("member %s left (advert expired)", peer_id)
                self.scores.lift_due()
                if self.peer_cache.dirty and trio.current_time() - saved_at >= PEER_CACHE_SAVE_S:
                    saved_at = trio.current_time()
                    await trio.to_thread.run_sync(write_durably, self.peer_cache.path, self.peer_cache.encoded())

    async def _disconnect_banned(self, nursery: trio.Nursery) -> None:
        async for peer in self._banned:
            nursery.start_soon(self._disconnect, peer)

    async def _disconnect(self, peer: ID) -> None:
        try:
            await self.host.disconnect(peer)
        except Exception as exc:
            log.debug("disconnect of %s failed: %s", peer, exc)
