"""What the tests of live trainer runs share: quick timings, the toy task set, reading a home's records."""

from __future__ import annotations

import json
from pathlib import Path

TIMING = {"INTELLECT_NODE_ADVERT_LIFETIME_S": "30", "INTELLECT_NODE_ADVERT_REFRESH_S": "5",
          "INTELLECT_NODE_HEARTBEAT_S": "1", "INTELLECT_NODE_DISCOVERY_S": "2"}
ENV = {"OMP_NUM_THREADS": "1"}
TASKS = "toy:seed=5,count=500,kinds=reverse"


def read_jsonl(path: Path) -> list[dict]:
    """The readable lines of a JSONL record file (a line cut by a kill is skipped)."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:  # a line cut by the kill
            pass
    return lines


def trained_steps(home: Path) -> list[int]:
    """The steps the trainer in ``home`` logged a training metric for."""
    return [line["step"] for line in read_jsonl(home / "trainer" / "metrics.jsonl") if "task_reward" in line]


def published_steps(home: Path) -> list[int]:
    """The steps the trainer in ``home`` published: trained ones and bridge steps (the same weights
    again, published when nothing could be trained on while workers waited for a step)."""
    return [line["step"] for line in read_jsonl(home / "trainer" / "metrics.jsonl")
            if "task_reward" in line or line.get("bridge")]
