"""When the trainer evaluates (``evaluation_due``): by steps, and by wall time for a model whose
steps take minutes, so a real-model demo never ends with its step-0 measurement as its only one."""

from pathlib import Path

import pytest

from intellect_node.node.roles.trainer.config import TrainerOptions
from intellect_node.node.roles.trainer.service import evaluation_due

OPTIONS = TrainerOptions(model_dir=Path("m"), task_spec="toy", publish_dir=Path("p"), eval_every=5,
                         eval_every_s=180.0, first_eval_s=120.0)


@pytest.mark.parametrize("step,since_eval,since_first,due", [
    (5, 1.0, 1.0, True),        # every eval_every steps, however soon
    (1, None, 10.0, False),     # the first step, seconds in
    (2, None, 130.0, True),     # no evaluation yet in this process: first_eval_s after the first step
    (3, 100.0, 400.0, False),   # evaluated 100 s ago
    (4, 181.0, 500.0, True),    # eval_every_s since the last one
])
def test_evaluation_is_due_by_steps_or_by_time(step, since_eval, since_first, due):
    assert evaluation_due(step, OPTIONS, since_eval_s=since_eval, since_first_step_s=since_first) is due


def test_times_must_be_positive():
    with pytest.raises(ValueError):
        TrainerOptions(model_dir=Path("m"), task_spec="toy", publish_dir=Path("p"), eval_every_s=0)
