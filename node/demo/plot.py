"""reward.png: the trainer's task reward per step and the held-out accuracy, from metrics.jsonl
lines (step 0's line carries only the starting accuracy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_reward_plot(lines: Sequence[dict[str, Any]], path: Path, title: str = "intellect-node demo") -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5), dpi=100)
    trained = [line for line in lines if "task_reward" in line]
    axis.plot([line["step"] for line in trained], [line["task_reward"] for line in trained], color="#9ecae1",
              linewidth=1, label="task reward (kept groups)")
    measured = [line for line in lines if line.get("eval_measured")]
    if measured:
        axis.plot([line["step"] for line in measured], [line["eval_accuracy"] for line in measured], "o-",
                  color="#08519c", linewidth=2, markersize=3, label="held-out greedy accuracy")
    axis.set_xlabel("trainer step")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left")
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
