"""The members pull answers only what the caller lacks (issue 51; specs/wire.md section 3).

Real libp2p hosts on 127.0.0.1, each with its own ``MemberExchange``: the caller sends its advert
and the digests of the adverts it holds, and the envelopes that come back on the wire are counted.
A digest that is malformed or too big is rejected with its reason and charged to the caller.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import msgpack
import multiaddr
import pytest

from intellect_node.crypto.envelope import now_ms
from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.churn import serving
from intellect_node.node.swarm import member_exchange
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.member_exchange import MemberExchange
from intellect_node.node.swarm.membership import MAX_MEMBERS, MemberView
from intellect_node.node.swarm.peer_cache import PeerCache
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.query import query_members
from intellect_node.node.swarm.streams import read_frame
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue, MalformedBody, Oversize, Unanswered, WrongType
from intellect_node.protocol.framing import (
    DIGEST_ENTRY,
    HEADER,
    MAX_DIGEST_ENTRIES,
    MAX_MEMBERS_PER_RESPONSE,
    MAX_MEMBERS_REQUEST,
    MEMBERS_PROTOCOL,
    decode_envelope_list,
    decode_members_request,
    encode_members_request,
    envelope_digest,
    frame,
)
from tests.support.protocol_samples import sample_advert

RUN = "digest-test"


def advert(identity: Identity, index: int, timestamp_ms: int | None = None) -> bytes:
    """A node's advert as a real one looks (an address ending in its peer id), one /24 per node so
    the view's per-IP and per-subnet caps keep every one."""
    addr = f"/ip4/10.0.{index % 250}.{1 + index // 250}/tcp/4001/p2p/{identity.peer_id}"
    return codec.encode(sample_advert(identity, run_id=RUN, addrs=(addr,)), identity, lifetime_s=600,
                        timestamp_ms=timestamp_ms)


@dataclass
class Node:
    """A host serving the members protocol over its own view, holding its own advert."""

    identity: Identity
    exchange: MemberExchange
    scores: PeerScores

    @property
    def view(self) -> MemberView:
        return self.exchange.view

    def envelopes(self) -> set[bytes]:
        return {member.envelope for member in self.view.members()}


def make_node(tmp_path, name: str, index: int) -> Node:
    identity, scores, view = Identity.generate(), PeerScores(), MemberView(RUN)
    own = advert(identity, index)
    view.accept(own)
    host = build_host(identity)
    exchange = MemberExchange(host, view, scores, PeerCache(tmp_path / f"{name}.json"), lambda: own)
    exchange.install()
    return Node(identity, exchange, scores)


@asynccontextmanager
async def connected(callee: Node, caller: Node) -> AsyncIterator[None]:
    """Both hosts running on 127.0.0.1, the caller connected to the callee."""
    async with serving(callee.exchange.host) as target:
        caller_host = caller.exchange.host
        async with caller_host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            caller_host.get_peerstore().add_addrs(target.peer_id, target.addrs, 600)
            await caller_host.connect(target)
            yield


@pytest.fixture
def wire(monkeypatch) -> list[tuple[int, int]]:
    """(bytes, envelopes) of every members response a caller decodes, as it came off the wire."""
    seen: list[tuple[int, int]] = []

    def counting(payload: bytes) -> list[bytes]:
        envelopes = decode_envelope_list(payload)
        seen.append((len(payload), len(envelopes)))
        return envelopes

    monkeypatch.setattr(member_exchange, "decode_envelope_list", counting)
    return seen


def others(count: int, first_index: int = 10) -> list[tuple[Identity, bytes]]:
    identities = [Identity.generate() for _ in range(count)]
    return [(identity, advert(identity, first_index + i)) for i, identity in enumerate(identities)]


