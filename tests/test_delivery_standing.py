"""The delivery-share ledger: whose accepted groups a trainer trains on (specs/rollouts.md, "Delivery standing").

Settlements go through the real ``CommitmentBook`` and ``JudgeState`` (commitments offered before
their checkpoint, counters credited in order, steps closed by ``forget_before``), so the ledger sees
exactly what a judge settles.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from intellect_node.crypto.identity import Identity
from intellect_node.node.roles.trainer.groups import TrainingGroup
from intellect_node.node.roles.trainer.pool import GroupPool
from intellect_node.node.roles.validator import delivery
from intellect_node.node.roles.validator.commitments import STORED, CommitmentBook
from intellect_node.node.roles.validator.delivery import DeliveryLedger, delivery_share
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.tasks.spec import load_task_spec
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.run_spec import DEFAULT_DELIVERY, DeliveryRule, RunSpec, build_run_spec, sign_spec

WINDOW = 2  # async window: steps 0 .. 3 are open
RULE = DEFAULT_DELIVERY  # 16 steps, 0.75


class Judge:
    """A judge's book and counters, stepped by hand: ``run(step, plan)`` commits for ``step`` before
    its checkpoint, credits ``plan[worker]`` counters of it, and settles what left the window."""

    def __init__(self, path: Path | None = None, rule: DeliveryRule = RULE) -> None:
        self.ledger = DeliveryLedger(None if path is None else path / "delivery.json", rule, WINDOW)
        self.book = CommitmentBook(None if path is None else path / "commitments.jsonl", max_groups=4096,
                                   delivery=self.ledger)
        self.state = JudgeState(commitments=self.book)

    def run(self, step: int, committed: dict[str, int], delivered: dict[str, int]) -> None:
        for worker, groups in committed.items():
            assert self.book.offer(WorkCommitment(run_id="r", worker=worker, step=step, groups=groups),
                                   step - 1) == STORED
        for worker, count in delivered.items():
            for counter in range(count):
                assert self.state.counter_problem(worker, step, counter, cap=4096) is None
        self.state.forget_before(step - WINDOW)  # checkpoint ``step`` is the newest known


def test_the_share_is_taken_against_what_the_worker_shows_it_makes_in_a_step() -> None:
    # an honest worker commits about twice what it makes: d / N is a half, its share is whole
    assert delivery_share([(24, 12)] * 8) == 1.0
    # one long step (a starved trainer waited) does not set the cap: the median step does; nor do
    # whole batches (a slow worker's steps read 4 or 8 groups)
    assert delivery_share([(24, 12)] * 7 + [(24, 24)]) == 1.0
    assert delivery_share([(16, 4)] * 13 + [(16, 8)] * 3) == 1.0
    # a step lost whole costs 1/8; a group lost, 1/12 of a step
    assert delivery_share([(24, 12)] * 7 + [(24, 0)]) == pytest.approx(7 / 8)
    assert delivery_share([(24, 12)] * 7 + [(24, 11)]) == pytest.approx(1 - 1 / 96)
    # a worker that never delivered has share 0; one with no settled commitment has none
    assert delivery_share([(4, 0), (4, 0)]) == 0.0
    assert delivery_share([]) is None
    # the upper median: one lost step of two is a half, not nothing
    assert delivery_share([(24, 12), (24, 0)]) == 0.5


def test_window_and_threshold_come_from_the_run_spec() -> None:
    judge = Judge(rule=DeliveryRule(window_steps=4, min_share=0.75))
    for step in range(1, 7):  # six steps lost whole, then honest delivery ("other" delivers throughout)
        judge.run(step, {"w": 8, "other": 8}, {"w": 0, "other": 4})
    for step in range(7, 14):
        judge.run(step, {"w": 8, "other": 8}, {"w": 4, "other": 4})
    # steps 1 .. 10 are settled (11 .. 13 are in the window); only the newest four count, all delivered
    assert sorted(judge.ledger.steps["w"]) == [7, 8, 9, 10]
    assert judge.ledger.share("w") == 1.0 and judge.ledger.standing("w")
    for step in (14, 15, 16, 17):  # 14 and 15 lost whole; step 17 settles 14
        judge.run(step, {"w": 8, "other": 8}, {"w": 0 if step in (14, 15) else 4, "other": 4})
    assert judge.ledger.share("w") == 0.75 and judge.ledger.standing("w")  # at the threshold: standing
    judge.run(18, {"w": 8, "other": 8}, {"w": 4, "other": 4})  # settles 15: two of the four steps lost
    assert judge.ledger.share("w") == 0.5 and not judge.ledger.standing("w")


def test_a_step_nobody_delivered_to_is_noted_for_no_one() -> None:
    """A restarted trainer trains its pooled steps in a second: a step it moved past before anyone
    could deliver (every committed worker's ``d`` 0) says nothing of who withholds (seen: an honest
    worker's [0 of step 1, 8 of step 2] cost its standing and two five-minute bridges). A step that
    someone delivered to counts for all."""
    ledger = DeliveryLedger(None, DeliveryRule(window_steps=4, min_share=0.75), WINDOW)
    ledger.record([("a", 1, 16, 0), ("b", 1, 16, 0)])
    ledger.record([("a", 2, 16, 8), ("b", 2, 16, 0)])
    assert ledger.steps == {"a": {2: (16, 8)}, "b": {2: (16, 0)}}
    assert ledger.standing("a") and ledger.trained_per_step("a") == 8
    assert not ledger.standing("b")


def test_an_honest_worker_that_loses_groups_to_churn_keeps_its_standing() -> None:
    judge = Judge()
    rng = random.Random(1)
    for step in range(1, 20):
        made = rng.randint(10, 13)  # what it makes varies with the step's length
        if step == 9:
            made = 0  # offline for a whole step
        elif step in (5, 14):
            made -= 1  # a group lost in transit
        judge.run(step, {"honest": 24}, {"honest": made})
        if step > WINDOW + 1:
            assert judge.ledger.standing("honest"), (step, judge.ledger.steps["honest"])
    assert judge.ledger.admits("honest", 19, 0)


def test_a_step_past_the_median_loses_its_surplus_to_training_only() -> None:
    """The step cap: of a worker with standing, a step's counters below its median step's count
    are trained on; the surplus (the counters delivered last) is credited and paid as before."""
    judge = Judge()
    for step in range(1, 12):  # about the same each step, one long step (the trainer took longer)
        judge.run(step, {"w": 24}, {"w": 16 if step == 5 else 12})
    assert judge.ledger.trained_per_step("w") == 12  # the long step moves neither median nor share
    assert judge.ledger.standing("w") and judge.ledger.share("w") == 1.0
    assert all(judge.ledger.admits("w", 11, c) for c in range(12))
    assert not any(judge.ledger.admits("w", 11, c) for c in range(12, 24))
    # the long step's surplus was credited: only the counters never delivered settled unpaid
    settled_step_5 = [u for u in judge.state.settled if u.worker == "w" and u.step == 5]
    assert [len(u.counters) for u in settled_step_5] == [24 - 16]
    # the open steps need neither standing nor the cap
    assert judge.ledger.admits("w", WINDOW + 1, 23)


def test_a_steady_honest_worker_loses_nothing_and_a_churned_one_keeps_its_cap() -> None:
    judge = Judge()
    for step in range(1, 20):
        churned = 0 if step == 9 else 11 if step in (5, 14) else 12  # a step lost whole, two groups
        judge.run(step, {"steady": 24, "churned": 24}, {"steady": 12, "churned": churned})
        if step > WINDOW + 1:
            for worker, made in (("steady", 12), ("churned", churned)):
                assert all(judge.ledger.admits(worker, step, c) for c in range(made)), (worker, step)
    assert judge.ledger.trained_per_step("steady") == judge.ledger.trained_per_step("churned") == 12
    assert judge.ledger.standing("churned")


def test_a_worker_whose_steps_change_length_keeps_its_standing_and_its_cap_follows() -> None:
    """A short step after a trainer's restart, then whole ones (seen in tests/test_trainer_role.py:
    ledger [(16, 4), (16, 16)] read 0.625 at the median and the only worker's groups waited for a
    bridge step), and steps that grow fourfold (a slower trainer): standing never lapses; the cap
    is the largest at which the share holds, at most the median step's count."""
    assert delivery.standing_cap([(16, 4), (16, 16)], 0.75) == 8  # (4 + 8) / (8 + 8)
    assert delivery_share([(16, 4), (16, 16)]) == 0.625 and delivery_share([(16, 4), (16, 16)], 8) == 0.75
    judge = Judge()
    caps = []
    for step in range(1, 60):
        made = 4 if step < 20 else 16
        judge.run(step, {"w": 32}, {"w": made})
        if step > WINDOW + 1:
            assert judge.ledger.standing("w"), (step, judge.ledger.steps["w"])
            caps.append(judge.ledger.trained_per_step("w"))
    assert min(caps) == 4 and caps[-1] == 16
    assert caps == sorted(caps)  # it rises with the window, never dips below the short steps' count
    assert [c for c in range(32) if judge.ledger.admits("w", 59, c)] == list(range(16))
    assert judge.ledger.fills("w")  # back at its median: its surplus may fill a starved batch again


