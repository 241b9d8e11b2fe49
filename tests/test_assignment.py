"""Deterministic task assignment: stable across calls and processes, spread over tasks."""

from __future__ import annotations

import hashlib
import struct
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from intellect_node.protocol.assignment import length_target, sampling_seed, task_index

PEER = "12D3KooWExamplePeerIdForAssignmentTests"
B = bytes(range(32))  # a checkpoint manifest_hash: the beacon


def test_known_value_pins_the_encoding() -> None:
    """A validator in another implementation must get the same index: pin one by hand."""
    payload = (
        b"intellect-node/assignment/task/v1"
        + struct.pack(">I", 5)
        + b"run-1"
        + struct.pack(">I", len(PEER))
        + PEER.encode()
        + struct.pack(">QQ", 7, 3)
        + struct.pack(">I", 32)
        + B
    )
    expected = int.from_bytes(hashlib.sha256(payload).digest(), "big") % 1000
    assert task_index("run-1", PEER, 7, 3, 1000, beacon=B) == expected


@given(
    run=st.text(min_size=1, max_size=20),
    peer=st.text(min_size=1, max_size=20),
    step=st.integers(0, 2**64 - 1),
    counter=st.integers(0, 2**64 - 1),
    n=st.integers(1, 10**9),
)
def test_stable_and_in_range(run: str, peer: str, step: int, counter: int, n: int) -> None:
    first = task_index(run, peer, step, counter, n, beacon=B)
    assert first == task_index(run, peer, step, counter, n, beacon=B)
    assert 0 <= first < n


def test_spreads_evenly_over_tasks() -> None:
    num_tasks, draws = 20, 20_000
    counts = Counter(task_index("run", PEER, 3, c, num_tasks, beacon=B) for c in range(draws))
    assert set(counts) == set(range(num_tasks))
    expected = draws / num_tasks
    chi2 = sum((counts[i] - expected) ** 2 / expected for i in range(num_tasks))
    assert chi2 < 50.0  # 19 degrees of freedom: p(chi2 > 50) is about 1e-4 for a uniform draw


def test_every_input_changes_the_task() -> None:
    """Changing run, peer, step or counter must give an unrelated draw, not a shifted one."""
    base = [task_index("run", PEER, 1, c, 10**6, beacon=B) for c in range(50)]
    for other in (
        [task_index("run2", PEER, 1, c, 10**6, beacon=B) for c in range(50)],
        [task_index("run", PEER + "x", 1, c, 10**6, beacon=B) for c in range(50)],
        [task_index("run", PEER, 2, c, 10**6, beacon=B) for c in range(50)],
    ):
        assert sum(a == b for a, b in zip(base, other, strict=True)) <= 1
    # no ambiguity between the fields: ("ab", "c") and ("a", "bc") differ
    assert task_index("ab", "c", 0, 0, 10**9, beacon=B) != task_index("a", "bc", 0, 0, 10**9, beacon=B)


def test_length_target_and_seed_are_independent_draws() -> None:
    targets = [16, 32, 64, 128]
    picks = Counter(length_target("run", PEER, 0, c, targets, beacon=B) for c in range(4000))
    assert set(picks) == set(targets)
    assert min(picks.values()) > 800
    seeds = {sampling_seed("run", PEER, 0, c) for c in range(1000)}
    assert len(seeds) == 1000
    assert all(0 <= s < 2**63 for s in seeds)
    assert sampling_seed("run", PEER, 0, 0) != task_index("run", PEER, 0, 0, 2**63, beacon=B)


@pytest.mark.parametrize(
    "args",
    [
        ("", PEER, 0, 0, 10),
        ("run", "", 0, 0, 10),
        ("run", PEER, -1, 0, 10),
        ("run", PEER, 0, 2**64, 10),
        ("run", PEER, 0, 0, 0),
        ("run", PEER, True, 0, 10),
    ],
)
def test_rejects_bad_inputs(args: tuple) -> None:
    with pytest.raises(ValueError):
        task_index(*args, beacon=B)


def test_rejects_bad_targets() -> None:
    with pytest.raises(ValueError):
        length_target("run", PEER, 0, 0, [], beacon=B)
    with pytest.raises(ValueError):
        length_target("run", PEER, 0, 0, [16, 0], beacon=B)


def test_the_beacon_changes_the_task() -> None:
    """No task of a step is known before its checkpoint's manifest_hash: another beacon, another draw."""
    base = [task_index("run", PEER, 1, c, 10**6, beacon=B) for c in range(50)]
    other = [task_index("run", PEER, 1, c, 10**6, beacon=bytes(32)) for c in range(50)]
    assert sum(a == b for a, b in zip(base, other, strict=True)) <= 1
    for bad in (b"", bytes(31), "x" * 32):
        with pytest.raises(ValueError):
            task_index("run", PEER, 1, 0, 10, beacon=bad)
