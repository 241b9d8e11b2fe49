"""The flip test over a worker's history (node/roles/validator/validation.py, ledger.py): a steerer
who stays under one group's bound is refused once its groups add up; an honest worker, whose flips
match its pair's noise, never is."""

from __future__ import annotations

import numpy as np

from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import GroupResult, _steady_steering
from intellect_node.protocol.sampling import FLIP_ALPHA, poisson_at_least


def test_steady_steering_is_refused_once_the_groups_add_up_and_honest_flips_never_are() -> None:
    state, expected = JudgeState(), 2.0
    rng = np.random.default_rng(1)
    for counter in range(2000):  # an honest worker: flips as its pair's noise says
        result = GroupResult(counter, None, flips=int(rng.poisson(expected)), expected_flips=expected)
        assert _steady_steering(result, state, "honest").reason is None
    steered = 8  # 6 steered near ties a group: p = 0.0045 per group, far above the bound
    assert poisson_at_least(steered, expected) > FLIP_ALPHA
    refused_at = None
    for counter in range(200):
        result = _steady_steering(GroupResult(counter, None, flips=steered, expected_flips=expected), state, "steerer")
        if result.reason is not None:
            refused_at = counter
            assert result.reason == "sampling" and "this worker's groups" in result.detail
            break
    assert refused_at is not None and refused_at < 20
    assert _steady_steering(GroupResult(0, "toploc"), state, "other").reason == "toploc"  # refusals add nothing
    assert "other" not in state.flips
