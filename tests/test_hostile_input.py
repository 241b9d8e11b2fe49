"""A real node process under attack from in-process libp2p peers: every bad input is rejected with
its reason, counted, charged to the sender, and the node keeps serving."""

import os

import msgpack
import multiaddr
import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.records.validator import Validator
from libp2p.tools.anyio_service import background_trio_service

from intellect_node.crypto.envelope import now_ms, seal
from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.local_swarm import LocalSwarm
from intellect_node.node.swarm.gossip import build_pubsub
from intellect_node.protocol import codec
from intellect_node.protocol.framing import HEADER, MEMBERS_PROTOCOL, frame
from intellect_node.protocol.keys import DHT_NAMESPACE, advert_key, members_topic
from tests.support.attacker import Attacker
from tests.support.protocol_samples import sample_advert
from tests.support.waiting import poll_until

RUN = "attack-test"


class AcceptAnything(Validator):
    """The attacker's own DHT validator: it sends what an honest node would refuse to store."""

    def validate(self, key: str, value: bytes) -> None:
        pass

    def select(self, key: str, values: list[bytes]) -> int:
        return 0


@pytest.fixture
def target(tmp_path):
    swarm = LocalSwarm(tmp_path, run_id=RUN)
    node = swarm.start_bootstrap("target")
    yield node
    swarm.stop_all()


async def attack(target_addr: str, action) -> None:
    attacker = Attacker(target_addr, RUN)
    async with attacker.host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        await action(attacker)


def rejections(node) -> dict:
    return node.status()["rejections"]


async def wait_for_rejection(node, reason: str, before: int, timeout_s: float = 10.0) -> None:
    await poll_until(lambda: rejections(node).get(reason, 0) > before, timeout_s, poll_s=0.2)


def request(advert: bytes) -> bytes:
    return Attacker.members_request(advert)


STREAM_ATTACKS = {
    "garbage_bytes": ("malformed_body", lambda a: frame(b"\xc1" + os.urandom(299))),  # 0xc1: never msgpack
    "oversize_frame": ("oversize", lambda a: HEADER.pack(50 << 20) + b"x" * 100),
    "truncated_frame": ("truncated", lambda a: HEADER.pack(500) + b"x" * 10),
    "digest_of_odd_length": ("invalid_value", lambda a: frame(msgpack.packb([a.advert(), b"x" * 13]))),
    "digest_over_a_full_view": ("oversize", lambda a: frame(msgpack.packb([b"", bytes(8 * 1025)]))),
    "tampered_advert": ("bad_signature", lambda a: request(a.advert()[:-1] + bytes([a.advert()[-1] ^ 1]))),
    "signed_by_another_key": ("signer_mismatch",
                              lambda a: request(seal(a.identity, "node_advert", 1, msgpack.packb(
                                  sample_advert(Identity.generate(), run_id=RUN).to_wire()), lifetime_s=60))),
    "expired_advert": ("expired", lambda a: request(codec.encode(sample_advert(a.identity, run_id=RUN), a.identity,
                                                                 lifetime_s=5, timestamp_ms=now_ms() - 60_000))),
    "advert_from_the_future": ("from_future", lambda a: request(codec.encode(
        sample_advert(a.identity, run_id=RUN), a.identity, lifetime_s=5, timestamp_ms=now_ms() + 600_000))),
}


@pytest.mark.parametrize("name", sorted(STREAM_ATTACKS))
async def test_bad_members_stream_input_is_rejected_and_node_survives(target, name):
    reason, make = STREAM_ATTACKS[name]
    before = rejections(target).get(reason, 0)

    async def action(attacker):
        if name == "truncated_frame":  # send part of a frame, then hang up
            async def cut(a):
                await a.send_members_request(make(a))
            with trio.move_on_after(1):
                await cut(attacker)
            await attacker.host.disconnect(attacker.target.peer_id)
        else:
            await attacker.send_members_request(make(attacker))
        await wait_for_rejection(target, reason, before)

    await attack(target.addr, action)
    assert target.process.poll() is None
    status = target.status()
    assert status["peer_id"] == target.peer_id  # still answering


