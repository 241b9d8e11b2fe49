"""A trainer step never waits forever for a full batch (node/roles/trainer/service.py STARVED_S).

Workers generate a step only on counters committed before its checkpoint existed; when most of
their groups teach nothing, the commitments run out before the trainer holds ``batch_groups``
groups, the workers wait for the next step and the trainer for groups. Seen in the demo (stuck
at step 84 with 14 of 16 groups): once nothing new arrives for STARVED_S, the step takes what
is pooled."""

from intellect_node.node.roles.trainer.service import STARVED_S, groups_to_take


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
