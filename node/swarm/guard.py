"""The one guard around every inbound stream handler the host runs, ours and libp2p's own.

py-libp2p 0.8.1 runs each inbound stream's handler in the connection's nursery, under the host's:
an exception a handler lets escape ends the whole node (specs/guards.md lists the upstream defects,
e.g. protobuf's DecodeError out of the pubsub reader). So every handler, including identify,
identify push, ping, kad and meshsub, runs inside ``StreamGuard``: an exception resets that stream,
is counted (``handler_error``), logged with its traceback once per protocol and type, and charged to
the peer through ``PeerScores``, the one ban path. It never reaches the host.

The guard also keeps one table of streams per protocol (``stream_table``): slots per peer and per
IP, so idle streams of one peer cannot occupy a protocol for everybody (kad's own limit is 12
streams for the whole node), and, for our own protocols, a capacity with room kept for newcomers
(when it is full, a newcomer from a less represented IP takes the place of the slowest stream still
in its request) and deadlines for the first byte and the complete request. Protocols whose dialer
may rightly stay silent (identify: the listener speaks first; meshsub: a long-lived stream that
carries RPCs when there are any) get no first-byte deadline.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.relay.circuit_v2.dcutr import PROTOCOL_ID as DCUTR_PROTOCOL
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID as STOP_PROTOCOL

from intellect_node.node.swarm.loop_deadline import LATE_S, LoopDeadline, late_by
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.stream_table import RequestStream, Slot, SlotPolicy, StreamTable
from intellect_node.protocol.framing import DIALBACK_PROTOCOL, MEMBERS_PROTOCOL, ROLLOUTS_PROTOCOL, SHARDS_PROTOCOL

log = logging.getLogger(__name__)
Handler = Callable[[INetStream], Awaitable[None]]
BusyReply = Callable[[INetStream], Awaitable[None]]
RESET_TIMEOUT_S = 1.0


# Per IP is larger than per peer: several honest nodes share an IP behind NAT or on one machine.
# Our own request/response protocols (/ina/...) open with one frame the dialer writes at once: their
# tables have a capacity, a first byte within 2 s and the whole request within a few seconds (a
# rollout batch, up to 16 MiB, within 30 s), and, where the answer is bounded, a life.
POLICIES: dict[str, SlotPolicy] = {
    "/ipfs/id/1.0.0": SlotPolicy(per_peer=2, per_ip=32, first_byte_s=None),  # the listener speaks first
    "/ipfs/id/push/1.0.0": SlotPolicy(per_peer=2, per_ip=32, first_byte_s=5.0),
    "/ipfs/ping/1.0.0": SlotPolicy(per_peer=1, per_ip=16, first_byte_s=5.0),
    # libp2p's kad handler takes at most 12 streams for the node; a peer's lookups rarely need more
    # than a few at once, and per IP the cap leaves kad slots for the rest of the world.
    "/ipfs/kad/1.0.0": SlotPolicy(per_peer=3, per_ip=6, first_byte_s=5.0),
    # one live reader per peer, but pubsub opens one per connection, and a reconnected peer's stale
    # streams can still hold slots: at 2, a trainer's third was refused and its gossip cut (the demo)
    "/meshsub/1.1.0": SlotPolicy(per_peer=4, per_ip=32, first_byte_s=None),
    # the request is at most 16 KiB (an advert and a digest of 8 bytes per advert held), the answer at
    # most 1 MiB of adverts: a caller that does not read it is cut at 10 s
    MEMBERS_PROTOCOL: SlotPolicy(per_peer=2, per_ip=16, first_byte_s=2.0, capacity=64, request_s=4.0, stream_s=10.0),
    # two: a worker's outbox offers a waiting batch again while its next batch or commitment is on
    # the way (at 1 the second stream was closed unanswered and retried with back-off). No life: a
    # stored batch must reach the judge (cutting it there would lose it), and the reply is one
    # small frame, so a worker that never reads it cannot hold the stream.
    ROLLOUTS_PROTOCOL: SlotPolicy(per_peer=2, per_ip=8, first_byte_s=2.0, capacity=32, request_s=30.0),
    # each answer costs us a dial (at most 5 s) and is a few bytes
    DIALBACK_PROTOCOL: SlotPolicy(per_peer=1, per_ip=4, first_byte_s=2.0, capacity=16, request_s=2.0, stream_s=15.0),
    # a have stream lives 300 s and a body is cut by the server's own stall window: no life here
    SHARDS_PROTOCOL: SlotPolicy(per_peer=2, per_ip=16, first_byte_s=2.0, capacity=64, request_s=4.0),
    # A hop stream lives as long as its circuit; the relay's own reservation limit bounds the rest.
    HOP_PROTOCOL: SlotPolicy(per_peer=4, per_ip=16, first_byte_s=5.0),
    STOP_PROTOCOL: SlotPolicy(per_peer=8, per_ip=16, first_byte_s=5.0),  # every circuit comes from the relay
    DCUTR_PROTOCOL: SlotPolicy(per_peer=1, per_ip=4, first_byte_s=5.0),
}
DEFAULT_POLICY = SlotPolicy(per_peer=2, per_ip=16, first_byte_s=5.0)


def busy_reply(reply: BusyReply) -> Callable[[Handler], Handler]:
    """Mark a handler with what its protocol answers when the guard has no room for a stream (e.g.
    the shard protocol's 503 "too many shard streams"); without one such a stream is reset. Why a
    mark on the handler: its protocol's wire format lives with the handler, not in the swarm."""

    def mark(handler: Handler) -> Handler:
        handler.busy_reply = reply  # type: ignore[attr-defined]
        return handler

    return mark


class PrefetchedStream:
    """A stream whose first bytes were already read (to meet the first-byte deadline); the handler
    reads them again first. Everything else is the wrapped stream's."""

    def __init__(self, stream: INetStream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def read(self, n: int | None = None) -> bytes:
        if not self._prefix:
            return await self._stream.read(n)
        count = len(self._prefix) if n is None or n < 0 else n
        head, self._prefix = self._prefix[:count], self._prefix[count:]
        return head

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def peer_of(stream: INetStream) -> str | None:
    try:
        return stream.muxed_conn.peer_id.to_base58()
    except Exception:
        return None


def ip_of(stream: INetStream) -> str:
    """The remote IP, or "" when the transport does not say (then only per-peer slots apply)."""
    try:
        address = stream.get_remote_address()
    except Exception:
        return ""
    return str(address[0]) if address else ""


async def reset_quietly(stream: INetStream) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(RESET_TIMEOUT_S):
        try:
            await stream.reset()
        except Exception:
            pass


class StreamGuard:
    """Wraps stream handlers: slots, first-byte deadline, and no exception past the stream."""

    def __init__(self, scores: PeerScores) -> None:
        self.scores = scores
        self.errors: Counter[str] = Counter()  # "protocol: ExceptionType" -> count, for status
        self.tables: dict[str, StreamTable] = {}  # protocol -> its stream table
        self._logged: set[tuple[str, str]] = set()

    def install(self, host: IHost) -> None:
        """Guard the handlers registered so far, every handler registered later, and the host's
        protocol negotiation (the network's one entry point for inbound streams)."""
        handlers = host.get_mux().handlers
        for protocol, handler in list(handlers.items()):
            if protocol is not None and handler is not None:
                handlers[protocol] = self.wrap(protocol, handler)
        register = host.set_stream_handler

        def set_stream_handler(protocol_id: TProtocol, stream_handler: Handler) -> None:
            register(protocol_id, self.wrap(protocol_id, stream_handler))

        host.set_stream_handler = set_stream_handler  # type: ignore[method-assign]
        network = host.get_network()
        negotiate = network.common_stream_handler  # the host's _swarm_stream_handler
        network.set_stream_handler(self._contained("negotiation", negotiate))

    def wrap(self, protocol: str, handler: Handler) -> Handler:
        if getattr(handler, "guarded", False):
            return handler
        table = self.tables.setdefault(protocol, StreamTable(protocol, POLICIES.get(protocol, DEFAULT_POLICY)))
        busy: BusyReply | None = getattr(handler, "busy_reply", None)

        async def guarded(stream: INetStream) -> None:
            peer, ip = peer_of(stream) or "", ip_of(stream)
            if peer and self.scores.is_banned(peer):
                await reset_quietly(stream)
                return
            slot = table.admit(peer, ip)
            if not isinstance(slot, Slot):
                if slot == "no_slot":
                    self.scores.reject(peer or None, "no_slot", f"{protocol}: all stream slots of this peer or IP held")
                await self._refuse(stream, busy if slot == "full" else None)
                return
            try:
                await self._run(protocol, handler, stream, slot, table)
            finally:
                table.release(slot)

        guarded.guarded = True  # type: ignore[attr-defined]
        return guarded

    async def _run(self, protocol: str, handler: Handler, stream: INetStream, slot: Slot, table: StreamTable) -> None:
        """``handler`` on an admitted stream, under the slot's deadlines (and its eviction)."""
        policy = slot.policy
        try:
            with slot.scope:
                opened: INetStream = stream
                if policy.first_byte_s is not None:
                    opened = await self._first_byte(stream, protocol, policy)
                if not slot.complete:
                    opened = RequestStream(opened, slot)  # type: ignore[assignment]
                await self._contained(protocol, handler)(opened)
        except _FirstByteMissing:
            table.counts["first_byte"] += 1
            detail = f"{protocol}: no first byte within {policy.first_byte_s:g} s"
            self.scores.reject(slot.peer or None, "timeout", detail)
            await reset_quietly(stream)
            return
        if not slot.scope.cancelled_caught:
            return
        if slot.evicted:  # its place went to a newcomer; slow is not proven hostile, so no charge
            log.debug("%s: evicted a slow request of %s from %s", protocol, slot.peer, slot.ip)
        elif late_by(slot.scope.deadline) > LATE_S:  # our loop stalled through its deadline: not the peer's fault
            table.counts["stalled_here"] += 1
            log.debug("%s: cut a stream of %s whose deadline ran late (not charged)", protocol, slot.peer)
        elif not slot.complete:
            table.counts["request"] += 1
            detail = f"{protocol}: no complete request within {policy.request_s:g} s"
            self.scores.reject(slot.peer or None, "timeout", detail)
        else:
            table.counts["stream"] += 1
            detail = f"{protocol}: stream still open after {policy.stream_s:g} s"
            self.scores.reject(slot.peer or None, "timeout", detail)
        await reset_quietly(stream)

    async def _refuse(self, stream: INetStream, busy: BusyReply | None) -> None:
        """Close a stream the table has no room for: with the protocol's busy answer where it has one
        (the dialer then retries as it would for any busy server), else by a reset."""
        if busy is None:
            await reset_quietly(stream)
            return
        with trio.move_on_after(RESET_TIMEOUT_S):
            try:
                await busy(stream)
                await stream.close()
                return
            except Exception:
                pass
        await reset_quietly(stream)

    def status(self) -> dict[str, dict[str, int]]:
        """Per protocol with a capacity: open streams and what the table did (``StreamTable.counts``)."""
        return {protocol: table.status() for protocol, table in self.tables.items() if table.policy.capacity}

    async def _first_byte(self, stream: INetStream, protocol: str, policy: SlotPolicy) -> INetStream:
        assert policy.first_byte_s is not None
        deadline = LoopDeadline(policy.first_byte_s)  # a stall of our loop is not the dialer's delay
        while wait := deadline.next_wait():
            with trio.move_on_after(wait):
                try:
                    first = await stream.read(1)
                except Exception:  # reset or closed before a byte: the handler sees the same end
                    first = b""
                return PrefetchedStream(stream, first)  # type: ignore[return-value]
        raise _FirstByteMissing(protocol)

    def _contained(self, protocol: str, handler: Handler) -> Handler:
        """``handler`` with every exception turned into a reset stream, a count and a charge."""

        async def contained(stream: INetStream) -> None:
            try:
                await handler(stream)
            except Exception as exc:
                self.charge(peer_of(stream), protocol, exc)
                await reset_quietly(stream)

        return contained

    def charge(self, peer: str | None, where: str, exc: Exception) -> None:
        """Count, log (with traceback, once per place and type) and charge an escaped exception."""
        kind = f"{where}: {type(exc).__name__}"
        self.errors[kind] += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("handler for %s raised (stream reset; later ones logged at debug)", where, exc_info=exc)
        else:
            log.debug("handler for %s raised %r", where, exc)
        self.scores.reject(peer, "handler_error", f"{kind}: {exc}")


class _FirstByteMissing(Exception):
    pass


class GuardedPubsub(Pubsub):
    """libp2p's Pubsub with its per-peer reader and its per-message task guarded.

    Upstream (0.8.1) catches only StreamError, ParseError and IncompleteReadError in the reader, so
    protobuf's DecodeError (random bytes on /meshsub/1.1.0) escapes, and ``push_msg`` runs as a task
    of the pubsub service, where a garbage ``key`` in a published message raises DecodeError out of
    the signature check and ends the service. Here both end in a count and a charge instead.
    """

    def __init__(self, *args: Any, guard: StreamGuard | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard

    async def stream_handler(self, stream: INetStream) -> None:
        try:
            await super().stream_handler(stream)
        except Exception as exc:
            peer = stream.muxed_conn.peer_id
            self._charge(peer, "meshsub reader", exc)
            await reset_quietly(stream)
            self._handle_dead_peer(peer)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:
            self._charge(msg_forwarder, "meshsub message", exc)

    def _charge(self, peer: ID, where: str, exc: Exception) -> None:
        if self.guard is not None:
            self.guard.charge(peer.to_base58(), where, exc)
        else:
            log.debug("%s from %s raised %r", where, peer, exc)
