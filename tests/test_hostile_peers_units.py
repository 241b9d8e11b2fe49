"""In-process parts of issue 21's guards: the service supervisor, the bounded member table and
its members response, and decoding limits. Real nodes on 127.0.0.1 where a node is involved."""

from collections import Counter

import trio

from tests.support.inprocess_nodes import make_node
from tests.support.waiting import poll_until, poll_up_to

RUN = "guard-units"


class FailsTwice:
    """A service that raises twice before it settles: the node must keep running meanwhile."""

    name = "fails-twice"

    def __init__(self) -> None:
        self.starts = 0

    def status(self) -> dict:
        return {"starts": self.starts}

    async def run(self, node, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.starts += 1
        task_status.started()
        if self.starts <= 2:
            raise RuntimeError(f"failure number {self.starts}")
        await trio.sleep_forever()


async def test_failing_service_is_restarted_and_shown_in_status(tmp_path, nursery):
    service = FailsTwice()
    node = make_node(tmp_path, "node", RUN, services=[service])
    await nursery.start(node.run)
    await poll_until(lambda: service.starts >= 3, 10, poll_s=0.1)  # backoff 1 s, then 2 s
    await trio.sleep(0.1)
    state = node.snapshot()["supervisor"]["fails-twice"]
    assert state == {"state": "running", "restarts": 2, "last_error": "RuntimeError: failure number 2"}
    assert node.snapshot()["supervisor"]["advertise_loop"]["state"] == "running"


def advert_envelope(identity, ip: str, now: int, *, long_addrs: bool = False) -> bytes:
    from intellect_node.protocol import codec
    from tests.support.protocol_samples import sample_advert

    port_pad = "/p2p-circuit" * 12 if long_addrs else ""
    addrs = tuple(f"/ip4/{ip}/tcp/{4000 + i}{port_pad}/p2p/{identity.peer_id}" for i in range(16 if long_addrs else 1))
    return codec.encode(sample_advert(identity, run_id=RUN, addrs=addrs), identity, lifetime_s=600, timestamp_ms=now)


def test_sybil_flood_keeps_known_and_proven_members_and_the_response_fits_its_frame():
    from intellect_node.crypto.envelope import now_ms
    from intellect_node.crypto.identity import Identity
    from intellect_node.node.swarm.membership import (
        MAX_PER_IP,
        MAX_PER_SUBNET,
        MemberView,
        TableFull,
        advertised_ip,
        subnet,
    )
    from intellect_node.protocol.framing import MAX_MEMBERS_RESPONSE, decode_envelope_list, encode_envelope_list

    view, now = MemberView(RUN), now_ms()
    honest = [Identity.generate() for _ in range(3)]
    for index, identity in enumerate(honest):
        view.accept(advert_envelope(identity, "127.0.0.1", now - 1000), now=now - 1000 + index)
    worker = Identity.generate()
    refused = 0
    for index in range(600):  # 600 sybils: one IP, then spread over many /24s, big adverts
        sybil = Identity.generate()
        ip = "127.0.0.1" if index < 100 else f"10.{index % 250}.{index // 250}.{index % 7}"
        try:
            view.accept(advert_envelope(sybil, ip, now, long_addrs=index >= 100), now=now + index)
        except TableFull:
            refused += 1
        if index == 300:  # a worker whose batch was accepted joins mid-flood from the crowded IP
            view.vouch(worker.peer_id)
            view.accept(advert_envelope(worker, "127.0.0.1", now), now=now + index)
    held = {m.advert.peer_id for m in view.members(now=now + 1000)}
    assert {i.peer_id for i in honest} | {worker.peer_id} <= held
    from_loopback = [m for m in view.members(now=now + 1000) if m.advert.addrs[0].startswith("/ip4/127.0.0.1/")]
    assert len(from_loopback) <= MAX_PER_IP and refused >= 100 - MAX_PER_IP
    subnets = Counter(subnet(advertised_ip(m.advert)) for m in view.members(now=now + 1000))
    assert max(subnets.values()) <= MAX_PER_SUBNET
    response = encode_envelope_list(view.envelopes())
    assert len(response) <= MAX_MEMBERS_RESPONSE
    listed = decode_envelope_list(response)
    assert listed[0] == view.get(worker.peer_id).envelope  # proven first
    assert {view.get(i.peer_id).envelope for i in honest} <= set(listed[:4])


def test_a_node_that_handles_no_manifests_does_not_charge_their_forwarder(tmp_path) -> None:
    """A bootstrap node handles only rollout announcements, yet forwards the run's announcements
    topic: a manifest of many shards (bigger than any rollout announcement) is an unknown type
    to it, free for the honest forwarder; only what exceeds the topic's own bound is oversize.
    (Judged against its own types, every manifest of a real checkpoint cost the trainer 25 points
    at every bootstrap node: banned after four steps.)"""
    from types import SimpleNamespace

    from libp2p.peer.id import ID

    from intellect_node.crypto.identity import Identity
    from intellect_node.node.shards.checkpoint import build_manifest
    from intellect_node.node.swarm.gossip import install_validator
    from intellect_node.node.swarm.peer_scores import PeerScores
    from intellect_node.protocol import codec
    from intellect_node.protocol.keys import ANNOUNCE_MAX_BYTES
    from intellect_node.protocol.manifest import CheckpointManifest
    from intellect_node.protocol.rollouts import RolloutAnnouncement
    from intellect_node.protocol.verdicts import Verdict
    from tests.support.shards_swarm import make_checkpoint

    assert max(CheckpointManifest.MAX_SIZE, Verdict.MAX_SIZE, RolloutAnnouncement.MAX_SIZE) <= ANNOUNCE_MAX_BYTES
    make_checkpoint(tmp_path / "step-1.safetensors", 3, seed=1)
    trainer = Identity.generate()
    manifest = build_manifest(tmp_path / "step-1.safetensors", run_id=RUN, step=1, parent_step=None, shard_size=1 << 16)
    envelope = codec.encode(manifest, trainer, lifetime_s=600)
    assert len(envelope) > RolloutAnnouncement.MAX_SIZE
    validators = {}
    pubsub = SimpleNamespace(set_topic_validator=lambda topic, fn, is_async: validators.__setitem__(topic, fn))
    scores = PeerScores()
    install_validator(pubsub, "announce", (RolloutAnnouncement,), lambda signed, raw: True, scores,
                      max_size=ANNOUNCE_MAX_BYTES)
    forwarder = Identity.generate()
    origin = ID.from_base58(trainer.peer_id).to_bytes()
    assert validators["announce"](ID.from_base58(forwarder.peer_id),
                                  SimpleNamespace(data=envelope, from_id=origin)) is False
    assert scores.rejections["unknown_type"] == 1 and scores.penalty(forwarder.peer_id) == 0
    huge = envelope + bytes(ANNOUNCE_MAX_BYTES)
    validators["announce"](ID.from_base58(forwarder.peer_id), SimpleNamespace(data=huge, from_id=origin))
    assert scores.rejections["oversize"] == 1 and scores.penalty(forwarder.peer_id) > 0


async def test_garbage_on_dialback_ends_in_a_counted_charged_rejection_inside_its_handler(tmp_path, nursery) -> None:
    """Random bytes, a length prefix over the 2-byte limit, a truncated frame and a request of the
    wrong size on /ina/dialback/1.0.0: each is counted (outcome ``rejected``) and charged by its
    reason in the handler, nothing reaches the stream guard, and the server still answers."""
    from libp2p.custom_types import TProtocol

    from intellect_node.node.swarm.nat.reachability import REFUSED, ask, tcp_port
    from intellect_node.protocol.framing import DIALBACK_PROTOCOL, HEADER

    server = make_node(tmp_path, "server", RUN)
    addrs = await nursery.start(server.run)
    requester = make_node(tmp_path, "requester", RUN, bootstrap=addrs)
    await nursery.start(requester.run)
    peer = server.host.get_id()
    garbage = [
        (b"\x8f\x13\xa2\x07" + bytes(range(60)), "oversize"),  # random bytes: a huge length prefix
        (HEADER.pack(1 << 30), "oversize"),
        (HEADER.pack(2) + b"\x01", "truncated"),  # then the stream ends
        (HEADER.pack(1) + b"\x01", "invalid_value"),  # a port is 2 bytes
    ]
    for sent, (data, reason) in enumerate(garbage, start=1):
        before = server.scores.rejections[reason]
        stream = await requester.host.new_stream(peer, [TProtocol(DIALBACK_PROTOCOL)])
        await stream.write(data)
        await stream.close()
        await poll_up_to(lambda sent=sent: server.nat.dialback.outcomes["rejected"] >= sent, 5, poll_s=0.02)
        assert server.nat.dialback.outcomes["rejected"] == sent, data
        assert server.scores.rejections[reason] == before + 1, reason
    assert not server.guard.errors and server.scores.rejections["handler_error"] == 0
    assert server.scores.penalty(requester.peer_id) > 0 and not server.scores.is_banned(requester.peer_id)
    server.nat.dialback._last_by_ip["127.0.0.1"] = __import__("time").monotonic()  # so the answer is a quick refusal
    answer = None
    with trio.move_on_after(10):
        while answer is None:  # the last handler may still hold the peer's one dial-back slot
            answer = await ask(requester.host, peer, tcp_port(requester.addrs()) or 1)
    assert answer == (REFUSED, "127.0.0.1")


def test_forwarders_of_checkpoint_manifests_are_never_charged_for_whose_signature_it_is(tmp_path) -> None:
    """An inference node started without --trainer cannot judge a manifest: it drops it unforwarded,
    counts it (``unjudgeable``) and charges nobody (it charged honest forwarders 60 points per
    trainer checkpoint). A node that knows the trainer charges a foreign manifest to its signer,
    never to the forwarder, and accepts the trainer's."""
    from types import SimpleNamespace

    from libp2p.peer.id import ID

    from intellect_node.crypto.identity import Identity
    from intellect_node.node.shards.checkpoint import build_manifest
    from intellect_node.node.shards.config import ShardConfig
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.swarm.gossip import install_validator
    from intellect_node.protocol import codec
    from intellect_node.protocol.keys import ANNOUNCE_MAX_BYTES
    from tests.support.shards_swarm import make_checkpoint

    make_checkpoint(tmp_path / "step-1.safetensors", 3, seed=1)
    manifest = build_manifest(tmp_path / "step-1.safetensors", run_id=RUN, step=1, parent_step=None, shard_size=1 << 16)
    trainer, rogue, forwarder = Identity.generate(), Identity.generate(), Identity.generate()

    def gossip_validator(name: str, trainer_id: str | None):  # type: ignore[no-untyped-def]
        node = make_node(tmp_path, name, RUN)
        ShardService(node, ShardConfig(data_dir=tmp_path / name / "shards", trainer=trainer_id))
        validators = {}
        pubsub = SimpleNamespace(set_topic_validator=lambda topic, fn, is_async: validators.__setitem__(topic, fn))
        accepted = tuple(cls for cls, _ in node.announcements.handlers.values())  # as Node.run installs it
        install_validator(pubsub, "announce", accepted, node.announcements.dispatch, node.scores,
                          max_size=ANNOUNCE_MAX_BYTES)

        def deliver(signer: Identity) -> bool:
            message = SimpleNamespace(data=codec.encode(manifest, signer, lifetime_s=600),
                                      from_id=ID.from_base58(signer.peer_id).to_bytes())
            return validators["announce"](ID.from_base58(forwarder.peer_id), message)
        return node, deliver

    inference, deliver = gossip_validator("no-trainer", None)
    assert deliver(trainer) is False and deliver(rogue) is False
    assert inference.scores.rejections["unjudgeable"] == 2
    assert inference.scores.penalty(forwarder.peer_id) == 0 and inference.scores.penalty(trainer.peer_id) == 0

    knowing, deliver = gossip_validator("knows-trainer", trainer.peer_id)
    assert deliver(trainer) is True
    assert deliver(rogue) is False
    assert knowing.scores.rejections["unauthorized_signer"] == 1
    assert knowing.scores.penalty(forwarder.peer_id) == 0 and knowing.scores.penalty(rogue.peer_id) > 59
