"""A stall of our own event loop is not a peer's delay, and a peer that was only slow is not banned
for the run (node/swarm/loop_deadline.py, node/swarm/peer_scores.py; specs/guards.md G2, specs/wire.md
section 5).

The stall is real: ``time.sleep`` inside a trio task holds the whole loop, as a loaded machine or a
worker thread holding the GIL does. Real libp2p hosts on 127.0.0.1 with the stream guard.
"""

from __future__ import annotations

import json
import time

import pytest
import trio
from libp2p.custom_types import TProtocol

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.churn import fresh_peer, serving
from intellect_node.node.swarm.guard import POLICIES, StreamGuard
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.loop_deadline import GRACE_S, LATE_S, LoopDeadline
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.streams import read_frame
from intellect_node.protocol.errors import Stalled
from intellect_node.protocol.framing import HEADER, MEMBERS_PROTOCOL, frame
from tests.support.waiting import poll_until

FIRST_BYTE_S = POLICIES[MEMBERS_PROTOCOL].first_byte_s
assert FIRST_BYTE_S is not None


def stall_the_loop(seconds: float) -> None:
    """Hold the calling trio loop: nothing else of it runs (on purpose, the stall under test)."""
    time.sleep(seconds)


async def test_a_deadline_that_a_stall_made_late_is_given_back_and_one_on_time_is_not() -> None:
    deadline = LoopDeadline(0.5)
    assert deadline.next_wait() == 0.5
    stall_the_loop(0.8)  # the loop holds past the deadline: it runs out 0.3 s late
    given = deadline.next_wait()
    assert max(0.3, GRACE_S) - 0.05 <= given <= 0.5 * 10
    await trio.sleep(given)  # waited out by a running loop: on time
    assert deadline.next_wait() == 0.0

    short = LoopDeadline(0.5)
    short.next_wait()
    await trio.sleep(0.2)
    stall_the_loop(0.2)  # a stall that ends before the deadline: the loop reads what came meanwhile
    await trio.sleep(0.15)
    assert short.next_wait() == 0.0 and LATE_S < 0.3


async def _guarded_server() -> tuple:
    scores = PeerScores()
    server = build_host(Identity.generate())
    guard = StreamGuard(scores)
    guard.install(server)
    requests: list[bytes] = []

    async def answer(stream) -> None:  # type: ignore[no-untyped-def]
        requests.append(await stream.read(HEADER.size + 1))
        await stream.write(frame(b"ok"))
        await stream.close()

    server.set_stream_handler(TProtocol(MEMBERS_PROTOCOL), answer)
    return scores, server, guard, requests


async def test_an_honest_request_that_arrived_during_our_stall_is_answered_and_not_charged() -> None:
    scores, server, guard, requests = await _guarded_server()
    async with serving(server) as target, fresh_peer(target) as host:
        stream = await host.new_stream(target.peer_id, [TProtocol(MEMBERS_PROTOCOL)])
        await stream.write(frame(b"x"))  # the whole request, at once
        stall_the_loop(FIRST_BYTE_S + 1.5)  # and the node's loop stalls past the first-byte deadline
        with trio.fail_after(10):
            reply = await read_frame(stream, 64, 5.0)
        dialer = host.get_id().to_base58()
    assert reply == b"ok" and len(requests) == 1
    assert scores.penalty(dialer) == 0 and not scores.rejections
    assert guard.tables[MEMBERS_PROTOCOL].counts["first_byte"] == 0


async def test_a_request_deadline_our_stall_made_late_cuts_the_stream_but_charges_no_one() -> None:
    request_s = POLICIES[MEMBERS_PROTOCOL].request_s
    assert request_s is not None
    scores, server, guard, _ = await _guarded_server()

    async def never_done(stream) -> None:  # type: ignore[no-untyped-def]
        await stream.read(1)
        await trio.sleep_forever()  # the request is never read to its end: its deadline ends it

    server.set_stream_handler(TProtocol(MEMBERS_PROTOCOL), never_done)
    async with serving(server) as target, fresh_peer(target) as host:
        stream = await host.new_stream(target.peer_id, [TProtocol(MEMBERS_PROTOCOL)])
        await stream.write(frame(b"x"))
        await trio.sleep(0.5)  # the guard admitted it and the handler read its first byte
        stall_the_loop(request_s + 1.0)  # the request deadline passes inside the stall
        await poll_until(lambda: not guard.tables[MEMBERS_PROTOCOL].status()["open"], 5)
        dialer = host.get_id().to_base58()
    counts = guard.tables[MEMBERS_PROTOCOL].counts
    assert counts["stalled_here"] == 1 and counts["request"] == 0
    assert scores.penalty(dialer) == 0 and not scores.rejections


