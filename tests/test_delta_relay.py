"""Each server's seeding of delta bodies and a follower's held bodies (specs/deltas.md section 4),
what a follower accepts from a 409 that names holders, and whom a server names."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.delta_follower import MAX_NAMED, DeltaFollower, _DeltaSearch
from intellect_node.node.shards.delta_relay import KEPT_STEPS, DeltaSeeds, HeldBodies
from intellect_node.node.shards.server import SEED_HOLDERS, ServeError, ShardServer
from intellect_node.node.shards.store import ShardStore
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol.errors import Rejected

PEERS = [f"12D3KooW{letter * 44}" for letter in "ABCDEFGHJKLM"]  # base58: no I, l, O or 0
HOLD = 10.0


def test_the_trainer_sends_its_copies_then_names_their_holders_newest_first():
    seeds = DeltaSeeds(copies=2, hold_s=HOLD, max_named=SEED_HOLDERS)
    assert seeds.refusal(5, now=0.0) is None
    seeds.started(5, PEERS[0])
    assert seeds.refusal(5, now=0.0) is None  # one copy of two under way
    seeds.started(5, PEERS[1])
    assert seeds.refusal(5, now=0.0) == [PEERS[1], PEERS[0]]  # both under way: named before they finish
    seeds.ended(5, PEERS[0], now=1.0, whole=True)
    seeds.ended(5, PEERS[1], now=2.0, whole=True)
    assert seeds.refusal(5, now=2.0 + HOLD) == [PEERS[1], PEERS[0]]
    assert seeds.refusal(6, now=3.0) is None  # another step has its own copies


def test_after_a_hold_with_nothing_under_way_one_more_copy_goes_out():
    seeds = DeltaSeeds(copies=1, hold_s=HOLD, max_named=SEED_HOLDERS)
    seeds.started(1, PEERS[0])
    seeds.ended(1, PEERS[0], now=100.0, whole=True)
    assert seeds.refusal(1, now=100.0 + HOLD - 0.1) == [PEERS[0]]
    assert seeds.refusal(1, now=100.0 + HOLD + 0.1) is None  # the holder may have left
    seeds.started(1, PEERS[1])  # that copy counts again: refused for another hold after it
    assert seeds.refusal(1, now=200.0) == [PEERS[1], PEERS[0]]
    seeds.ended(1, PEERS[1], now=201.0, whole=True)
    assert seeds.refusal(1, now=201.0 + HOLD - 0.1) == [PEERS[1], PEERS[0]]


def test_an_upload_that_did_not_arrive_whole_is_no_copy_and_names_nobody():
    seeds = DeltaSeeds(copies=1, hold_s=HOLD, max_named=SEED_HOLDERS)
    seeds.started(1, PEERS[0])
    seeds.ended(1, PEERS[0], now=1.0, whole=False)
    assert seeds.refusal(1, now=1.0) is None
    seeds.started(1, PEERS[1])
    seeds.ended(1, PEERS[1], now=2.0, whole=True)
    assert seeds.refusal(1, now=2.0) == [PEERS[1]]


def test_names_are_bounded_and_old_steps_forgotten():
    seeds = DeltaSeeds(copies=1, hold_s=HOLD, max_named=SEED_HOLDERS)
    for peer in PEERS:  # the re-sends after holds add holders; a 409 names the newest eight
        seeds.started(1, peer)
    assert seeds.refusal(1, now=0.0) == PEERS[::-1][:SEED_HOLDERS]
    for step in range(2, 2 + KEPT_STEPS):
        seeds.started(step, PEERS[0])
    assert seeds.refusal(1, now=0.0) is None  # step 1's hand-outs were dropped with the oldest
    assert seeds.refusal(1 + KEPT_STEPS, now=0.0) == [PEERS[0]]


def test_a_held_body_is_served_from_its_own_descriptor_until_released():
    held = HeldBodies()
    body = os.urandom(300_000)
    held.hold(7, body)
    opened = held.open(7)
    assert opened is not None
    fd, size = opened
    try:
        assert size == len(body) and os.pread(fd, size, 0) == body
        held.release(7)  # a reader holding its own descriptor finishes its answer
        assert os.pread(fd, 10, size - 10) == body[-10:]
    finally:
        os.close(fd)
    assert held.open(7) is None
    held.release(7)  # releasing twice is harmless


def follower(tmp_path: Path, members: list[str], banned: frozenset[str] = frozenset()) -> DeltaFollower:
    """A follower with just what reading a 409 consults: its own id, the member view, the bans."""
    view = SimpleNamespace(members=lambda: [SimpleNamespace(advert=SimpleNamespace(
        peer_id=p, addrs=(f"/ip4/127.0.0.1/tcp/{4000 + i}/http",))) for i, p in enumerate(members)])
    node = SimpleNamespace(peer_id=PEERS[11], view=view, config=SimpleNamespace(run_id="r"),
                           scores=SimpleNamespace(is_banned=lambda p: p in banned))
    config = ShardConfig(data_dir=tmp_path, trainer=PEERS[10])
    return DeltaFollower(node, config, store=None, client=None, streams=None, counters={},  # type: ignore[arg-type]
                         decode_manifest=None, trainer=PEERS[10])  # type: ignore[arg-type]


def test_a_409_names_holders_with_the_addresses_their_adverts_give(tmp_path):
    deltas = follower(tmp_path, [PEERS[0], PEERS[1]], banned=frozenset({PEERS[2]}))
    named = deltas._named(json.dumps({"holders": [PEERS[1], PEERS[3], PEERS[2], PEERS[11], PEERS[10]]}).encode())
    # unknown members come without addresses; banned ones, this node and the trainer are left out
    assert named == [(PEERS[1], ("/ip4/127.0.0.1/tcp/4001/http",)), (PEERS[3], ())]


@pytest.mark.parametrize("body", [
    b"not json",
    b"[]",
    json.dumps({"holders": PEERS[0]}).encode(),
    json.dumps({"holders": PEERS[:SEED_HOLDERS + 1]}).encode(),
    json.dumps({"holders": ["12D3KooWnotapeer"]}).encode(),
    json.dumps({"holders": [7]}).encode(),
    json.dumps({"holders": [], "suggest": [1]}).encode(),
])
def test_a_409_that_is_not_a_short_list_of_peer_ids_is_refused(tmp_path, body):
    with pytest.raises(Rejected):
        follower(tmp_path, PEERS[:2])._named(body)


def test_a_search_waits_after_a_refusal_and_asks_the_trainer_again_only_after_its_hold():
    search = _DeltaSearch(hold_s=HOLD)
    assert not search.waiting(now=0.0)  # no 409 yet: a round without a body ends the search
    a, b = (PEERS[0], ()), (PEERS[1], ())
    search.refused(False, [a], now=1.0)  # a member's 409: wait, but the trainer may be asked at once
    assert search.named == [a] and search.trainer_again == 0.0 and search.waiting(now=1.0)
    search.refused(True, [b, a], now=2.0)  # the trainer's: not asked again for a hold
    assert search.named == [b, a] and search.trainer_again == 2.0 + HOLD
    assert search.waiting(now=1.0 + 3 * HOLD - 0.1) and not search.waiting(now=1.0 + 3 * HOLD)  # from the first 409
    many = [(p, ()) for p in PEERS] * 4
    for i in range(0, len(many), SEED_HOLDERS):
        search.refused(False, [(f"{p}{i}", ()) for p, _ in many[i:i + SEED_HOLDERS]], now=3.0)
    assert len(search.named) == MAX_NAMED and search.named[0][0].endswith(str(len(many) - SEED_HOLDERS))


class CollectingReply:
    """What a transport would send, kept: the body's bytes through the server's own send path."""

    def __init__(self) -> None:
        self.body = bytearray()

    async def body_head(self, status: int, start: int, end: int, total: int) -> None:
        assert status == 200 and start == 0 and end == total - 1

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        data = os.pread(fd, count, offset)
        self.body += data
        return len(data)


async def test_a_server_names_only_peers_that_signed_their_request_and_serve(tmp_path):
    """A held body (its step still being built here) is served; one copy is handed out, to a signed
    peer that serves, then 409 names it. An unsigned request (keyed by its address) or a peer behind
    NAT takes a copy that counts for nothing: their keys are never named to others."""
    config = ShardConfig(data_dir=tmp_path, delta_seed_copies=1)
    held = HeldBodies()
    body = os.urandom(50_000)
    held.hold(3, body)
    nated = PEERS[5]
    server = ShardServer(ShardStore(tmp_path, "r"), config, PEERS[11], PeerScores(),
                         relays=lambda peer: peer != nated, held=held)
    for peer in ("addr:10.0.0.7", nated, PEERS[0]):
        reply = CollectingReply()
        await server._send_delta(reply, 3, None, peer)
        assert bytes(reply.body) == body
    with pytest.raises(ServeError) as refused:
        await server._send_delta(CollectingReply(), 3, None, PEERS[1])
    assert refused.value.status == 409 and json.loads(str(refused.value)) == {"holders": [PEERS[0]]}
    with pytest.raises(ServeError) as missing:
        await server._send_delta(CollectingReply(), 4, None, PEERS[1])
    assert missing.value.status == 404
    held.release(3)
