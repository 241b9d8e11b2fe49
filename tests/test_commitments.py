"""Work commitments: the signed message, the judge's book (stored before the beacon, bounded,
durable, settled as reward 0 when undelivered, step 0 warm-up) and the worker's plan."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from intellect_node.crypto.identity import Identity
from intellect_node.node.roles.inference.commitments import MIN_BATCHES, RETRY_FAILED_S, CommitmentPlan
from intellect_node.node.roles.validator import commitments as book_module
from intellect_node.node.roles.validator.commitments import (
    BUSY,
    DUPLICATE,
    EARLY,
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
from intellect_node.protocol.run_spec import DEFAULT_MAX_GROUPS_PER_STEP

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
    assert book.offer(commitment(step=8), newest_known_step=5) == EARLY  # too far ahead: unbounded otherwise
    assert book.offer(commitment(step=5, groups=9), newest_known_step=4) == TOO_MANY
    assert book.offer(commitment(step=5), newest_known_step=4) == STORED
    assert book.offer(commitment(step=5, groups=8), newest_known_step=4) == DUPLICATE  # the first one stands
    assert book.groups(WORKER.peer_id, 5) == 4 and book.groups(WORKER.peer_id, 6) == 0


def test_what_a_trainer_reads_of_the_book_before_a_bridge_step() -> None:
    """Whether anyone committed for a step, and what the window still owes (trainer/service.py bridge_due)."""
    book = CommitmentBook(None, max_groups=8)
    other = Identity.generate()
    book.offer(commitment(step=5, groups=4), newest_known_step=4)
    book.offer(commitment(step=5, groups=2, worker=other), newest_known_step=4)
    book.offer(commitment(step=6, groups=4), newest_known_step=4)
    assert book.has_step(5) and book.has_step(6) and not book.has_step(7)
    state = JudgeState(commitments=book)
    assert state.owed(range(5, 6)) == 6 and state.owed(range(3, 7)) == 10 and state.owed(range(7, 9)) == 0
    state.credit(WORKER.peer_id, 5, [0, 1, 2])
    assert state.owed(range(5, 6)) == 3
    assert JudgeState().owed(range(0, 10)) == 0  # no book: nothing is owed


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


def test_a_commitment_stored_while_the_judge_settles_survives_a_restart(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """verify_batch settles the book in the judge's worker thread while the receiver stores a
    worker's commitment on the trio loop. Unlocked, the settle's rewrite (its lines taken before the
    offer) replaced the file after the offer appended its line: answered stored, gone on restart."""
    path = tmp_path / "c.jsonl"
    book = CommitmentBook(path, max_groups=8)
    assert book.offer(commitment(step=5), newest_known_step=4) == STORED
    rewriting, resume = threading.Event(), threading.Event()
    write = book_module.write_durably

    def paused_write(target: Path, data: bytes, **kwargs: object) -> None:
        rewriting.set()
        assert resume.wait(10)
        write(target, data, **kwargs)

    monkeypatch.setattr(book_module, "write_durably", paused_write)
    settling = threading.Thread(target=book.settle, args=(6, {}))  # closes step 5
    settling.start()
    assert rewriting.wait(10)
    answers: list[str] = []
    offering = threading.Thread(target=lambda: answers.append(book.offer(commitment(step=7), newest_known_step=6)))
    offering.start()
    offering.join(1.0)  # unlocked, the offer appends now, inside the settle's rewrite
    resume.set()
    settling.join(10)
    offering.join(10)
    assert answers == [STORED]
    assert CommitmentBook(path, max_groups=8).groups(WORKER.peer_id, 7) == 4
    assert CommitmentBook(path, max_groups=8).groups(WORKER.peer_id, 5) == 0


def test_step_zero_is_warm_up_judged_without_a_commitment(tmp_path: Path) -> None:
    """Checkpoint 0 exists before anyone can commit: a commitment for it is always late, and its
    counters are judged without one (specs/rollouts.md, "Step 0 is warm-up")."""
    book = CommitmentBook(tmp_path / "c.jsonl", max_groups=8)
    assert book.offer(commitment(step=0), newest_known_step=0) == LATE
    state = JudgeState(commitments=book)
    assert state.counter_problem(WORKER.peer_id, 0, 0, cap=100) is None
    assert state.counter_problem(WORKER.peer_id, 1, 0, cap=100) == "uncommitted"
    state.forget_before(3)
    assert state.settled == []  # nothing was committed: nothing settles


def test_the_worker_generates_only_committed_counters_and_sizes_by_its_rate() -> None:
    plan = CommitmentPlan(groups_per_batch=4, groups_per_step=0, async_window=2)
    assert plan.covered(0, next_counter=100) is None  # warm-up: no bound
    assert plan.size(held=0, made_before=0) == 4 * MIN_BATCHES  # at least a few batches
    assert plan.to_send(1, ["a", "b"], groups=4) == ["a", "b"]
    assert plan.covered(1, next_counter=0) == 0  # sent, not answered: nothing covered yet
    plan.answered(1, "a", "failed", now=100.0)
    assert plan.covered(1, next_counter=0) == 0
    # an answer is final; a judge not reached is tried again, but not in every round
    assert plan.to_send(1, ["a", "b", "c"], groups=99, now=101.0) == ["b", "c"]
    assert plan.to_send(1, ["a", "b", "c"], groups=99, now=100.0 + RETRY_FAILED_S) == ["a", "b", "c"]
    plan.answered(1, "c", "early")  # c is behind: asked again next round, and it blocks nothing
    assert plan.to_send(1, ["b", "c"], groups=4, now=101.0) == ["b", "c"]
    plan.answered(1, "b", "stored")
    assert plan.covered(1, next_counter=1) == 3 and plan.steps[1].groups == 4  # the size stands once sent
    assert plan.covered(1, next_counter=4) == 0
    plan.answered(1, "c", "late")  # c would refuse every group as uncommitted: none is made
    assert plan.covered(1, next_counter=1) == 0
    assert plan.size(held=2, made_before=4) == 4 * MIN_BATCHES  # at least a few batches
    assert plan.size(held=2, made_before=20) == 40  # used its whole commitment: the limit, not its rate
    assert plan.size(held=8, made_before=17) == 20  # no commitment of its own before: its rate, in whole batches
    assert plan.size(held=9, made_before=10**9) == DEFAULT_MAX_GROUPS_PER_STEP
    plan.to_send(6, ["t"], groups=4)
    plan.answered(6, "t", "not_judging")  # nobody there judges with a book: no bound
    assert plan.covered(6, next_counter=50) is None
    plan.forget_before(5)
    assert sorted(plan.steps) == [6]
    assert CommitmentPlan(groups_per_batch=4, groups_per_step=9, async_window=2).size(0, 0) == 20  # 2 x 9, batches


def test_a_worker_that_missed_the_newest_steps_commitment_generates_an_older_committed_step() -> None:
    """A trainer resuming from its pool can publish steps 4 and 5 at once: a worker that committed
    for 3 and 4 only must generate step 4's committed groups, not wait for a step 6 that the
    trainer can only make from its groups."""
    plan = CommitmentPlan(groups_per_batch=4, groups_per_step=0, async_window=2)
    for step, groups in ((3, 8), (4, 16)):
        plan.to_send(step, ["t"], groups=groups)
        plan.answered(step, "t", "stored")
    made = {3: 8, 4: 4}
    never_done = lambda step: False  # noqa: E731
    assert plan.step_to_generate([5, 4, 3], made.__getitem__, never_done) == 4
    made[4] = 16  # step 4's commitment used up; step 3's too
    assert plan.step_to_generate([5, 4, 3], made.__getitem__, never_done) == 5  # nothing owed: pace on 5
    made[4] = 4
    assert plan.step_to_generate([5, 4, 3], made.__getitem__, lambda step: step == 4) == 5  # share done
    plan.to_send(5, ["t"], groups=4)
    plan.answered(5, "t", "stored")
    assert plan.step_to_generate([5, 4, 3], made.__getitem__, never_done) == 5  # committed: the newest
    plan.to_send(6, ["t"], groups=4)
    plan.answered(6, "t", "late")  # the trainer knew 6 first: refused, so 6 counts as missed
    assert plan.step_to_generate([6, 5, 4], lambda step: 0, never_done) == 5
    assert plan.step_to_generate([1, 0], lambda step: 0, never_done) == 0  # step 0 is warm-up, never bound
    assert plan.step_to_generate([0], lambda step: 0, never_done) == 0