def test_a_cap_lowered_below_the_median_admits_only_under_it() -> None:
    """The surplus of a worker whose share holds only at a lowered cap does not fill batches: a
    picker that delivers one group unlooked-at, a pick on top in half its steps and gives up a
    step now and then gains no way into training that the median-only rule kept shut."""
    ledger = DeliveryLedger(None, DeliveryRule(window_steps=4, min_share=0.75), WINDOW)
    for step, picker, steady in ((1, 2, 2), (2, 2, 2), (3, 1, 2), (4, 0, 1)):
        ledger.record([("picker", step, 4, picker), ("steady", step, 4, steady)])
    # picker 2, 2, 1, 0: 0.625 at its median 2, 0.75 at 1; steady 2, 2, 2, 1: 0.875 at 2
    assert ledger.trained_per_step("picker") == 1 and ledger.standing("picker") and not ledger.fills("picker")
    assert [c for c in range(4) if ledger.admits("picker", WINDOW + 5, c)] == [0]
    assert ledger.trained_per_step("steady") == 2 and ledger.fills("steady")
    assert not ledger.fills("never-seen") and not ledger.standing("never-seen")
    ledger.record([("picker", 5, 4, 2), ("steady", 5, 4, 2)])  # window 2, 1, 0, 2: still 0.625 at 2
    assert not ledger.fills("picker")
    ledger.record([("picker", 6, 4, 2), ("steady", 6, 4, 2)])  # window 1, 0, 2, 2: the cache was dropped
    ledger.record([("picker", 7, 4, 2), ("steady", 7, 4, 2)])  # window 0, 2, 2, 2: 0.75 at 2, its median
    assert ledger.trained_per_step("picker") == 2 and ledger.fills("picker")


