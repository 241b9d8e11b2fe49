"""End to end: ``intellect-node demo``'s swarm learns (real processes, real model, real overlay).

The margin: the held-out greedy accuracy (200 reversal prompts) must rise by at least
``MARGIN`` over its start within ``STEPS`` steps. The default-recipe tiny model (version 2, 1.8M
parameters) starts near 0.165 and sits there for its first 30-40 steps before it climbs (measured:
quiet, 0.165 at the start, 0.115-0.13 at steps 5-20, best 0.27 by step 60, in 143 s of
training); the best evaluation of the run is compared (evaluations come every 5 steps), so one
unlucky last evaluation cannot fail a run that learned.
"""

from __future__ import annotations

import json

import pytest

from intellect_node.node.demo.swarm import DemoOptions, run_demo
from tests.support.engine_helpers import demo_tiny_model

STEPS = 60
MARGIN = 0.05


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_demo_swarm_learns_toy_reversal(tmp_path) -> None:
    options = DemoOptions(steps=STEPS, minutes=12, out=tmp_path, model_cache=demo_tiny_model(), dashboard=False)
    summary = run_demo(options, log=print)
    assert summary["stopped_by"] == "steps", summary
    lines = [json.loads(raw) for raw in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [line["step"] for line in lines if "task_reward" in line]
    assert trained == list(range(1, STEPS + 1))  # one line per trainer step, none skipped
    # The tiny model sits on the steep part of its warm-up curve (node/demo/tinymodel/build.py):
    # with the same pinned packages it starts at 0.165 on the CPU it was tuned on and at 0.535 on
    # another (2026-11-26); the bound only says the task is far from solved at the start.
    assert summary["eval_accuracy_start"] <= 0.6
    assert summary["eval_accuracy_best"] >= summary["eval_accuracy_start"] + MARGIN, summary
    assert summary["rejected_groups"] == 0  # honest workers only: no false rejections
    assert summary["accepted_groups"] > 0
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == STEPS
    # the profile: every node's CPU time, and what the producing roles made with it
    profile = summary["profile"]
    assert set(profile) == {"trainer", "inference0", "inference1", "validator"}  # the trainer is the entry point
    assert all(entry["cpu_s"] > 0 for entry in profile.values()), profile
    assert all(profile[name]["inference"]["tokens"] > 0 for name in ("inference0", "inference1")), profile
    assert profile["validator"]["validator"]["rows_verified"] > 0, profile
    assert profile["trainer"]["trainer_verification"]["rows_verified"] > 0, profile
