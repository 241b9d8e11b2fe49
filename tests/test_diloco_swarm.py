"""DiLoCo rounds between real peers (specs/diloco.md): each peer is a ``DilocoPeer`` with its own
averager child (real hivemind DHT and DecentralizedAverager) on 127.0.0.1, and, where a peer
takes the swarm's state, its own state server (the shard overlay's, ``Overlays``)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from intellect_node.node.diloco import frames
from intellect_node.node.diloco.client import AveragerClient, AveragerError
from intellect_node.node.diloco.run_spec import sign_run_spec, with_run_spec
from tests.support.diloco_helpers import Overlays, identity, make_peer, run_rounds_together, settings

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _close(peers) -> None:
    for p in peers:
        p.client.close()


def test_three_peers_end_rounds_bit_identical(tmp_path) -> None:
    s = settings()
    first = make_peer(tmp_path, "p0", s)
    peers = [first] + [make_peer(tmp_path, f"p{i}", s, tuple(first.client.maddrs)) for i in (1, 2)]
    initial = first.state.params.clone()
    sent = attempted = 0
    try:
        for expected_round in (0, 1):
            records = run_rounds_together(peers)
            assert all(not isinstance(r, BaseException) for r in records), records
            assert [r.group_size for r in records] == [3, 3, 3], records
            assert len({r.state_hash for r in records}) == 1
            assert all(r.hash_agreement for r in records) and all(r.round == expected_round for r in records)
            sent += sum(r.allreduce_bytes for r in records)
            assert all(r.allreduce_attempts >= 1 for r in records), records
            attempted += max(r.allreduce_attempts for r in records)
        # packed: each element goes up (int8, or int4 for small parts) from the n-1 peers that do not
        # reduce it and comes back to them (scaled int16, or int8): at most 3 (n-1) bytes per element
        # and round, plus a tag per part, where fp32 takes 8 (n-1); a reducer's last replies may
        # land after its own round ended (counted with its next round); an attempt that fails on a
        # loaded machine is retried and sends again (measured: 245,354 bytes where two attempts bound 181,376)
        elements = first.layout.elements
        assert 2 * elements <= sent <= attempted * (3 * 2 * elements + 4096), (sent, attempted)
        params = [p.state.params for p in peers]
        assert all(torch.equal(params[0], other) for other in params[1:])
        assert all(torch.equal(peers[0].state.momentum, p.state.momentum) for p in peers[1:])
        assert not torch.equal(params[0], initial)  # the outer steps moved the model
        assert peers[0].state.round == 2
    finally:
        _close(peers)


def test_a_peer_killed_in_its_round_costs_the_others_at_most_the_timeout(tmp_path) -> None:
    s = settings(round_timeout_s=25.0)
    first = make_peer(tmp_path, "p0", s)
    peers = [first] + [make_peer(tmp_path, f"p{i}", s, tuple(first.client.maddrs)) for i in (1, 2)]
    overlays = Overlays(tmp_path)
    try:
        # the subject is the kill below: a first round whose matchmaking a loaded machine split
        # (seen in CI beside other heavy tests: groups [2, 2, 3]) is followed by another, which
        # re-syncs whoever diverged, until all three average together
        for _ in range(3):
            records = run_rounds_together(peers)
            if [getattr(r, "group_size", r) for r in records] == [3, 3, 3]:
                break
        assert [getattr(r, "group_size", r) for r in records] == [3, 3, 3]
        victim = peers[2].client.process

        def kill_soon(progress: dict) -> None:
            if progress["phase"] == "average":  # its child is in the round's matchmaking 0.3 s from now
                threading.Timer(0.3, os.killpg, (victim.pid, signal.SIGKILL)).start()

        def arrive_late(progress: dict) -> None:
            if progress["phase"] == "average":  # the victim's declaration for this round is in the DHT by then
                time.sleep(1.0)

        started = time.monotonic()
        records = run_rounds_together(peers, hooks={0: arrive_late, 1: arrive_late, 2: kill_soon})
        elapsed = time.monotonic() - started
        survivors = records[:2]
        assert all(not isinstance(r, BaseException) for r in survivors), survivors
        assert [r.group_size for r in survivors] == [2, 2], survivors
        assert survivors[0].state_hash == survivors[1].state_hash
        assert torch.equal(peers[0].state.params, peers[1].state.params)
        assert elapsed < s.round_timeout_s + 15
        assert records[2].solo and records[2].group_size == 1  # the victim trained on alone and said so
        victim_peer = peers[2]
        for name, peer in zip(("p0", "p1", "p2"), peers, strict=True):
            overlays.serve(name, peer.layout)
            overlays.publish(name, peer.state)
        # the survivors vouch for one state, the victim's own differs: it takes theirs
        assert victim_peer.diverged and overlays.sync("p2", victim_peer, ["p0", "p1"])
        assert torch.equal(victim_peer.state.params, peers[0].state.params)
        assert victim_peer.state.round == peers[0].state.round
    finally:
        overlays.close()
        _close(peers)


def test_garbage_on_the_child_socket_is_an_error_not_a_crash(tmp_path) -> None:
    s = settings()
    peer = make_peer(tmp_path, "p0", s)
    client = peer.client
    try:
        pid = client.process.pid
        for garbage in (frames.HEADER.pack(2**31) + b"x", frames.HEADER.pack(3) + b"\xc1\xc1\xc1",
                        frames.encode({"type": "launch_missiles"}), frames.encode({"type": "average", "round": 0}),
                        frames.encode({"type": "init", "prefix": "x"})):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                raw.settimeout(10)
                raw.connect(str(tmp_path / "p0.sock"))
                raw.sendall(garbage)
                reply = frames.receive(raw, 1 << 20)
                assert reply["type"] == "error" and reply["error"], reply
        # a well-formed request hivemind itself refuses (a timeout shorter than matchmaking) fails cleanly
        with pytest.raises(AveragerError, match="not averaged"):
            client.average(0, torch.zeros(peer.layout.elements), bytes(32), 1.0, identity("p0"))
        status = client.status()
        assert client.process.pid == pid and client.restarts == 0
        assert status["libp2p_loaded"] is False and status["peer_id"] == client.peer_id
        assert oct(os.stat(tmp_path / "p0.sock").st_mode & 0o777) == "0o600"
    finally:
        client.close()


def test_a_crashed_child_is_restarted_and_close_leaves_no_process(tmp_path) -> None:
    peer = make_peer(tmp_path, "p0", settings())
    client = peer.client
    try:
        first = client.process.pid
        os.killpg(first, signal.SIGKILL)
        client.process.wait(timeout=10)
        status = client.status()
        assert client.restarts == 1 and client.process.pid != first and status["peer_id"]
        group = client.process.pid
    finally:
        client.close()
    _assert_group_ends(group)


def _assert_group_ends(group: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    pytest.fail("a process of the averager child's group outlived close()")


def test_a_round_racing_the_shutdown_starts_no_child_nobody_would_stop(tmp_path) -> None:
    """The node closes the client while its round thread restarts the child (a swarm merge, or a
    crashed child): the thread fails at once, and no child is left, whenever the close lands."""
    failures: list[BaseException] = []
    for n, delay in enumerate((0.0, 0.05, 0.4, 1.5)):  # before the child listens, while it starts, or later
        peer = make_peer(tmp_path, f"p{n}", settings())
        client = peer.client

        def restart(client: AveragerClient) -> None:
            try:
                client.restart(client.settings)
            except AveragerError as exc:
                failures.append(exc)

        thread = threading.Thread(target=restart, args=(client,))
        thread.start()
        time.sleep(delay)
        started = time.monotonic()
        client.close()
        thread.join(timeout=30)
        assert not thread.is_alive() and time.monotonic() - started < 10
        assert client.process is None and client.conn is None
        with pytest.raises(AveragerError, match="closed"):
            client.average(0, torch.zeros(peer.layout.elements), bytes(32), 5.0, identity(f"p{n}"))
        _assert_no_child_serves(tmp_path / f"p{n}.sock")
    assert failures  # at least one restart was cut short (the earliest close lands mid-start)


def _assert_no_child_serves(socket_path) -> None:
    """No process left whose command line names this client's socket (its averager child)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and str(socket_path).encode() in (proc / "cmdline").read_bytes():
                    if (proc / "stat").read_text().split(") ")[1][0] != "Z":
                        alive.append(proc.name)
            except OSError:
                continue
        if not alive:
            return
        time.sleep(0.2)
    pytest.fail(f"averager children outlived close(): {alive}")


