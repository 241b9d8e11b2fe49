"""A dishonest member in a real round (specs/diloco.md section 8): two honest averager children
and one real hivemind averager in a process of its own, altered to cheat one way:

- ``off_grid``: its contributions hold 1000 on an int8 grid (the honest reducers refuse its parts);
- ``inflate``: as a reducer it replies the average plus 200 levels to everyone (the honest members
  refuse its replies: no n members' honest values sum that far);
- ``equivocate``: as a reducer it replies the group's first member a sum 3 higher than the others
  at one element, within every bound (the digests in the commit differ: nobody applies the attempt;
  when that member is the adversary itself, its own digests differ from both honest members').

In every case no honest member applies an average with it. The vector is three hivemind parts
long, so each of the three members reduces one (an equal share: claimed bandwidths are refused)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from intellect_node.node.diloco.client import Averaged, AveragerClient, AveragerError, ChildSettings
from intellect_node.node.diloco.layout import Layout
from tests.support.diloco_helpers import identity

# exact_averager.PART_ELEMENTS, which the adversary checks: hivemind (which that module imports)
# cannot share this process with libp2p
PART_ELEMENTS = 1 << 19

ADVERSARY = textwrap.dedent("""
    import json, sys, torch, hivemind
    from intellect_node.node.diloco import exact_averager, grid
    from intellect_node.node.diloco.exact_averager import BoundedReducer, ExactAverager, round_bits
    from intellect_node.node.diloco.layout import Layout

    args = json.loads(sys.argv[1])
    assert args["elements"] == 3 * exact_averager.PART_ELEMENTS, "three parts, one per member"
    layout = Layout(("w",), ((args["elements"],),))
    mode = args["mode"]
    if mode == "off_grid":
        exact_averager.grid.quantize = lambda x, shared, levels, k=0: torch.full_like(x, 1000.0)
    else:
        honest_reduce = BoundedReducer.accumulate_part

        async def lying_reduce(self, sender_index, part_index, tensor_part, weight=1.0):
            average = await honest_reduce(self, sender_index, part_index, tensor_part, weight)
            if mode == "inflate":
                return average + 200.0
            if sender_index != 0:  # the group's first member (hivemind's order) is told otherwise
                return average
            lie = torch.zeros_like(average)
            lie[int((average.abs() < 50).nonzero()[0])] = 1.0  # the sum 3 higher for that member only
            return average + lie

        BoundedReducer.accumulate_part = lying_reduce
    dht = hivemind.DHT(initial_peers=args["peers"], host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    averager = ExactAverager(layout, bytes.fromhex(args["digest"]), 127, frozenset(), 0, dht=dht, start=True,
                             prefix="diloco_adversary", target_group_size=3, min_group_size=3,
                             min_matchmaking_time=2.0, request_timeout=3.0, next_chunk_timeout=5.0,
                             allreduce_timeout=30.0)
    torch.manual_seed(3)
    x = torch.randn(layout.elements) * 1e-3
    averager.raw.copy_(x)
    averager.set_group_bits(round_bits(0))
    print("READY", flush=True)  # the test starts the honest members only now: all three must match
    payload = {"round": 0, "layout": averager.layout_digest, "state_hash": bytes(32),
               "exponents": grid.exponents(x, 127).numpy().tobytes(), "member": "adversary", "signature": bytes(64)}
    for attempt in range(args["attempts"]):  # the test kills it once it has seen what it waits for
        try:
            print("ADVERSARY", averager.step(gather=payload, timeout=15, allow_retries=True), flush=True)
        except Exception as exc:
            print("ADVERSARY failed", type(exc).__name__, exc, flush=True)
    averager.shutdown(); dht.shutdown()
""")

# rounds the honest pair tries; a round can fail before any part reaches a reducer (matchmaking on a
# loaded machine), and the adversary's own loop is not in step with theirs, so it tries several times
# as often and is killed when the test is done
ATTEMPTS = 5
ADVERSARY_ATTEMPTS = 4 * ATTEMPTS
# what the honest members' logs must show, and the status counter that says it happened
EXPECTED = {
    "off_grid": ("a value of magnitude 1000, over the grid's 127", "refused_parts"),
    "inflate": ("over 3 members x 127 levels", "refused_replies"),
    "equivocate": ("members hold different averages: the span reduced by", None),
}


SHARES = textwrap.dedent("""
    import json, sys, torch
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.load_balancing import load_balance_peers
    from hivemind.averaging.partition import TensorPartContainer
    from intellect_node.node.diloco.exact_averager import PART_ELEMENTS, GridWire, _decode, reducer_spans
    from intellect_node.node.diloco.frames import FrameError

    out = {"spans": [], "refused": []}
    for elements, n in json.loads(sys.argv[1]):
        fractions = load_balance_peers(elements, [None] * n, 0)  # what members who claim nothing get
        container = TensorPartContainer([torch.zeros(elements)], fractions, compression=GridWire())
        spans = reducer_spans(container.num_parts_by_peer, elements)
        parts = list(container.num_parts_by_peer)
        out["spans"].append([spans, parts, PART_ELEMENTS])
    payload = DecentralizedAverager.serializer.dumps({})  # empty: only the claims around it are judged
    for bandwidth, mode in ((None, 0), (1e9, 0), (None, 1), (None, 2)):
        raw = DecentralizedAverager.serializer.dumps([bandwidth, mode, payload])
        try:
            _decode(raw)
            out["refused"].append(None)
        except FrameError as exc:
            out["refused"].append(str(exc))
    print(json.dumps(out))
""")


def test_every_member_reduces_whole_parts_in_order_and_claims_are_refused() -> None:
    """``reducer_spans`` against hivemind's own partitioning, for vectors under one part, under n
    parts and over; and a gather payload claiming a bandwidth or a client or auxiliary mode is
    refused (hivemind would hand its share to others or all of it to the claimant)."""
    cases = [[1000, 3], [PART_ELEMENTS + 5, 3], [3 * PART_ELEMENTS, 3], [5 * PART_ELEMENTS + 7, 2]]
    done = subprocess.run([sys.executable, "-c", SHARES, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for (elements, n), (spans, parts, part) in zip(cases, out["spans"], strict=True):
        assert part == PART_ELEMENTS and len(spans) == n
        assert spans[0][0] == 0 and spans[-1][1] == elements
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous, in the group's order
        assert all(end - start == min(count * part, max(0, elements - start)) for (start, end), count
                   in zip(spans, parts, strict=True))
    assert out["spans"][0][1] == [1, 0, 0]  # under one part: the first member reduces it all
    assert out["spans"][2][1] == [1, 1, 1]  # three parts, three members: one each
    assert "missing fields" in out["refused"][0]  # no claim: it reached the payload's own schema
    assert "claimed bandwidth" in out["refused"][1]
    assert "averaging mode 1" in out["refused"][2] and "averaging mode 2" in out["refused"][3]


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_a_cheating_member_is_caught_and_never_averaged_with(tmp_path: Path, mode: str) -> None:
    torch.set_num_threads(1)
    layout = Layout(("w",), ((3 * PART_ELEMENTS,),))
    clients: list[AveragerClient] = []
    try:
        for i in range(2):
            child = ChildSettings("diloco_adversary", 127, tuple(clients[0].maddrs) if clients else (),
                                  max_peers=3, min_peers=3, matchmaking_s=2.0)
            clients.append(AveragerClient(tmp_path / f"h{i}.sock", layout, child, tmp_path / f"h{i}.log"))
            clients[-1].ensure_running()
        args = {"elements": layout.elements, "peers": list(clients[0].maddrs), "mode": mode,
                "digest": clients[0].agreement.hex(), "attempts": ADVERSARY_ATTEMPTS}
        # a session of its own: its DHT and averager processes hold its pipes and are stopped with it
        adversary = subprocess.Popen([sys.executable, "-c", ADVERSARY, json.dumps(args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert adversary.stdout is not None and adversary.stderr is not None
        if adversary.stdout.readline().strip() != "READY":  # its startup is slow: the honest members wait for it
            pytest.fail(f"the adversary did not start: {adversary.stderr.read()[-2000:]}")
        sign, counter = EXPECTED[mode]
        results: list[Averaged | BaseException] = []
        torch.manual_seed(4)
        values = [torch.randn(layout.elements) * 1e-3 for _ in range(2)]

        def go(i: int) -> None:
            try:
                results[i] = clients[i].average(0, values[i], b"\0" * 32, 15.0, identity(f"h{i}"))
            except BaseException as exc:  # the expected outcome: no group of three applied
                results[i] = exc

        def logs() -> str:
            return "".join((tmp_path / f"h{i}.log").read_text() for i in range(2))

        # a round on a loaded machine can time out before the adversary's cheat reaches anyone: then
        # nothing was seen, and the three try again (seeing it ends the tries)
        seen = False
        for _ in range(ATTEMPTS):
            results[:] = [RuntimeError("did not finish")] * 2
            threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=90)
            assert all(isinstance(r, AveragerError) for r in results), results  # never averaged with it
            seen = sign in logs()
            if seen:
                break
        os.killpg(adversary.pid, signal.SIGKILL)
        out, err = adversary.communicate(timeout=30)
        if not seen:
            notable = [line for line in logs().splitlines() if "refused" in line or "ERROR" in line or "WARN" in line]
            pytest.fail("not seen in {} attempts\nhonest logs:\n{}\nadversary:\n{}\n{}".format(
                ATTEMPTS, "\n".join(notable[-30:]), out[-2000:], err[-2000:]))
        if counter is not None:
            assert sum(c.status()[counter] for c in clients) >= 1
    finally:
        for c in clients:
            c.close()
