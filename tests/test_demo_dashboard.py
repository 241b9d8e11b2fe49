"""The demo's dashboard text, from metrics lines (no processes: an empty swarm)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from intellect_node.node.demo.dashboard import nodes_table, training_table
from intellect_node.node.demo.local_swarm import LocalSwarm
from intellect_node.node.demo.swarm import DemoOptions, summarize


def lines() -> list[dict]:
    base = {"length_reward": -0.01, "staleness_mean": 1.5, "utilization": 0.8, "grad_norm": 1.0,
            "clip_fraction": 0.05, "entropy": 0.4, "accepted_groups": 40, "rejected_groups": 2, "stale_groups": 3,
            "filtered_groups": 10, "tokens": 500.0}
    return [{"step": 0, "wall_s": 0.0, "eval_accuracy": 0.25, "eval_measured": True},
            {**base, "step": 1, "wall_s": 10.0, "task_reward": 0.3, "eval_accuracy": 0.25, "eval_measured": False},
            {**base, "step": 2, "wall_s": 12.0, "task_reward": 0.5, "eval_accuracy": 0.4, "eval_measured": True}]


def render(renderable) -> str:
    console = Console(record=True, width=120)
    console.print(renderable)
    return console.export_text()


def test_training_table_shows_progress_counts_and_rate() -> None:
    text = render(training_table(lines(), DemoOptions(steps=10), elapsed_s=75))
    assert "step 2/10, 1:15 of 10:00" in text
    # the default demo stops by time only: no step limit to show
    assert "step 2, 1:15 of 10:00" in render(training_table(lines(), DemoOptions(), elapsed_s=75))
    assert "0.250 at start -> 0.400 now" in text
    assert "40 / 2 / 3 / 10" in text
    assert "250" in text  # 500 tokens over the 2 s between steps 1 and 2


def test_nodes_table_of_an_empty_swarm_and_summary(tmp_path: Path) -> None:
    assert "nodes" in render(nodes_table(LocalSwarm(tmp_path)))
    summary = summarize(lines(), 30.0, "steps")
    assert summary["eval_accuracy_start"] == 0.25 and summary["eval_accuracy_end"] == 0.4
    assert summary["steps"] == 2 and summary["task_reward_first5"] == 0.4