def test_the_cap_is_the_largest_that_holds_found_without_trying_each() -> None:
    """``standing_cap`` against trying every cap from the median down, on random windows (honest,
    picking and mixed-size commitments), and on a window of huge counts."""
    def by_scan(entries, min_share):
        for cap in range(delivery.median_delivered(entries), 0, -1):
            if delivery_share(entries, cap) >= min_share:
                return cap
        return 0

    rng = random.Random(7)
    for _ in range(3000):
        entries = []
        for _ in range(rng.randint(1, 16)):
            committed = rng.choice((1, 2, 4, 16, 24, rng.randint(1, 60)))
            entries.append((committed, rng.randint(0, committed) if rng.random() < 0.7 else committed))
        min_share = rng.choice((0.5, 0.6, 0.75, 0.9, 1.0))
        assert delivery.standing_cap(entries, min_share) == by_scan(entries, min_share), (entries, min_share)
    huge = [(2**20, 2**20)] * 8 + [(2**20, 3)] * 7 + [(2**20, 0)]  # a median of a million groups
    cap = delivery.standing_cap(huge, 0.75)
    assert 3 < cap < 2**20 and delivery_share(huge, cap) >= 0.75 > delivery_share(huge, cap + 1)


def test_a_lower_cap_buys_a_picker_nothing_the_threshold_did_not_concede() -> None:
    """Its share at a cap of one group is the fraction of steps in which its first task pleased it;
    a picker pleased half the time has no cap at all, one pleased 15 times in 16 trains at most the
    counters before its first dislike, under a cap below its median."""
    half = [(24, d) for d in (0, 1, 0, 3, 0, 2, 1, 0, 0, 5, 1, 0, 2, 0, 0, 1)]  # 8 of 16 steps: d >= 1
    assert delivery.standing_cap(half, 0.75) == 0
    assert delivery_share(half, 1) == 0.5
    mostly = [(24, d) for d in (9, 1, 0, 3, 12, 2, 7, 4, 6, 5, 1, 8, 2, 11, 3, 1)]  # 15 of 16: d >= 1
    cap = delivery.standing_cap(mostly, 0.75)
    assert 1 <= cap < delivery.median_delivered(mostly)
    assert delivery_share(mostly, cap) >= 0.75 > delivery_share(mostly, cap + 1)


