"""Bounded DHT get: GET_VALUE to the few closest peers we know, at once; the first valid answer wins.

Why not ``KadDHT.get_value`` alone: in py-libp2p 0.8.1 it runs a full iterative FIND_NODE lookup,
then sends GET_VALUE to every peer the lookup found (with quorum 0 it never stops early), then
awaits entry-correction puts. In a 20-node swarm that cost 184 ms a get, 8.9x hivemind's
(bench/HISTORY.md). Our values are signed adverts: one honest holder is enough, because the record
check (``check``, e.g. ``intellect_node.node.swarm.membership.check_advert_record``) decides whether an answer is
genuine, not a majority of peers. Asking the ``ASK_PEERS`` closest peers of our own routing table
in parallel cost 12 ms and found 40 of 40 (``bench/membership.py --variants``). libp2p's full get
remains the fallback, for keys whose holders our routing table does not know.

Every reply is hostile until checked: its length is read before its body and capped, it must parse
as a Kademlia GET_VALUE reply, and its value must pass ``check``. A bad reply is counted under its
reason and charged to the peer that sent it; a peer that accepts the request and then says nothing
within ``peer_timeout_s`` is charged ``timeout``. specs/dht.md, "Reading a record", is the
normative description.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from google.protobuf.message import DecodeError
from libp2p.abc import IHost, INetStream
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.kad_dht.kad_dht import KadDHT
from libp2p.kad_dht.pb.kademlia_pb2 import Message
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_uvarint, read_varint_prefixed_bytes_limited

from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.streams import close_quietly
from intellect_node.protocol.errors import MalformedReply, Oversize, Rejected, Stalled, Truncated

log = logging.getLogger(__name__)

ASK_PEERS = 3  # the Kademlia paper's alpha: one slow or lying peer does not cost a fallback lookup
# Open a stream (dialing if need be), send, read the reply. A loopback GET_VALUE takes about 10 ms,
# but a peer of a swarm that is starting on 2 cores can take seconds to accept a stream, and the
# fallback lookup costs far more than waiting; the first valid reply ends the wait in any case.
PEER_TIMEOUT_S = 5.0
GET_TIMEOUT_S = 10.0  # the whole get, fallback included (libp2p's own get has no overall deadline)
DHT_TIMEOUT_S = 10.0  # the bound on our other DHT calls (put, provide, find_providers): libp2p sets none
# A GET_VALUE reply carries the record (an advert is at most 8 KiB), the sender's signed peer record
# and up to 20 closer peers with their addresses and signed peer records (about 0.3 KiB each with a
# few addresses). 64 KiB leaves room for peers with many addresses; libp2p itself accepts 4 MiB.
MAX_GET_REPLY = 64 << 10

# Raises ``Rejected`` for a value that must not be used; its return value is not used here.
RecordCheck = Callable[[str, bytes], object]


async def bounded_get(dht: KadDHT, key: str, check: RecordCheck, scores: PeerScores, *,
                      owner: ID | None = None, ask: int = ASK_PEERS, peer_timeout_s: float = PEER_TIMEOUT_S,
                      timeout_s: float = GET_TIMEOUT_S) -> bytes | None:
    """The value under ``key`` that passes ``check``, or None when none was found within ``timeout_s``.

    Order: our own DHT store; then GET_VALUE to the ``ask`` closest unbanned peers of our routing
    table and to ``owner`` at once, the first valid reply winning (the others are cancelled); then
    libp2p's full ``get_value``, which validates with the DHT's registered validator.

    ``owner``: the peer whose record it is, when the key names one (an advert's key names its
    node). It holds its own newest record even when nobody else does: a node that stored its
    advert while it was alone (the first node of a swarm) has it nowhere else until its next
    store, half an advert lifetime later.
    """
    with trio.move_on_after(timeout_s):
        local = _local_value(dht, key, check)
        if local is not None:
            return local
        nearest = dht.routing_table.find_local_closest_peers(key.encode(), dht.routing_table.size())
        peers = [peer for peer in nearest if not scores.is_banned(peer.to_base58())][:ask]
        if owner is not None and owner not in peers and owner != dht.host.get_id() \
                and not scores.is_banned(owner.to_base58()):
            peers.append(owner)
        value = await _first_valid(dht.host, key, peers, check, scores, peer_timeout_s)
        if value is not None:
            return value
        try:
            value = await dht.get_value(key)
        except Exception as exc:  # no peers, no validator for the namespace, transport errors
            log.debug("fallback get of %s failed: %s", key, exc)
            return None
        # libp2p returns a value from its own store unchecked, and the peers it took the value
        # from are unknown here: check it again, charge nobody.
        return value if value is not None and _passes(check, key, value) else None
    return None


def _local_value(dht: KadDHT, key: str, check: RecordCheck) -> bytes | None:
    """A value our own DHT store holds (peers put records at us), if it still passes ``check``.

    It passed the validator when it was stored, but an advert expires long before libp2p's 24 h
    record lifetime: an expired one is skipped quietly, it is no peer's fault.
    """
    record = dht.value_store.get(key.encode())
    return record.value if record is not None and record.value and _passes(check, key, record.value) else None


def _passes(check: RecordCheck, key: str, value: bytes) -> bool:
    try:
        check(key, value)
    except Rejected:
        return False
    return True


async def _first_valid(host: IHost, key: str, peers: list[ID], check: RecordCheck, scores: PeerScores,
                       timeout_s: float) -> bytes | None:
    found: list[bytes] = []
    async with trio.open_nursery() as nursery:
        async def ask_one(peer: ID) -> None:
            value = await ask_peer(host, peer, key, check, scores, timeout_s)
            if value is not None and not found:
                found.append(value)
                nursery.cancel_scope.cancel()

        for peer in peers:
            nursery.start_soon(ask_one, peer)
    return found[0] if found else None


async def ask_peer(host: IHost, peer: ID, key: str, check: RecordCheck, scores: PeerScores,
                   timeout_s: float = PEER_TIMEOUT_S) -> bytes | None:
    """One GET_VALUE to ``peer``: the value if it passes ``check``; None if the peer has none, is
    unreachable, or answered badly (then the reply is counted and charged to the peer)."""
    peer_id = peer.to_base58()
    stream: INetStream | None = None
    try:
        with trio.move_on_after(timeout_s):
            try:
                stream = await host.new_stream(peer, [PROTOCOL_ID])
            except Exception as exc:  # gone, unreachable, or no DHT server: no evidence of malice
                log.debug("GET_VALUE to %s: cannot open a stream: %s", peer_id, exc)
                return None
            request = Message(type=Message.MessageType.GET_VALUE, key=key.encode()).SerializeToString()
            try:
                await stream.write(encode_uvarint(len(request)) + request)
            except Exception as exc:  # the peer hung up before we asked: nothing was received
                log.debug("GET_VALUE to %s: cannot send: %s", peer_id, exc)
                return None
            try:
                return value_from_reply(await _read_reply(stream), key, check)
            except Rejected as exc:
                scores.reject(peer_id, exc.reason, f"DHT GET_VALUE reply for {key}: {exc}")
                return None
        if stream is not None:  # the request went out and no reply came in time
            error = Stalled(f"no GET_VALUE reply within {timeout_s:g} s")
            scores.reject(peer_id, error.reason, f"DHT GET_VALUE reply for {key}: {error}")
        return None
    finally:
        if stream is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):  # also when another peer won
                await close_quietly(stream)


async def _read_reply(stream: INetStream) -> bytes:
    """The reply's bytes; its declared length is checked against MAX_GET_REPLY before the body is read."""
    try:
        return await read_varint_prefixed_bytes_limited(stream, MAX_GET_REPLY)
    except MessageTooLarge as exc:
        raise Oversize(f"GET_VALUE reply: {exc}") from None
    except ParseError as exc:
        raise MalformedReply(f"GET_VALUE reply length: {exc}") from None
    except IncompleteReadError as exc:
        raise Truncated(f"GET_VALUE reply: {exc}") from None
    except Exception as exc:  # libp2p signals a reset or closed stream with several exception types
        raise Truncated(f"GET_VALUE reply cut off ({type(exc).__name__})") from None


def value_from_reply(reply: bytes, key: str, check: RecordCheck) -> bytes | None:
    """The record value of a GET_VALUE reply if it passes ``check``; None for an honest "not here".

    Raises ``Rejected``: ``malformed`` for bytes that are not a GET_VALUE reply, ``check``'s reason
    for a value that is not genuine. The sender's signed peer record and the closer peers a reply
    carries are ignored: this get does not walk the network, and the peerstore learns addresses
    from verified adverts.
    """
    message = Message()
    try:
        message.ParseFromString(reply)
    except DecodeError as exc:
        raise MalformedReply(f"GET_VALUE reply is not a DHT message: {exc}") from None
    if message.type != Message.MessageType.GET_VALUE:
        raise MalformedReply(f"reply of type {message.type} to GET_VALUE")
    if not message.HasField("record") or not message.record.value:
        return None
    check(key, message.record.value)
    return message.record.value
