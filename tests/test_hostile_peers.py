"""A real node process (validator role, so every protocol of ours is served) under attack from
in-process libp2p peers: random, empty, truncated, stalled and oversize input on every protocol it
registers, libp2p's own included; gossip RPCs that killed py-libp2p 0.8.1 nodes; idle streams.

After each case the node is alive, answers ``status`` on its control socket, and an honest peer
can query its members over libp2p (``assert_healthy``). specs/guards.md names the guards.
"""

import hashlib
import os
import time

import multiaddr
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.utils.varint import encode_uvarint

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.local_swarm import LocalSwarm
from intellect_node.node.swarm.host import build_host, parse_peer_addr
from intellect_node.node.swarm.membership import MAX_PER_IP
from intellect_node.node.swarm.query import query_members
from intellect_node.protocol import codec
from intellect_node.protocol.framing import HEADER, MEMBERS_PROTOCOL, ROLLOUTS_PROTOCOL
from intellect_node.protocol.keys import members_topic
from tests.support.protocol_samples import sample_advert

pytestmark = pytest.mark.slow
RUN = "guard-test"
MESHSUB = "/meshsub/1.1.0"
PROTOCOLS = ["/ipfs/id/1.0.0", "/ipfs/id/push/1.0.0", "/ipfs/ping/1.0.0", "/ipfs/kad/1.0.0", MESHSUB,
             MEMBERS_PROTOCOL, ROLLOUTS_PROTOCOL]
