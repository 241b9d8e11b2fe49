"""The bounded DHT get (node/swarm/dht_get.py) against real libp2p hosts on 127.0.0.1: an honest DHT
server that holds an advert, and hostile peers that speak the Kademlia protocol but answer
GET_VALUE with forged records, oversize or garbage replies, or nothing at all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import msgpack
import multiaddr
import pytest
import trio
from libp2p.abc import IHost, INetStream
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.pb.kademlia_pb2 import Message
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import encode_uvarint, read_varint_prefixed_bytes_limited

from intellect_node.crypto.envelope import now_ms, seal
from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.dht_get import MAX_GET_REPLY, bounded_get
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.membership import AdvertRecordValidator, check_advert_record
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec
from intellect_node.protocol.keys import DHT_NAMESPACE, advert_key
from tests.support.protocol_samples import sample_advert

RUN = "dht-get-test"
LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
PEER_TIMEOUT_S = 0.5  # the stalling peer costs the test this long, not the default 2 s


def advert_of(identity: Identity, signer: Identity | None = None, **changes) -> bytes:
    """``identity``'s advert, signed by ``signer`` (a forgery when that is another key)."""
    advert = sample_advert(identity, run_id=RUN, **changes)
    if signer is None:
        return codec.encode(advert, identity, lifetime_s=60)
    return seal(signer, "node_advert", 1, msgpack.packb(advert.to_wire()), lifetime_s=60)


def framed(message: Message) -> bytes:
    data = message.SerializeToString()
    return encode_uvarint(len(data)) + data


def reply_with(value: bytes, key: str) -> bytes:
    """A well-formed GET_VALUE reply carrying ``value`` as the record."""
    reply = Message(type=Message.MessageType.GET_VALUE, key=key.encode())
    reply.record.key = key.encode()
    reply.record.value = value
    return framed(reply)


# What a hostile peer writes after reading a GET_VALUE request for ``key`` (None: it stalls).
Reply = Callable[[str], bytes | None]
VICTIM = Identity.generate()
ATTACKS: dict[str, tuple[str, Reply]] = {
    "forged_record": ("signer_mismatch", lambda key: reply_with(advert_of(VICTIM, signer=Identity.generate()), key)),
    "tampered_record": ("bad_signature", lambda key: reply_with(advert_of(VICTIM)[:-1] + b"\x00", key)),
    "record_under_another_key": ("invalid_value", lambda key: reply_with(advert_of(Identity.generate()), key)),
    "oversize_reply": ("oversize", lambda key: encode_uvarint(MAX_GET_REPLY + 1) + b"\x00" * 1000),
    "garbage_bytes": ("malformed", lambda key: encode_uvarint(64) + b"\xff" * 64),
    "wrong_message_type": ("malformed", lambda key: framed(Message(type=Message.MessageType.PING, key=key.encode()))),
    "truncated_reply": ("truncated", lambda key: encode_uvarint(500) + b"\x08" * 10),
    "stall": ("timeout", lambda key: None),
}


@dataclass
class HostilePeer:
    """A libp2p host that serves the Kademlia protocol id but answers GET_VALUE with ``reply``;
    any other request (the fallback's FIND_NODE, entry-correction puts) gets its stream closed."""

    host: IHost
    reply: Reply
    get_requests: list[bytes] = field(default_factory=list)

    async def handle(self, stream: INetStream) -> None:
        try:
            request = Message()
            request.ParseFromString(await read_varint_prefixed_bytes_limited(stream, 4096))
            if request.type != Message.MessageType.GET_VALUE:
                return
            self.get_requests.append(request.key)
            data = self.reply(request.key.decode())
            if data is None:
                await trio.sleep_forever()
            await stream.write(data)
        finally:
            with trio.CancelScope(shield=True):
                await stream.close()


@asynccontextmanager
async def running_host() -> AsyncIterator[IHost]:
    host = build_host(Identity.generate())
    async with host.run(listen_addrs=LISTEN):
        yield host


@asynccontextmanager
async def dht_server(value_key: str | None = None, value: bytes | None = None) -> AsyncIterator[KadDHT]:
    """An honest DHT server holding ``value`` under ``value_key``."""
    async with running_host() as host:
        dht = KadDHT(host, DHTMode.SERVER)
        dht.register_validator(DHT_NAMESPACE, AdvertRecordValidator(PeerScores()))
        async with background_trio_service(dht):
            if value_key is not None and value is not None:
                await dht.put_value(value_key, value)  # no other peers yet: stored here only
            yield dht


@asynccontextmanager
async def hostile_peer(reply: Reply) -> AsyncIterator[HostilePeer]:
    async with running_host() as host:
        peer = HostilePeer(host, reply)
        host.set_stream_handler(PROTOCOL_ID, peer.handle)
        yield peer


@asynccontextmanager
async def client() -> AsyncIterator[KadDHT]:
    """The asking side: a DHT client (it stores nothing for others, so every get is remote)."""
    async with running_host() as host:
        dht = KadDHT(host, DHTMode.CLIENT)
        dht.register_validator(DHT_NAMESPACE, AdvertRecordValidator(PeerScores()))
        async with background_trio_service(dht):
            yield dht


