"""``MemberExchange``: the members protocol, and the one way an advert gets into the view.

Gossip is push-only: a node that joined a moment ago, or was cut off or starved of CPU, has no way
to catch up from it. The members protocol is the pull side: one small stream on which the caller
sends its own advert and a digest of the adverts it holds (8 bytes each), and the callee answers
with the adverts it holds that the caller lacks (specs/wire.md). Answering every advert held made
each node's idle traffic grow with the run (issue 51: ~100 signed adverts a pull at 100 members,
nearly all of them known to the caller); now a pull costs what changed. A caller that lies in its
digest only withholds adverts from itself: everything the callee could send is public anyway. Adverts
from it, from gossip and from the DHT all pass through ``accept``, which checks them, charges the
peer that delivered a bad one, and keeps a new member's addresses for the next start.

A gossiped advert this node already holds, byte for byte, is not forwarded: every node that holds
it would drop it too, so forwarding it only costs the mesh (each node receives a message once from
each mesh peer). Heartbeats repeat an envelope between re-signings, and before this rule each repeat
flooded the whole run; now it reaches the origin's mesh peers, and goes further only through peers
that lacked it. A node that lacks an advert still gets it from the next re-signing (a third of its
lifetime with the default timings) or from a pull (specs/dht.md "Advert changes").
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from intellect_node.node.swarm.membership import Member, MemberView
from intellect_node.node.swarm.peer_cache import PeerCache
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Rejected, SignerMismatch
from intellect_node.protocol.framing import (
    MAX_MEMBERS_REQUEST,
    MAX_MEMBERS_RESPONSE,
    MEMBERS_PROTOCOL,
    decode_envelope_list,
    decode_members_request,
    encode_envelope_list,
    encode_members_request,
)
from intellect_node.protocol.messages import NodeAdvert

log = logging.getLogger(__name__)
STREAM_TIMEOUT_S = 5.0


class MemberExchange:
    def __init__(self, host: IHost, view: MemberView, scores: PeerScores, peer_cache: PeerCache,
                 own_envelope: Callable[[], bytes | None]) -> None:
        """``own_envelope()``: our advert as last signed, sent with every request (None: not yet)."""
        self.host = host
        self.view = view
        self.scores = scores
        self.peer_cache = peer_cache
        self.own_envelope = own_envelope
        self.peer_id = host.get_id().to_base58()
        # gossiped adverts ``heard`` new (kept, forwarded) and ``repeats`` (held already: dropped)
        self.gossip_counts: Counter[str] = Counter()

    def install(self) -> None:
        """Serve the members protocol (once the host runs)."""
        self.host.set_stream_handler(TProtocol(MEMBERS_PROTOCOL), self.serve)

    async def exchange(self, peer: ID) -> None:
        """Send our advert and the digests of what we hold to ``peer``; take the adverts we lack."""
        peer_id = peer.to_base58()
        try:
            stream = await self.host.new_stream(peer, [TProtocol(MEMBERS_PROTOCOL)])
        except Exception as exc:
            log.info("members exchange with %s failed to open: %s", peer_id, exc)
            return
        try:
            await write_frame(stream, encode_members_request(self.own_envelope() or b"", self.view.digests()))
            payload = await read_frame(stream, MAX_MEMBERS_RESPONSE, STREAM_TIMEOUT_S)
            envelopes = decode_envelope_list(payload)
        except Rejected as exc:
            self.scores.reject(peer_id, exc.reason, f"members response: {exc}")
            return
        except Exception as exc:
            log.info("members exchange with %s failed: %s", peer_id, exc)
            return
        finally:
            await close_quietly(stream)
        for envelope in envelopes:
            self.accept(envelope, delivered_by=peer_id)

    async def pull_from_random_peer(self) -> None:
        """One exchange (anti-entropy) with a random connected peer, bounded."""
        connected = [peer for peer in self.host.get_connected_peers() if not self.scores.is_banned(peer.to_base58())]
        if connected:
            with trio.move_on_after(STREAM_TIMEOUT_S * 2):
                await self.exchange(random.choice(connected))

    async def serve(self, stream: INetStream) -> None:
        peer_id = stream.muxed_conn.peer_id.to_base58()
        try:
            if self.scores.is_banned(peer_id):
                return
            advert, held = decode_members_request(await read_frame(stream, MAX_MEMBERS_REQUEST, STREAM_TIMEOUT_S))
            if advert:
                signed = codec.decode(advert, NodeAdvert)
                if signed.signer_peer_id != peer_id:
                    raise SignerMismatch("members request carries an advert of another peer")
                self.accept(advert, delivered_by=peer_id)
            await write_frame(stream, encode_envelope_list(self.view.envelopes(held=held)))
        except Rejected as exc:
            self.scores.reject(peer_id, exc.reason, f"members request: {exc}")
        except Exception as exc:
            log.info("members request from %s failed: %s", peer_id, exc)
        finally:
            await close_quietly(stream)

    def accept(self, envelope: bytes, delivered_by: str | None) -> bool:
        """Record a verified advert (charging ``delivered_by`` for a bad one); True if kept or known."""
        try:
            self._remember(self.view.accept(envelope))
        except Rejected as exc:
            self.scores.reject(delivered_by, exc.reason, f"advert: {exc}")
            return False
        return True

    def on_gossip(self, signed: codec.Signed[NodeAdvert], raw: bytes) -> bool:
        """The members topic's handler: ``Rejected`` propagates to the gossip validator, which charges.

        False (dropped quietly, free for the forwarder, not forwarded) for a copy of an advert held
        already; our own adverts pass (libp2p validates what we publish too)."""
        member = self.view.accept(raw)
        if signed.signer_peer_id == self.peer_id:
            return True
        if member is None:
            self.gossip_counts["repeats"] += 1
            return False
        self.gossip_counts["heard"] += 1
        self._remember(member)
        return True

    def _remember(self, member: Member | None) -> None:
        """Keep a newly accepted peer's addresses for the next start (not our own)."""
        if member is not None and member.advert.peer_id != self.peer_id:
            self.peer_cache.remember(member.advert.peer_id, list(member.advert.addrs))