async def test_a_pull_returns_only_what_the_caller_lacks_and_a_second_pull_nothing(tmp_path, wire):
    """The callee holds 40 members' adverts, the caller 30 of them and an older signing of another:
    the answer is the 9 it lacks and the newer signing, 10 envelopes; then both hold the same view,
    and the next pull carries none."""
    callee, caller = make_node(tmp_path, "callee", 1), make_node(tmp_path, "caller", 2)
    members = others(40)
    now = now_ms()
    resigned_identity, _ = members[-1]
    older, newer = advert(resigned_identity, 49, now - 20_000), advert(resigned_identity, 49, now - 1_000)
    for _, envelope in members[:-1]:
        callee.view.accept(envelope)
    callee.view.accept(newer)
    for _, envelope in members[:30]:
        caller.view.accept(envelope)
    caller.view.accept(older)
    lacking = {envelope for _, envelope in members[30:-1]} | {newer, callee.view.get(callee.identity.peer_id).envelope}

    async with connected(callee, caller):
        await caller.exchange.exchange(callee.exchange.host.get_id())
        assert wire[-1][1] == len(lacking) == 11
        assert caller.view.get(resigned_identity.peer_id).envelope == newer  # the re-signing replaced it
        assert callee.envelopes() == caller.envelopes()  # the callee learned the caller's advert, too
        await caller.exchange.exchange(callee.exchange.host.get_id())
        assert wire[-1][1] == 0
    assert caller.scores.rejections == {} and callee.scores.rejections == {}
    full = sum(len(envelope) + 3 for envelope in callee.envelopes())  # what version 1 answered (bin 16)
    print(f"response bytes: {wire[0][0]} for 11 lacking, {wire[1][0]} for none; a full view: {full} "
          f"({len(callee.envelopes())} adverts, mean {full / len(callee.envelopes()) - 3:.0f} bytes)")


async def test_an_older_signing_the_callee_holds_is_dropped_free(tmp_path, wire):
    """The caller holds a newer signing than the callee: the callee cannot tell (digests are not
    ordered) and sends its older one, which the caller drops as replayed, charging nobody."""
    callee, caller = make_node(tmp_path, "callee", 1), make_node(tmp_path, "caller", 2)
    (identity, _), now = others(1)[0], now_ms()
    older, newer = advert(identity, 10, now - 20_000), advert(identity, 10, now - 1_000)
    callee.view.accept(older)
    caller.view.accept(newer)
    caller.view.accept(callee.view.get(callee.identity.peer_id).envelope)
    async with connected(callee, caller):
        await caller.exchange.exchange(callee.exchange.host.get_id())
    assert wire[-1][1] == 1
    assert caller.view.get(identity.peer_id).envelope == newer
    assert caller.scores.rejections["replayed"] == 1
    assert caller.scores.penalty(callee.identity.peer_id) == 0


async def test_a_newcomer_and_a_read_only_query_get_every_advert(tmp_path, wire):
    """A joining node's view holds only its own advert, so its join exchange gets the whole view;
    a read-only query (``status`` without a node: no advert, an empty digest) gets it all too."""
    callee, caller = make_node(tmp_path, "callee", 1), make_node(tmp_path, "newcomer", 2)
    for _, envelope in others(25):
        callee.view.accept(envelope)
    held = callee.envelopes()
    async with connected(callee, caller):
        await caller.exchange.exchange(callee.exchange.host.get_id())
        assert wire[-1][1] == len(held) == 26
        assert caller.envelopes() == held | {caller.view.get(caller.identity.peer_id).envelope}
        answer = await query_members([str(callee.exchange.host.get_addrs()[0])], RUN, 10.0)
    assert len(answer["members"]) == len(held) + 1 and answer["rejected_adverts"] == 0