def test_a_restarted_peer_resumes_from_its_checkpoint_and_rejoins(tmp_path) -> None:
    s = settings(max_peers=2)
    first = make_peer(tmp_path, "p0", s)
    peers = [first, make_peer(tmp_path, "p1", s, tuple(first.client.maddrs))]
    try:
        records = run_rounds_together(peers)
        assert [getattr(r, "group_size", r) for r in records] == [2, 2]
        os.killpg(peers[1].client.process.pid, signal.SIGKILL)  # the peer's child dies; its parent is dropped
        peers[1].client.close()
        peers[1] = make_peer(tmp_path, "p1", s, tuple(first.client.maddrs))  # same home: resumes
        assert peers[1].state.round == 1 and torch.equal(peers[1].state.params, first.state.params)
        assert peers[1].optimizer.state  # the inner AdamW moments came back too
        records = run_rounds_together(peers)
        assert [getattr(r, "group_size", r) for r in records] == [2, 2]
        assert records[0].state_hash == records[1].state_hash and all(r.hash_agreement for r in records)
    finally:
        _close(peers)


def test_a_peer_outside_the_signed_allowlist_is_refused(tmp_path) -> None:
    owner = identity("owner")  # the run's owner signs the spec; its nodes trust that key
    (tmp_path / "spec.ine").write_bytes(sign_run_spec(owner, "run", (identity("p0").peer_id, identity("p1").peer_id),
                                                      600))
    members = with_run_spec(settings(round_timeout_s=15.0, run_spec="spec.ine", authority=owner.peer_id), "run",
                            tmp_path)
    assert members.allowlist == (identity("p0").peer_id, identity("p1").peer_id)
    first = make_peer(tmp_path, "p0", members)
    peers = [first, make_peer(tmp_path, "p1", members, tuple(first.client.maddrs)),
             make_peer(tmp_path, "intruder", settings(round_timeout_s=15.0), tuple(first.client.maddrs))]
    try:
        records = run_rounds_together(peers)
        assert all(not isinstance(r, BaseException) for r in records), records
        assert [r.group_size for r in records[:2]] == [2, 2], records
        assert records[0].state_hash == records[1].state_hash
        assert records[2].solo and records[2].state_hash != records[0].state_hash  # it averaged with nobody
        log = (tmp_path / "p0.log").read_text() + (tmp_path / "p1.log").read_text()
        assert "not in the run's allowlist" in log
    finally:
        _close(peers)