async def know(dht: KadDHT, *hosts: IHost) -> None:
    """Connect to ``hosts`` and put them in the routing table, as joining and discovery do."""
    for other in hosts:
        await dht.host.connect(PeerInfo(other.get_id(), other.get_addrs()))
        assert await dht.routing_table.add_peer(other.get_id())


async def get(dht: KadDHT, key: str, scores: PeerScores, owner: ID | None = None) -> bytes | None:
    with trio.fail_after(10):  # a hang is a failure, not a slow pass
        return await bounded_get(dht, key, check_advert_record, scores, owner=owner, peer_timeout_s=PEER_TIMEOUT_S,
                                 timeout_s=3 * PEER_TIMEOUT_S)


async def test_gets_the_advert_an_honest_server_holds():
    owner = Identity.generate()
    key, value = advert_key(RUN, owner.peer_id), advert_of(owner)
    scores = PeerScores()
    async with dht_server(key, value) as holder, dht_server() as empty, client() as asker:
        await know(asker, holder.host, empty.host)
        assert await get(asker, key, scores) == value
        assert await get(asker, advert_key(RUN, Identity.generate().peer_id), scores) is None  # held nowhere
    assert not scores.rejections  # "not here" is an honest answer


async def test_a_server_answers_from_its_own_store_before_asking_peers():
    owner = Identity.generate()
    key, value = advert_key(RUN, owner.peer_id), advert_of(owner)
    async with dht_server(key, value) as holder, hostile_peer(ATTACKS["stall"][1]) as staller:
        await know(holder, staller.host)
        assert await get(holder, key, PeerScores()) == value
        assert not staller.get_requests


async def test_the_owner_is_asked_beside_the_closest_peers():
    """The first node of a swarm stores its advert while alone: only it holds it, not the peers
    closest to the key."""
    owner = Identity.generate()
    key, value = advert_key(RUN, owner.peer_id), advert_of(owner)
    not_here = lambda k: framed(Message(type=Message.MessageType.GET_VALUE, key=k.encode()))  # noqa: E731
    async with hostile_peer(not_here) as empty, dht_server(key, value) as holder, client() as asker:
        await know(asker, empty.host)
        holder_id = holder.host.get_id()
        asker.host.get_peerstore().add_addrs(holder_id, holder.host.get_addrs(), 600)  # e.g. from its provider record
        assert await get(asker, key, PeerScores(), owner=holder_id) == value
        assert len(empty.get_requests) <= 1  # libp2p's fallback lookup would have asked it again


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_a_hostile_reply_is_rejected_counted_and_charged(name):
    reason, reply = ATTACKS[name]
    owner = Identity.generate()
    key, value = advert_key(RUN, owner.peer_id), advert_of(owner)
    scores = PeerScores()
    async with hostile_peer(reply) as attacker, dht_server(key, value) as holder, client() as asker:
        await know(asker, attacker.host)  # the attacker is the only peer asked
        assert await get(asker, key, scores) is None
        assert attacker.get_requests, "the attacker was never asked"
        assert scores.rejections[reason] >= 1
        assert scores.penalty(attacker.host.get_id().to_base58()) > 0

        await know(asker, holder.host)  # the asking node still works: the honest holder's advert arrives
        assert await get(asker, key, scores) == value


async def test_a_bad_reply_does_not_spoil_the_get_when_an_honest_peer_answers():
    owner = Identity.generate()
    key, value = advert_key(RUN, owner.peer_id), advert_of(owner)
    scores = PeerScores()
    async with hostile_peer(ATTACKS["garbage_bytes"][1]) as fast_liar, \
            hostile_peer(ATTACKS["stall"][1]) as staller, dht_server(key, value) as holder, client() as asker:
        await know(asker, fast_liar.host, staller.host, holder.host)
        for _ in range(3):
            assert await get(asker, key, scores) == value


async def test_a_banned_peer_is_not_asked():
    owner = Identity.generate()
    key, value = advert_key(RUN, owner.peer_id), advert_of(owner)
    scores = PeerScores()
    async with hostile_peer(ATTACKS["forged_record"][1]) as forger, dht_server(key, value) as holder, \
            client() as asker:
        await know(asker, forger.host)
        forger_id = forger.host.get_id().to_base58()
        while not scores.is_banned(forger_id):  # each forgery costs 60 points; 100 bans
            assert await get(asker, key, scores) is None
            assert len(forger.get_requests) <= 4
        asked = len(forger.get_requests)
        await know(asker, holder.host)
        assert await get(asker, key, scores) == value
        assert len(forger.get_requests) == asked


async def test_an_expired_advert_in_the_store_is_not_returned():
    """Adverts expire long before libp2p drops a stored record (24 h): the store is checked too."""
    owner = Identity.generate()
    key = advert_key(RUN, owner.peer_id)
    expired = codec.encode(sample_advert(owner, run_id=RUN), owner, lifetime_s=5, timestamp_ms=now_ms() - 60_000)
    async with dht_server() as holder:
        holder.value_store.put(key.encode(), expired)  # as if stored while it was valid
        assert await get(holder, key, PeerScores()) is None