def test_a_topup_picker_keeps_standing_but_its_picks_above_the_median_are_not_trained() -> None:
    """It delivers half of what it makes unlooked-at, then goes on only while it likes the next
    task (a third of them): its share is whole (nothing above the median counts), so it keeps
    standing, but each step trains only its unlooked-at half."""
    judge = Judge()
    rng = random.Random(3)
    for step in range(1, 40):
        picks = 0
        while picks < 6 and rng.random() < 1 / 3:
            picks += 1
        judge.run(step, {"topup": 24}, {"topup": 6 + picks})
    assert judge.ledger.standing("topup") and judge.ledger.trained_per_step("topup") == 6
    assert [c for c in range(24) if judge.ledger.admits("topup", 39, c)] == list(range(6))


def test_a_picking_cheater_loses_its_influence() -> None:
    """Tasks please the cheater half of the time. ``prefix`` delivers a key's counters until the
    first one it dislikes (dense counters allow nothing else); ``one-a-step`` commits one group a
    step and delivers it or not. Either share is about the chance that a task pleases it, so with
    the run spec's window (16) and threshold (0.75) it has standing only through a lucky streak
    (12 of 16: about 4% of the steps), against every step for an honest worker."""
    rng = random.Random(2)
    judge = Judge()
    standing = {"prefix": 0, "one-a-step": 0, "honest": 0}
    steps = range(1, 600)
    for step in steps:
        run = 0
        while rng.random() < 0.5 and run < 24:
            run += 1
        judge.run(step, {"prefix": 24, "one-a-step": 1, "honest": 24},
                  {"prefix": run, "one-a-step": int(rng.random() < 0.5), "honest": rng.choice((4, 4, 4, 8))})
        for worker in standing:
            standing[worker] += judge.ledger.admits(worker, step, 0)
    gated = len(steps) - (WINDOW + 1)
    assert standing["honest"] == len(steps)
    for picker in ("prefix", "one-a-step"):
        assert (standing[picker] - (WINDOW + 1)) / gated < 0.1, standing
    for picker in ("prefix", "one-a-step"):
        assert judge.ledger.share(picker) < RULE.min_share


def test_keys_made_for_one_pick_have_no_standing_and_the_open_steps_need_none() -> None:
    judge = Judge()
    for step in range(1, 8):
        # each step, a fresh key commits one group and delivers it: its commitment settles only
        # when its step has left the window, so while its group can be trained it has no standing
        key = f"pick-{step}"
        judge.run(step, {key: 1}, {key: 1})
        assert not judge.ledger.standing(key)
        assert judge.ledger.admits(key, step, 0) == (step <= WINDOW + 1)
    assert judge.ledger.admits("never-seen", 0, 0) and judge.ledger.admits("never-seen", WINDOW + 1, 0)
    assert not judge.ledger.admits("never-seen", WINDOW + 2, 0)


def test_state_is_bounded_per_worker_and_in_workers(monkeypatch) -> None:
    monkeypatch.setattr(delivery, "MAX_WORKERS", 3)
    ledger = DeliveryLedger(None, RULE, WINDOW)
    ledger.record([("honest", s, 24, 12) for s in range(1, 40)])
    assert len(ledger.steps["honest"]) == RULE.window_steps
    # a flood of keys evicts those that delivered least, never the worker that delivered most
    ledger.record([(f"key-{i}", 40, 1, i % 2) for i in range(100)])
    assert len(ledger.steps) == 3 and "honest" in ledger.steps
    assert all(sum(d for _, d in ledger.steps[w].values()) >= 1 for w in ledger.steps)


def test_a_restart_keeps_every_standing_and_a_repeated_settlement_counts_once(tmp_path: Path) -> None:
    judge = Judge(tmp_path)
    for step in range(1, 8):
        judge.run(step, {"honest": 24, "picker": 24}, {"honest": 12, "picker": step % 2})
    before = {w: judge.ledger.share(w) for w in ("honest", "picker")}
    # a crash after the ledger was written but before the book dropped the settled commitments
    judge.run(8, {"honest": 24, "picker": 24}, {"honest": 12, "picker": 0})
    saved = (tmp_path / "commitments.jsonl").read_text()
    judge.book.offer(WorkCommitment(run_id="r", worker="honest", step=9, groups=24), 8)
    shutil.copy(tmp_path / "delivery.json", tmp_path / "delivery.saved")
    judge.state.forget_before(7)  # settles step 6
    after_settle = json.loads((tmp_path / "delivery.json").read_text())
    (tmp_path / "commitments.jsonl").write_text(saved + json.dumps(["honest", 9, 24]) + "\n")

    restarted = Judge(tmp_path)
    assert json.loads((tmp_path / "delivery.json").read_text()) == after_settle
    restarted.state.next_counter = {("honest", 6): 12, ("picker", 6): 0}  # rebuilt from the records
    restarted.state.forget_before(7)  # the same settlement again
    assert json.loads((tmp_path / "delivery.json").read_text()) == after_settle
    assert restarted.ledger.steps == judge.ledger.steps
    assert restarted.ledger.share("honest") == before["honest"] == 1.0
    assert restarted.ledger.trained_per_step("honest") == judge.ledger.trained_per_step("honest") == 12  # the cap
    assert not restarted.ledger.standing("picker")