async def test_stalled_stream_times_out(target):
    before = rejections(target).get("timeout", 0)

    async def action(attacker):
        attacker.host.get_peerstore().add_addrs(attacker.target.peer_id, attacker.target.addrs, 600)
        await attacker.host.connect(attacker.target)
        stream = await attacker.host.new_stream(attacker.target.peer_id, [TProtocol(MEMBERS_PROTOCOL)])
        await stream.write(HEADER.pack(100) + b"x" * 10)  # promise 100 bytes, send 10, then stall
        await wait_for_rejection(target, "timeout", before, timeout_s=15)

    await attack(target.addr, action)
    assert target.process.poll() is None


async def test_garbage_and_forged_gossip_is_dropped_and_charged(target):
    before = rejections(target)

    async def action(attacker):
        pubsub, router = build_pubsub(attacker.host)
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            topic = members_topic(RUN)
            await pubsub.subscribe(topic)
            attacker.host.get_peerstore().add_addrs(attacker.target.peer_id, attacker.target.addrs, 600)
            await attacker.host.connect(attacker.target)
            await trio.sleep(2.5)  # let the mesh form
            await pubsub.publish(topic, os.urandom(200))
            other = Identity.generate()  # an honest node's advert, relayed as if the attacker said it
            await pubsub.publish(topic, codec.encode(sample_advert(other, run_id=RUN), other, lifetime_s=60))
            await wait_for_rejection(target, "malformed", before.get("malformed", 0))
            await wait_for_rejection(target, "signer_mismatch", before.get("signer_mismatch", 0))

    await attack(target.addr, action)
    status = target.status()
    assert status["peer_id"] == target.peer_id
    assert all(m["peer_id"] != "" for m in status["members"])


async def test_forged_oversize_and_misplaced_dht_values_are_not_stored(target):
    before = rejections(target)
    victim = Identity.generate()

    async def action(attacker):
        dht = KadDHT(attacker.host, DHTMode.SERVER)
        dht.register_validator(DHT_NAMESPACE, AcceptAnything())
        async with background_trio_service(dht):
            attacker.host.get_peerstore().add_addrs(attacker.target.peer_id, attacker.target.addrs, 600)
            await attacker.host.connect(attacker.target)
            await dht.routing_table.add_peer(attacker.target.peer_id)
            forged = seal(attacker.identity, "node_advert", 1,
                          msgpack.packb(sample_advert(victim, run_id=RUN).to_wire()), lifetime_s=60)
            await dht.put_value(advert_key(RUN, victim.peer_id), forged)
            await dht.put_value(advert_key(RUN, "12D3KooWother"), attacker.advert())  # not its own key
            await dht.put_value(advert_key(RUN, attacker.identity.peer_id), b"\x00" * 20_000)
            with trio.fail_after(10):
                while True:
                    now = rejections(target)
                    if (now.get("signer_mismatch", 0) > before.get("signer_mismatch", 0)
                            and now.get("invalid_value", 0) > before.get("invalid_value", 0)
                            and now.get("oversize", 0) > before.get("oversize", 0)):
                        break
                    await trio.sleep(0.2)

    await attack(target.addr, action)
    assert target.process.poll() is None


async def test_repeat_offender_is_banned_and_cut_off(target):
    async def action(attacker):
        bad = attacker.advert()
        forged = request(bad[:-1] + bytes([bad[-1] ^ 1]))
        for _ in range(2):  # two forgeries cost more than the ban threshold
            await attacker.send_members_request(forged)
        await poll_until(lambda: attacker.identity.peer_id in target.status()["banned"], 10, poll_s=0.2)
        before = rejections(target).get("bad_signature", 0)
        with trio.move_on_after(5):  # a banned peer's streams are not even read
            try:
                await attacker.send_members_request(forged)
            except Exception:
                pass
        assert rejections(target).get("bad_signature", 0) == before

    await attack(target.addr, action)
    assert target.process.poll() is None