# Raw inputs: each is written on a fresh stream, then the stream is closed (EOF), or left open.
INPUTS = {
    "random_2k": os.urandom(2048),
    "empty": b"",
    "varint_500_then_10": encode_uvarint(500) + os.urandom(10),
    "u32_500_then_10": HEADER.pack(500) + os.urandom(10),
    "announces_4gib": encode_uvarint(4 << 30) + HEADER.pack((4 << 30) - 1) + os.urandom(100),
    "rpc_of_zero_bytes": encode_uvarint(4000) + bytes(4000),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    swarm = LocalSwarm(tmp_path_factory.mktemp("guard"), run_id=RUN)
    node = swarm.start("target", ["join", "--role", "validator", "--new-swarm"])
    yield node
    swarm.stop_all()


class Attacker:
    """A libp2p host of its own, dialing the target and writing whatever it likes."""

    def __init__(self, target_addr: str) -> None:
        self.identity = Identity.generate()
        self.host = build_host(self.identity)
        self.target = parse_peer_addr(target_addr)

    async def connect(self) -> None:
        self.host.get_peerstore().add_addrs(self.target.peer_id, self.target.addrs, 600)
        await self.host.connect(self.target)

    async def open(self, protocol: str):
        return await self.host.new_stream(self.target.peer_id, [TProtocol(protocol)])

    async def send(self, protocol: str, raw: bytes, *, close: bool = True) -> None:
        """Write ``raw`` on a new stream, then close it (EOF) or leave it open; transport errors
        (the target resetting us) are the target's right."""
        try:
            stream = await self.open(protocol)
            if raw:
                await stream.write(raw)
            if close:
                await stream.close()
        except Exception:
            pass


async def attack(target_addr: str, action):
    """``action(attacker)``'s result, with the attacker's host running and connected."""
    attacker = Attacker(target_addr)
    async with attacker.host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        await attacker.connect()
        return await action(attacker)


def assert_healthy(target) -> None:
    """Alive, answers status, and an honest stranger's members query lists the target."""
    assert target.process.poll() is None, (target.home / "node.log").read_text()[-3000:]
    assert target.status()["peer_id"] == target.peer_id
    answer = trio.run(query_members, [target.addr], RUN, 10.0)
    assert target.peer_id in {m["peer_id"] for m in answer["members"]}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_frames_on_every_protocol_leave_the_node_serving(target, protocol):
    async def action(attacker):
        for raw in INPUTS.values():
            await attacker.send(protocol, raw)
        await attacker.send(protocol, encode_uvarint(500) + os.urandom(10), close=False)  # then silence
        await trio.sleep(1.0)

    trio.run(attack, target.addr, action)
    assert_healthy(target)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(protocol=st.sampled_from(PROTOCOLS), raw=st.binary(min_size=1, max_size=4096), close=st.booleans())
def test_random_input_never_ends_the_node(target, protocol, raw, close):
    async def action(attacker):
        await attacker.send(protocol, raw, close=close)
        await trio.sleep(0.3)

    trio.run(attack, target.addr, action)
    assert target.process.poll() is None
    assert target.status()["peer_id"] == target.peer_id


def signed_gossip(key: Ed25519PrivateKey, data: bytes, topic: str, *, from_id: bytes | None = None,
                  pubkey: bytes | None = None) -> rpc_pb2.Message:
    """A pubsub message signed the way libp2p signs it; ``from_id``/``pubkey`` override the honest values."""
    public = key.get_public_key()
    msg = rpc_pb2.Message(data=data, topicIDs=[topic], seqno=os.urandom(8),
                          from_id=from_id if from_id is not None else ID.from_pubkey(public).to_bytes())
    msg.signature = key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key = pubkey if pubkey is not None else public.serialize()
    return msg


async def send_rpc(attacker: Attacker, messages: list[rpc_pb2.Message]) -> None:
    rpc = rpc_pb2.RPC(publish=messages).SerializeToString()
    await attacker.send(MESHSUB, encode_uvarint(len(rpc)) + rpc, close=False)


def test_gossip_message_with_garbage_key_is_charged_not_fatal(target):
    """The upstream crash: a sender id that is not an identity hash makes libp2p parse ``key``."""
    before = target.status().get("handler_errors", {})

    async def action(attacker):
        key = Ed25519PrivateKey.new(os.urandom(32))
        hashed_id = b"\x12\x20" + hashlib.sha256(b"not an identity key").digest()  # sha2-256 multihash
        await send_rpc(attacker, [signed_gossip(key, b"x", members_topic(RUN), from_id=hashed_id,
                                                pubkey=os.urandom(40))])
        await trio.sleep(1.5)

    trio.run(attack, target.addr, action)
    after = target.status()["handler_errors"]
    assert sum(after.values()) > sum(before.values()), after
    assert_healthy(target)


def test_sybil_flood_of_members_cannot_blind_the_node(target):
    """600 fresh identities with valid signed adverts on gossip: the table stays bounded and the
    members response still fits its frame, so an honest query still sees the target."""

    async def action(attacker):
        batch = []
        for _ in range(600):
            sybil = Identity.generate()
            envelope = codec.encode(sample_advert(sybil, run_id=RUN), sybil, lifetime_s=600)
            batch.append(signed_gossip(Ed25519PrivateKey.new(sybil.seed), envelope, members_topic(RUN)))
            if len(batch) == 50:
                await send_rpc(attacker, batch)
                batch = []
                await trio.sleep(0.1)
        await trio.sleep(2.0)

    trio.run(attack, target.addr, action)
    members = target.status()["members"]
    assert 1 < len(members) <= MAX_PER_IP, len(members)  # every sybil advertises 127.0.0.1
    assert_healthy(target)


def test_idle_streams_do_not_stall_an_honest_delivery_or_dht_get(target):
    """Idle streams on rollouts and kad from one peer: an honest peer is served within seconds."""
    from intellect_node.node.swarm.dht_get import ask_peer
    from intellect_node.node.swarm.membership import check_advert_record
    from intellect_node.node.swarm.peer_scores import PeerScores
    from intellect_node.node.swarm.streams import read_frame
    from intellect_node.protocol.framing import MAX_DELIVERY_REPLY, decode_delivery_reply, frame
    from intellect_node.protocol.keys import advert_key

    async def honest(addr: str) -> tuple[float, str, float]:
        peer = Attacker(addr)  # an honest stranger: same plumbing, well-formed input
        async with peer.host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            await peer.connect()
            start = time.monotonic()
            stream = await peer.open(ROLLOUTS_PROTOCOL)
            await stream.write(frame(b"\x00" * 200))  # refused at once, but answered
            status, _ = decode_delivery_reply(await read_frame(stream, MAX_DELIVERY_REPLY, 20.0))
            delivery_s = time.monotonic() - start
            start = time.monotonic()
            with trio.fail_after(10):
                await ask_peer(peer.host, peer.target.peer_id, advert_key(RUN, peer.target.peer_id.to_base58()),
                               check_advert_record, PeerScores())
            return delivery_s, status, time.monotonic() - start

    async def action(attacker):
        held = []
        for protocol, count in ((ROLLOUTS_PROTOCOL, 8), ("/ipfs/kad/1.0.0", 16)):
            for _ in range(count):
                try:
                    held.append(await attacker.open(protocol))
                except Exception:
                    pass
        return await honest(target.addr)

    delivery_s, status, get_s = trio.run(attack, target.addr, action)
    assert status == "rejected" and delivery_s < 3.0, (status, delivery_s)
    assert get_s < 3.0
    assert_healthy(target)



def control_client(target, payload: bytes, *, read_reply: bool) -> bytes:
    """Send ``payload`` on the control socket; the reply, or b"" when leaving without reading it."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(target.home / "control.sock"))
        try:
            sock.sendall(payload)
        except OSError:  # the node closed after reading its limit: the rest is ours to lose
            pass
        if not read_reply:
            return b""
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:  # the node closed with our excess unread: the reply came first
            pass
        return b"".join(chunks)


def test_control_socket_survives_oversize_idle_and_departing_clients(target):
    import json
    import socket

    reply = json.loads(control_client(target, b"x" * 4096, read_reply=True))
    assert reply["ok"] is False and "1024" in reply["error"]
    for _ in range(20):  # leave before the reply is written
        control_client(target, b"status\n", read_reply=False)
    control_client(target, b"x" * (16 << 20), read_reply=False)
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(30)]
    try:
        for sock in idle:
            sock.connect(str(target.home / "control.sock"))
        start = time.monotonic()
        assert target.status()["peer_id"] == target.peer_id  # waits for a slot, at most the read timeout
        assert time.monotonic() - start < 4.5
    finally:
        for sock in idle:
            sock.close()
    assert_healthy(target)
