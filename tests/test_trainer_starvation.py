"""A trainer step never waits forever: for a full batch (node/roles/trainer/service.py STARVED_S),
nor for groups nobody may make (``bridge_due``: the bridge step, specs/rollouts.md).

Workers generate a step only on counters committed before its checkpoint existed; when most of
their groups teach nothing, the commitments run out before the trainer holds ``batch_groups``
groups, the workers wait for the next step and the trainer for groups. Seen in the demo (stuck
at step 84 with 14 of 16 groups): once nothing new arrives for STARVED_S, the step takes what
is pooled. When nothing is pooled and no committed counter of the window is left, the same weights
are published as the next step once workers wait to generate on it."""

import pytest
import torch

from intellect_node.node.roles.trainer.config import TrainerOptions
from intellect_node.node.roles.trainer.learner import GRPOLearner
from intellect_node.node.roles.trainer.service import (
    BRIDGE_OWED_FACTOR,
    STARVED_S,
    SURPLUS_AFTER_S,
    ArrivalClock,
    batch_candidates,
    bridge_due,
    groups_to_take,
)
from tests.support.grpo_groups import small_model


def test_a_full_batch_is_taken_at_once_and_no_more() -> None:
    assert groups_to_take(16, 16, 0.0, STARVED_S) == 16
    assert groups_to_take(40, 16, 0.0, STARVED_S) == 16


def test_a_short_pool_waits_while_groups_may_still_come() -> None:
    assert groups_to_take(14, 16, 0.0, STARVED_S) == 0
    assert groups_to_take(14, 16, STARVED_S - 0.1, STARVED_S) == 0


def test_a_starved_step_takes_what_is_pooled_but_never_nothing() -> None:
    assert groups_to_take(14, 16, STARVED_S, STARVED_S) == 14
    assert groups_to_take(1, 16, 10 * STARVED_S, STARVED_S) == 1
    assert groups_to_take(0, 16, 10 * STARVED_S, STARVED_S) == 0


def test_the_surplus_over_a_workers_cap_fills_a_batch_only_once_admitted_groups_stop_arriving() -> None:
    """Delivery standing's surplus (specs/rollouts.md) is the last resort, and never a stall: a step
    waits briefly for admitted groups, then takes the surplus behind them, before the starvation
    clock (which the surplus's own arrivals keep resetting) would ever run out."""
    admitted, surplus = ["a1", "a2"], ["s1", "s2", "s3"]
    assert batch_candidates(admitted, surplus, 0.0) == admitted
    assert batch_candidates(admitted, surplus, SURPLUS_AFTER_S - 0.1) == admitted
    assert batch_candidates(admitted, surplus, SURPLUS_AFTER_S) == admitted + surplus  # admitted first
    assert SURPLUS_AFTER_S < 10.0 < STARVED_S  # shorter than a worker's pacing wait


def test_the_starvation_clock_runs_from_the_last_group_the_step_could_take() -> None:
    """Groups the step cannot take (a worker without standing paces a batch every 10 s) arrive in the
    pool but leave the usable count as it was: they do not hold the step back (they held the demo's
    trainer 70 s at 14 of 16 groups when every pool change reset the clock)."""
    clock = ArrivalClock(since=100.0)
    assert clock.idle_s(14, 100.0) == 0.0
    for now in (110.0, 120.0, 129.9):  # pool changes every 10 s, nothing usable among them
        assert clock.idle_s(14, now) == now - 100.0
    assert groups_to_take(14, 16, clock.idle_s(14, 130.0), STARVED_S) == 14
    assert clock.idle_s(15, 131.0) == 0.0  # a usable arrival restarts it
    assert clock.idle_s(9, 140.0) == 9.0  # groups leaving (staler than the window) are no arrival
    assert clock.idle_s(10, 141.0) == 0.0  # but one after them is


def test_a_bridge_comes_only_after_the_wait_and_only_for_waiting_workers() -> None:
    assert not bridge_due(4, 59.9, True, 0, 60.0)
    assert bridge_due(4, 60.0, True, 0, 60.0)
    # nobody committed for the next step: a trainer without workers does not step, however long it waits
    assert not bridge_due(4, 1e6, False, 0, 60.0)


def test_owed_counters_of_the_window_defer_a_bridge_but_do_not_block_it() -> None:
    """A slow worker still generating its committed counters gets longer; a dead one does not stop the run."""
    assert not bridge_due(4, 60.0 * BRIDGE_OWED_FACTOR - 0.1, True, 3, 60.0)
    assert bridge_due(4, 60.0 * BRIDGE_OWED_FACTOR, True, 3, 60.0)


def test_step_0_never_bridges() -> None:
    """Checkpoint 0's groups need no commitment: a slow worker's first batch (a real model on a CPU
    takes minutes) is waited for, and nothing there waits on the trainer."""
    assert not bridge_due(0, 1e6, True, 0, 60.0)


def test_a_bridge_step_counts_a_step_and_changes_no_weight() -> None:
    learner = GRPOLearner(small_model(), pad_id=0)
    before = {k: v.clone() for k, v in learner.weights().items()}
    learner.bridge()
    assert learner.updates == 1
    assert all(torch.equal(before[k], v) for k, v in learner.weights().items())
    restored = GRPOLearner(small_model(), pad_id=0)
    restored.load_state_dict(learner.state_dict())
    assert restored.updates == 1


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_a_bridge_wait_must_be_positive(value: float, tmp_path) -> None:
    with pytest.raises(ValueError, match="bridge_after_s"):
        TrainerOptions(model_dir=tmp_path, task_spec="toy:seed=0,count=4", publish_dir=tmp_path, bridge_after_s=value)