async def test_a_silent_dialer_is_still_cut_and_charged_at_its_deadline() -> None:
    scores, server, guard, requests = await _guarded_server()
    async with serving(server) as target, fresh_peer(target) as host:
        stream = await host.new_stream(target.peer_id, [TProtocol(MEMBERS_PROTOCOL)])
        started = time.monotonic()
        with trio.fail_after(FIRST_BYTE_S + 5):
            try:
                answer = await stream.read(1)
            except Exception:  # reset
                answer = b""
        assert answer == b""
        waited = time.monotonic() - started
        dialer = host.get_id().to_base58()
    assert FIRST_BYTE_S - 0.2 <= waited < FIRST_BYTE_S + 3
    assert scores.rejections["timeout"] == 1 and scores.penalty(dialer) > 4
    assert guard.tables[MEMBERS_PROTOCOL].counts["first_byte"] == 1 and not requests


class _LateStream:
    """A stream whose peer writes a frame ``after_s`` from now (trio time)."""

    def __init__(self, payload: bytes, after_s: float) -> None:
        self.data, self.ready_at = frame(payload), trio.current_time() + after_s

    async def read(self, n: int) -> bytes:
        await trio.sleep_until(self.ready_at)
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk


async def test_a_reply_is_not_stalled_by_our_loop_but_a_silent_peer_is() -> None:

    async def stall_soon() -> None:
        await trio.sleep(0.05)
        stall_the_loop(1.5)  # past the 1 s deadline, before the peer's bytes are due at 1.2 s

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stall_soon)
        assert await read_frame(_LateStream(b"late but in time", 1.2), 64, 1.0) == b"late but in time"
    with pytest.raises(Stalled):
        await read_frame(_LateStream(b"too late", 3.0), 64, 1.0)


def test_a_peer_only_slow_is_banned_for_now_and_lifted(tmp_path) -> None:
    log_path = tmp_path / "bans.jsonl"
    lifted: list[str] = []
    scores = PeerScores(half_life_s=0.3, ban_log=log_path, on_lift=lifted.append)
    slow = Identity.generate().peer_id
    for _ in range(21):
        scores.reject(slow, "timeout")  # 5 points each: past 100
    assert scores.is_banned(slow) and slow in scores.banned_for_now
    assert not scores.is_banned_for_the_run(slow)  # what it delivered and was accepted stays
    scores.reject(slow, "unanswered")  # a banned peer gathers no more points from being slow
    assert not log_path.exists()  # never written down: a restart forgets it
    assert PeerScores(ban_log=log_path).restore() == 0
    time.sleep(0.35)  # points halve: below the lift line
    assert scores.lift_due() == [slow] and lifted == [slow]
    assert not scores.is_banned(slow) and not scores.banned_for_now


def test_forged_input_makes_any_ban_one_for_the_run(tmp_path) -> None:
    log_path = tmp_path / "bans.jsonl"
    scores = PeerScores(half_life_s=600, ban_log=log_path)
    forger, slow = Identity.generate().peer_id, Identity.generate().peer_id
    scores.reject(forger, "malformed")  # 25: never an honest peer's
    for _ in range(16):
        scores.reject(forger, "timeout")
    assert scores.is_banned(forger) and forger not in scores.banned_for_now and scores.is_banned_for_the_run(forger)
    for _ in range(21):
        scores.reject(slow, "timeout")
    assert slow in scores.banned_for_now
    scores.reject(slow, "bad_signature")  # banned for now, then forges: banned for the run
    assert scores.is_banned(slow) and slow not in scores.banned_for_now
    logged = [json.loads(line)["peer_id"] for line in log_path.read_text().splitlines()]
    assert logged == [forger, slow]
    again = PeerScores(ban_log=log_path)
    assert again.restore() == 2 and again.is_banned(forger) and again.is_banned(slow)
