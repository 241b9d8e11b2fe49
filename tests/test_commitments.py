"""Work commitments: the signed message, and the judge's book (stored before the beacon, bounded,
durable, settled as reward 0 when undelivered)."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect_node.crypto.identity import Identity
from intellect_node.node.roles.validator import commitments as book_module
from intellect_node.node.roles.validator.commitments import (
    BUSY,
    DUPLICATE,
    LATE,
    STORED,
    TOO_MANY,
    CommitmentBook,
    Undelivered,
)
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.errors import Rejected

WORKER = Identity.generate()


def commitment(step: int = 5, groups: int = 4, worker: Identity = WORKER) -> WorkCommitment:
    return WorkCommitment(run_id="run", worker=worker.peer_id, step=step, groups=groups)


def test_signed_round_trip_and_the_signer_must_be_the_worker() -> None:
    envelope = codec.encode(commitment(), WORKER, lifetime_s=600)
    assert len(envelope) <= WorkCommitment.MAX_SIZE
    assert codec.decode(envelope, WorkCommitment).message == commitment()
    with pytest.raises(Rejected):
        codec.decode(codec.encode(commitment(), Identity.generate(), lifetime_s=600), WorkCommitment)
    for bad in ({"groups": 0}, {"groups": 2**21}, {"step": -1}):
        with pytest.raises(Rejected):
            codec.decode(codec.encode(commitment(**bad), WORKER, lifetime_s=600), WorkCommitment)


def test_stored_only_before_the_beacon(tmp_path: Path) -> None:
    book = CommitmentBook(tmp_path / "c.jsonl", max_groups=8)
    assert book.offer(commitment(step=5), newest_known_step=5) == LATE  # checkpoint 5 known: tasks public
    assert book.offer(commitment(step=9), newest_known_step=5) == LATE  # too far ahead: unbounded otherwise
    assert book.offer(commitment(step=5, groups=9), newest_known_step=4) == TOO_MANY
    assert book.offer(commitment(step=5), newest_known_step=4) == STORED
    assert book.offer(commitment(step=5, groups=8), newest_known_step=4) == DUPLICATE  # the first one stands
    assert book.groups(WORKER.peer_id, 5) == 4 and book.groups(WORKER.peer_id, 6) == 0


def test_bounded_in_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(book_module, "MAX_COMMITMENTS", 2)
    book = CommitmentBook(None, max_groups=8)
    answers = [book.offer(commitment(worker=Identity.generate()), newest_known_step=4) for _ in range(3)]
    assert answers == [STORED, STORED, BUSY]


def test_survives_a_restart_and_settles_undelivered_counters(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    CommitmentBook(path, max_groups=8).offer(commitment(step=5, groups=4), newest_known_step=4)
    other = Identity.generate()
    CommitmentBook(path, max_groups=8).offer(commitment(step=5, groups=2, worker=other), newest_known_step=4)
    book = CommitmentBook(path, max_groups=8)
    assert book.offer(commitment(step=5, groups=8), newest_known_step=4) == DUPLICATE  # remembered
    state = JudgeState(commitments=book)
    assert state.counter_problem(WORKER.peer_id, 5, 0, cap=100) is None
    assert state.counter_problem(WORKER.peer_id, 5, 1, cap=100) is None
    assert state.counter_problem(WORKER.peer_id, 5, 4, cap=100) == "uncommitted"  # beyond the commitment
    assert state.counter_problem(WORKER.peer_id, 6, 0, cap=100) == "uncommitted"  # no commitment
    assert state.expected(WORKER.peer_id, 6) == 0  # an uncommitted counter is not credited
    state.forget_before(6)
    assert sorted(state.settled, key=lambda u: u.counters) == [
        Undelivered(other.peer_id, 5, (0, 1)), Undelivered(WORKER.peer_id, 5, (2, 3))]
    assert CommitmentBook(path, max_groups=8).groups(WORKER.peer_id, 5) == 0  # settled, also after a restart