BAD_REQUESTS = {
    "digest_not_a_multiple_of_8": ("invalid_value", msgpack.packb([b"", b"x" * 12])),
    "digest_over_1024_entries": ("oversize", msgpack.packb([b"", b"x" * (DIGEST_ENTRY * (MAX_DIGEST_ENTRIES + 1))])),
    "three_entries": ("oversize", msgpack.packb([b"", b"", b""])),
    "nested_digest": ("oversize", msgpack.packb([b"", [b"x" * 8]])),
    "digest_of_an_int": ("wrong_type", msgpack.packb([b"", 5])),
    "a_lone_binary": ("wrong_type", msgpack.packb(b"x" * 8)),
    "version_1_request": ("malformed_body", advert(Identity.generate(), 0)),  # a bare advert envelope
    "not_msgpack": ("malformed_body", b"\xc1" + b"x" * 20),
    "trailing_bytes": ("malformed_body", msgpack.packb([b"", b""]) + b"\x00"),
}


@pytest.mark.parametrize("name", sorted(BAD_REQUESTS) + ["frame_over_the_limit"])
async def test_a_malformed_or_oversize_request_is_rejected_charged_and_unanswered(tmp_path, name):
    callee, caller = make_node(tmp_path, "callee", 1), make_node(tmp_path, "caller", 2)
    for _, envelope in others(5):
        callee.view.accept(envelope)
    if name == "frame_over_the_limit":  # announced on the header: not a byte of it is read
        reason, raw = "oversize", HEADER.pack(MAX_MEMBERS_REQUEST + 1) + b"x" * 100
    else:
        reason, payload = BAD_REQUESTS[name]
        raw = frame(payload)
    async with connected(callee, caller):
        host = caller.exchange.host
        stream = await host.new_stream(callee.exchange.host.get_id(), [MEMBERS_PROTOCOL])
        await stream.write(raw)
        with pytest.raises(Unanswered):
            await read_frame(stream, 1 << 20, 5.0)
    assert callee.scores.rejections == {reason: 1}
    assert callee.scores.penalty(caller.identity.peer_id) > 0
    assert caller.identity.peer_id not in {m.advert.peer_id for m in callee.view.members()}


def test_request_decoding_bounds_the_digest_before_building_it():
    """At most 1,024 digests (a full view) are decoded, duplicates allowed; every other shape is
    refused by the scan or the schema, before a set is built."""
    assert MAX_MEMBERS <= MAX_DIGEST_ENTRIES  # a full view's digest fits one request
    full = [envelope_digest(bytes([i % 256, i // 256])) for i in range(MAX_DIGEST_ENTRIES)]
    advert_bytes, held = decode_members_request(encode_members_request(b"a" * 8192, full + full))
    assert advert_bytes == b"a" * 8192 and held == frozenset(full)
    assert len(encode_members_request(b"a" * 8192, full)) <= MAX_MEMBERS_REQUEST
    assert decode_members_request(encode_members_request(b"", [])) == (b"", frozenset())
    for payload, error in [(msgpack.packb([b"", b"x" * 8200]), Oversize), (msgpack.packb({"a": 1}), Oversize),
                           (msgpack.packb([b"", "text"]), Oversize), (msgpack.packb([b""]), WrongType),
                           (msgpack.packb([b"", b"x" * 9]), InvalidValue), (b"", MalformedBody)]:
        with pytest.raises(error):
            decode_members_request(payload)


def test_the_answer_leaves_out_what_the_caller_holds_before_it_is_cut():
    """600 members, more than one answer holds (512): a caller that holds the first answer's
    adverts gets the other 88 next, not the same 512 again (version 1 cut first, so the lowest
    ranked members never reached anyone through a pull)."""
    view, now = MemberView(RUN), now_ms()
    for index, (_, envelope) in enumerate(others(600)):
        view.accept(envelope, now=now + index)
    first = view.envelopes()
    assert len(first) == MAX_MEMBERS_PER_RESPONSE
    rest = view.envelopes(held=frozenset(envelope_digest(envelope) for envelope in first))
    assert len(rest) == 600 - MAX_MEMBERS_PER_RESPONSE and not set(rest) & set(first)
    assert view.envelopes(held=frozenset(view.digests())) == []
