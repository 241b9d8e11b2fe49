"""The commit step of an all-reduce attempt (node/diloco/commit.py, specs/diloco.md section 2):
the decision on its own, then on three real hivemind DHTs on 127.0.0.1, in a process of their
own (hivemind and py-libp2p cannot share one, and other tests load libp2p here)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from intellect_node.node.diloco.commit import (
    SPAN_DIGEST,
    commit_key,
    decide,
    differing_entries,
    outcome_digests,
    read_outcomes,
)

A, B, C = b"a" * 8, b"b" * 8, b"c" * 8
D1, D2 = b"1" * 32, b"2" * 32  # two members' span digests (two spans of 16 bytes)


def test_every_member_must_say_it_completed_with_the_same_average() -> None:
    assert decide([A, B, C], {A: D1, B: D1, C: D1}) is True
    assert decide([A, B, C], {A: D1, B: D1}) is None
    assert decide([A, B, C], {A: D1, B: D1, C: False}) is False
    assert decide([A, B, C], {A: D1, C: False}) is False  # one failure decides before the rest say
    # two members that recovered different sums: nobody applies, even before the third says
    assert decide([A, B, C], {A: D1, B: D2}) is False
    # an outsider's entry neither completes nor fails an attempt it is not in
    assert decide([A, B], {A: D1, B: D1, C: False}) is True
    assert decide([A, B], {A: D1, B: D1, C: D2}) is True
    assert decide([A, B], {A: D1, C: D1}) is None


def test_outcome_digests_name_what_differs() -> None:
    sums = torch.arange(10, dtype=torch.int32)
    spans = [(0, 4), (4, 10), (10, 10)]  # the third reducer got no part
    shared = bytes([1, 2, 3])
    mine = outcome_digests([A, B, C], shared, sums, spans)
    assert len(mine) == 4 * SPAN_DIGEST and outcome_digests([A, B, C], shared, sums.clone(), spans) == mine
    told_otherwise = sums.clone()
    told_otherwise[5] += 1  # the second reducer replied one sum differently to this member
    assert differing_entries(mine, outcome_digests([A, B, C], shared, told_otherwise, spans)) == [2]
    # the leader relayed another order or other exponents to this member: the group entry differs
    assert differing_entries(mine, outcome_digests([B, A, C], shared, sums, spans)) == [0]
    assert differing_entries(mine, outcome_digests([A, B, C], bytes([1, 2, 4]), sums, spans)) == [0]
    assert differing_entries(mine, mine[:SPAN_DIGEST]) == [0, 1, 2, 3]  # a malformed length differs everywhere


def test_malformed_entries_are_skipped() -> None:
    entry = SimpleNamespace
    stored = entry(value={A: entry(value=D1), B: entry(value="yes"), "c": entry(value=D1), C: entry(value=False),
                          b"d": entry(value=True), b"e": entry(value=b"x" * 15), b"f": entry(value=b"")})
    assert read_outcomes(stored) == {A: D1, C: False}
    assert read_outcomes(None) == {} and read_outcomes(entry(value=[1, 2])) == {}


def test_the_key_names_the_attempt() -> None:
    assert commit_key("diloco_run", b"\x01\x02") == "diloco_run.commit.0102"
    assert commit_key("diloco_run", b"\x01") != commit_key("diloco_run", b"\x02")


SCENARIOS = textwrap.dedent("""
    import asyncio, json, time
    import hivemind
    from intellect_node.node.diloco.commit import CommitRefused, await_commit, post

    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    peers = [str(m) for m in first.get_visible_maddrs()]
    dhts = [first] + [hivemind.DHT(initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
                      for _ in range(2)]
    names = [b"member-0", b"member-1", b"member-2"]

    async def side(i, key, outcome, timeout_s):
        started = time.monotonic()
        if outcome is not None:
            await post(dhts[i], key, names[i], outcome)
        try:
            await await_commit(dhts[i], key, names, outcome or b"", timeout_s)
            result = "commit"
        except CommitRefused as exc:
            result = "refused: " + str(exc)
        return result, time.monotonic() - started

    async def scenario(key, outcomes, timeout_s=3.0):
        # the members that say nothing are not waited on: they are the ones the test watches fail
        sides = [side(i, key, o, timeout_s) for i, o in enumerate(outcomes) if o is not None]
        return await asyncio.gather(*sides)

    async def main():
        same, other = b"s" * 64, b"s" * 32 + b"t" * 16 + b"s" * 16  # the second member's span differs
        return {
            "all": await scenario("t.commit.01", [same, same, same]),
            "one_failed": await scenario("t.commit.02", [same, same, False]),
            "one_silent": await scenario("t.commit.03", [same, same, None], timeout_s=2.0),
            "told_otherwise": await scenario("t.commit.04", [same, other, same]),
        }

    print(json.dumps(asyncio.run(main())))
    for dht in dhts:
        dht.shutdown()
""")


@pytest.mark.slow
def test_three_dhts_commit_only_when_every_member_completed_with_the_same_average() -> None:
    done = subprocess.run([sys.executable, "-c", SCENARIOS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r for r, _ in out["all"]] == ["commit"] * 3
    # the member that failed is named to the others, who learn it from its post, not the deadline
    failed = out["one_failed"]
    assert all(r.startswith("refused") and "KJHFXAX8tz5" in r for r, _ in failed), failed
    assert all(seconds < 2.5 for _, seconds in failed[:2]), failed
    # silence fails the attempt at the deadline, naming the silent member
    silent = out["one_silent"]
    assert all(r.startswith("refused") and "did not say" in r and "KJHFXAX8tz5" in r for r, _ in silent), silent
    assert all(1.9 <= seconds < 6.0 for _, seconds in silent), silent
    # a member told other sums by the second reducer: every side refuses, naming that reducer
    told = out["told_otherwise"]
    assert all(r.startswith("refused: members hold different averages: the span reduced by KJHFXAX8tz4")
               for r, _ in told), told