def test_a_joiner_takes_the_swarm_state_through_the_overlay_and_averages_with_it(tmp_path) -> None:
    s = settings()
    first = make_peer(tmp_path, "p0", s)
    peers = [first, make_peer(tmp_path, "p1", s, tuple(first.client.maddrs))]
    overlays = Overlays(tmp_path)
    try:
        for name, peer in zip(("p0", "p1"), peers, strict=True):
            overlays.serve(name, peer.layout)
        for _ in range(2):
            records = run_rounds_together(peers)
            assert [getattr(r, "group_size", r) for r in records] == [2, 2]
            for name, peer in zip(("p0", "p1"), peers, strict=True):  # as the role does after each outer step
                overlays.publish(name, peer.state)
        joiner = make_peer(tmp_path, "late", s, tuple(first.client.maddrs))
        peers.append(joiner)
        overlays.serve("late", joiner.layout)
        assert joiner.state.round == 0
        assert overlays.sync("late", joiner, ["p0", "p1"])  # both vouch for it; fetched shard by shard, hash-checked
        assert overlays.overlays["late"].counters["states_fetched"] == 1
        assert joiner.state.round == 2 and torch.equal(joiner.state.params, first.state.params)
        assert torch.equal(joiner.state.momentum, first.state.momentum)
        records = run_rounds_together(peers)
        assert [getattr(r, "group_size", r) for r in records] == [3, 3, 3]
        assert len({r.state_hash for r in records}) == 1 and all(r.hash_agreement for r in records)
    finally:
        overlays.close()
        _close(peers)


def test_overlapped_rounds_keep_the_outer_state_bit_identical(tmp_path) -> None:
    s = settings(overlap=True)
    first = make_peer(tmp_path, "p0", s)
    peers = [first] + [make_peer(tmp_path, f"p{i}", s, tuple(first.client.maddrs)) for i in (1, 2)]
    try:
        assert run_rounds_together(peers) == [None, None, None]  # round 0 trained and sent, nothing applied yet
        for expected_round in (0, 1):
            records = run_rounds_together(peers)
            assert all(not isinstance(r, BaseException) and r is not None for r in records), records
            assert [r.group_size for r in records] == [3, 3, 3] and all(r.round == expected_round for r in records)
            assert len({r.state_hash for r in records}) == 1 and all(r.hash_agreement for r in records)
        assert all(torch.equal(first.state.params, p.state.params) for p in peers[1:])
        assert all(torch.equal(first.state.momentum, p.state.momentum) for p in peers[1:])
        assert first.pending is not None  # round 2's average is in flight while round 3 would train
    finally:
        _close(peers)