@pytest.mark.parametrize("damage", [b"{not json", b"[1, 2]", b'{"w": [[1, 2]]}', b'{"w": [[1, "a", 3]]}',
                                    b'{"w": [[-1, 2, 1]]}'])
def test_a_damaged_ledger_costs_standing_not_the_start(tmp_path: Path, damage: bytes, caplog) -> None:
    (tmp_path / "delivery.json").write_bytes(damage)
    ledger = DeliveryLedger(tmp_path / "delivery.json", RULE, WINDOW)
    assert ledger.steps == {} and "unreadable delivery ledger" in caplog.text
    ledger.record([("w", 5, 8, 8)])  # and it is written afresh at the next settlement
    assert DeliveryLedger(tmp_path / "delivery.json", RULE, WINDOW).share("w") == 1.0


def test_an_oversized_ledger_is_not_read(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(delivery, "MAX_FILE_BYTES", 10)
    (tmp_path / "delivery.json").write_text(json.dumps({"w": [[1, 8, 8]]}))
    assert DeliveryLedger(tmp_path / "delivery.json", RULE, WINDOW).steps == {}
    assert "bytes, at most 10" in caplog.text


def test_the_pool_hands_out_only_admitted_groups(tmp_path: Path) -> None:
    pool = GroupPool(tmp_path / "pool")
    groups = [TrainingGroup(key=f"{i:064x}:{c}", worker=w, policy_step=s, task_id="t", length_target=None,
                            prompt=(1,), completions=((2,), (3,)), task_rewards=(0.0, 1.0), logprobs=())
              for i, (w, s, c) in enumerate([("honest", 5, 0), ("picker", 5, 0), ("picker", 3, 0), ("honest", 4, 0),
                                             ("honest", 4, 1), ("honest", 4, 2)])]
    pool.admit(groups)
    ledger = DeliveryLedger(None, RULE, WINDOW)
    ledger.record([("honest", 2, 24, 2)])
    # the picker has no standing; the honest worker's counter 2 of step 4 is past its median step (2)
    assert [(g.worker, g.policy_step, g.counter) for g in pool.newest_first(ledger.admits)] == [
        ("honest", 5, 0), ("honest", 4, 0), ("honest", 4, 1), ("picker", 3, 0)]
    assert len(pool.newest_first()) == 6  # withheld, not dropped


def test_the_delivery_rule_is_part_of_the_signed_run_spec() -> None:
    authority = Identity.generate()
    tasks = load_task_spec("toy:seed=1,count=8")
    spec = build_run_spec(run_id="r", authority=authority.peer_id, tasks=tasks, settings=_SHAPE, async_window=2,
                          delivery=DeliveryRule(window_steps=16, min_share=0.5))
    loaded = codec.decode(sign_spec(spec, authority, 600), RunSpec).message
    assert loaded.delivery == DeliveryRule(window_steps=16, min_share=0.5)
    assert build_run_spec(run_id="r", authority=authority.peer_id, tasks=tasks, settings=_SHAPE,
                          async_window=2).delivery == DEFAULT_DELIVERY
    for bad in ({"window_steps": 0, "min_share": 0.5}, {"window_steps": 8, "min_share": 1.5},
                {"window_steps": 8}):
        wire = spec.to_wire() | {"delivery": bad}
        with pytest.raises(Rejected):
            RunSpec.from_wire(wire)
    without = spec.to_wire()
    del without["delivery"]
    with pytest.raises(Rejected, match="delivery"):
        RunSpec.from_wire(without)


_SHAPE = RolloutShape(group_size=4, max_tokens=16, length_targets=(8,))
