"""End to end: ``intellect-node demo``'s swarm learns (real processes, real model, real overlay).

The margin: the held-out greedy accuracy (200 reversal prompts) must rise by at least
``MARGIN`` over its start within ``STEPS`` steps. Where the tiny model starts at 0.535 (this
machine, 2026-11-27, workers committing their counters), 60 steps gave +0.04 and +0.06 in two
runs, 100 steps +0.06 (its training reward 0.49 -> 0.68 over the first 60): hence 100 steps,
a margin of 0.04 (8 of 200 prompts), and the training reward's rise asserted beside it.
On the CPU the recipe was tuned on, the tiny model (version 2, 1.8M parameters) starts near
0.165 and sits there for its first 30-40 steps before it climbs (quiet: 0.115-0.13 at steps 5-20,
best 0.27 by step 60, in 143 s of training). The best evaluation of the run is compared
(evaluations come every 5 steps), so one unlucky last evaluation cannot fail a run that learned.
"""

from __future__ import annotations

import json

import pytest

from intellect_node.node.demo.swarm import FULL_LR, LORA_LR, DemoOptions, run_demo
from tests.support.engine_helpers import smollm2_import

STEPS = 100
MARGIN = 0.04
REWARD_GAIN = 0.1  # the training reward, last five steps over the first five


@pytest.mark.slow
@pytest.mark.timeout(1200, func_only=True)
def test_demo_swarm_learns_toy_reversal(tmp_path, demo_model) -> None:
    options = DemoOptions(steps=STEPS, minutes=12, out=tmp_path, model_cache=demo_model, dashboard=False)
    summary = run_demo(options, log=print)
    assert summary["stopped_by"] == "steps", summary
    lines = [json.loads(raw) for raw in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [line["step"] for line in lines if "task_reward" in line]
    assert trained == list(range(1, STEPS + 1))  # one line per trainer step, none skipped
    # evaluations run beside the steps, each its own line in step order; the last step's is waited for
    evaluated = [line["step"] for line in lines if line.get("eval_measured")]
    assert evaluated[0] == 0 and evaluated[-1] == STEPS and evaluated == sorted(set(evaluated)), evaluated
    # The tiny model sits on the steep part of its warm-up curve (node/demo/tinymodel/build.py):
    # with the same pinned packages it starts at 0.165 on the CPU it was tuned on and at 0.535 on
    # another (2026-11-26); the bound only says the task is far from solved at the start.
    assert summary["eval_accuracy_start"] <= 0.6
    assert summary["eval_accuracy_best"] >= summary["eval_accuracy_start"] + MARGIN, summary
    assert summary["task_reward_last5"] >= summary["task_reward_first5"] + REWARD_GAIN, summary
    # honest workers only: nothing refused as wrong; an honest group past the pair's tolerance but
    # inside twice it is set aside as inconclusive (not trained on, nobody charged: specs/validation.md,
    # "Two bounds"), which the precision tail makes rare, not impossible (1 of ~700 in a CI run here)
    assert set(summary["rejections"]) - {"stale_step"} <= {"inconclusive"}, summary
    assert summary["rejections"].get("inconclusive", 0) <= max(1, summary["accepted_groups"] // 100), summary
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_on_smollm2_runs_its_recipe_through_every_role(tmp_path) -> None:
    """``demo --model smollm2``: the real model, its task kinds and its [run] shape reach every node;
    its steps are trained on groups the validator accepted. Whether it learns is a benchmark's
    question (issue 34), not this test's."""
    # one step of half the recipe's batch, 40 held-out prompts: what reaches the nodes is the
    # recipe's (tasks, [run]); a second step, a full batch or 200 prompts would show nothing more,
    # at most of a minute of CI each
    options = DemoOptions.for_model("smollm2", steps=1, batch_groups=4, eval_tasks=40, workers=1, minutes=12,
                                    out=tmp_path, model_cache=smollm2_import().out, dashboard=False)
    summary = run_demo(options, log=print)
    assert summary["stopped_by"] == "steps", summary
    assert summary["rejected_groups"] == 0 and summary["accepted_groups"] > 0, summary
    assert summary["eval_accuracy_start"] is not None
    assert summary["last_evaluated_step"] == 1  # the run's last policy is measured before the demo ends
    for home in (tmp_path / "nodes").iterdir():
        assert "temperature = 0.7" in (home / "config.toml").read_text()  # every node: the same [run]
    trainer_config = (tmp_path / "nodes" / "trainer" / "config.toml").read_text()
    assert "warmup_steps = 1\n" in trainer_config and "decay_steps = 15\n" in trainer_config  # LoRA's schedule
    assert all(entry["cpu_s"] > 0 for entry in summary["profile"].values())
    # the recipe's bf16 policy (each step a sparse delta): step 0 is the 269 MB bf16 file, not 538 MB
    shards = json.loads((tmp_path / "nodes" / "trainer" / "shards" / "status.json").read_text())
    assert 250e6 < shards["steps"]["0"]["total_size"] < 300e6, shards["steps"]["0"]


def test_demo_recipes_name_their_model_and_refuse_unknown_ones() -> None:
    assert DemoOptions.for_model("tiny") == DemoOptions()
    recipe = DemoOptions.for_model("smollm2", lr=1e-4)
    assert recipe.lr == 1e-4 and "add1+mul1" in recipe.tasks and dict(recipe.run_settings)["max_tokens"] == 32
    # the lr follows what is trained: the model's LoRA lr with adapters, its full lr without
    lora, full = DemoOptions.for_model("smollm2"), DemoOptions.for_model("smollm2", lora_rank=0)
    assert lora.lora_rank == 1 and lora.lr == LORA_LR["smollm2"] and full.lr == FULL_LR["smollm2"] == 2e-5
    # and so does the schedule: LoRA's from its first step, decayed over 15; full's warmed up over 5
    assert (lora.lr_warmup_steps, lora.lr_decay_steps) == (1, 15)
    assert (full.lr_warmup_steps, full.lr_decay_steps) == (5, 200)
    assert lora.eval_tasks == full.eval_tasks == 100  # an evaluation of 200 took minutes of 2 cores
    assert DemoOptions.for_model("smollm2", lr_decay_steps=40).lr_decay_steps == 40  # given beats the schedule
    assert DemoOptions.for_model("tiny", lora_rank=4).lr == 5e-3 and DemoOptions.for_model("tiny").lr == 5e-4
    with pytest.raises(ValueError, match="unknown demo model"):
        DemoOptions.for_model("llama-70b")
