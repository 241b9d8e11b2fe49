"""What each step of the demo shipped and how long it took to reach the last worker.

Read from every node's ``<home>/shards/status.json`` (the overlay's own record: per held step its
size, its delta's format and size, and when it became complete there) while the demo runs: a
node keeps only its newest few steps, so the demo polls and remembers each step once seen. The
figures are what an operator could read off the same files: bytes a follower fetched for the
step (the delta, or the whole checkpoint), and seconds from the trainer's publish to the moment
the last worker held the step complete.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from intellect_node.node.demo.local_swarm import LocalSwarm


@dataclass
class StepShipped:
    full_bytes: int
    shipped_bytes: int
    format: str  # "full", "sparse/v2" or "lora/v1"
    published_at: float | None = None
    reached: dict[str, float] = field(default_factory=dict)  # worker name -> wall time complete


class ShippingLog:
    """Per-step shipping records of a running demo swarm (``poll`` it, then ``summary``)."""

    def __init__(self, trainer: str = "trainer", workers_prefix: str = "inference") -> None:
        self.trainer = trainer
        self.workers_prefix = workers_prefix
        self.steps: dict[int, StepShipped] = {}
        self.workers: set[str] = set()

    def poll(self, swarm: LocalSwarm) -> None:
        for name, node in list(swarm.nodes.items()):
            steps = _held_steps(node.home / "shards" / "status.json")
            if name.startswith(self.workers_prefix):
                self.workers.add(name)
            for step, held in steps.items():
                record = self.steps.get(step)
                if record is None:
                    delta = held.get("delta_size")
                    record = self.steps[step] = StepShipped(
                        full_bytes=int(held["total_size"]), shipped_bytes=int(delta or held["total_size"]),
                        format=held.get("delta_format") or "full")
                completed = held.get("completed_at")
                if not held.get("complete") or completed is None:
                    continue
                if name == self.trainer:
                    record.published_at = completed
                elif name.startswith(self.workers_prefix):
                    record.reached.setdefault(name, completed)

    def to_last_worker_s(self) -> dict[int, float]:
        """Seconds from publish to the last worker, for each step every worker was seen holding."""
        return {step: round(max(r.reached.values()) - r.published_at, 2) for step, r in self.steps.items()
                if r.published_at is not None and self.workers and set(r.reached) >= self.workers}

    def summary(self) -> dict[str, Any]:
        after_first = [r for step, r in sorted(self.steps.items()) if step > min(self.steps, default=0)]
        reach = list(self.to_last_worker_s().values())
        formats: dict[str, int] = {}
        for record in after_first:
            formats[record.format] = formats.get(record.format, 0) + 1
        shipped = statistics.median([r.shipped_bytes for r in after_first]) if after_first else None
        full = after_first[-1].full_bytes if after_first else None
        return {"checkpoint_bytes": full, "shipped_bytes_per_step": shipped,
                "shipped_fraction": round(shipped / full, 5) if shipped and full else None,
                "steps_by_format": formats,
                "step_to_last_worker_s_median": round(statistics.median(reach), 2) if reach else None,
                "step_to_last_worker_s_max": max(reach) if reach else None}

    def line(self) -> str:
        """One dashboard line: what the newest steps shipped and how fast they reached everyone."""
        summary = self.summary()
        if summary["shipped_bytes_per_step"] is None:
            return "-"
        reach = summary["step_to_last_worker_s_median"]
        formats = ", ".join(f"{count} {name}" for name, count in summary["steps_by_format"].items())
        return (f"{summary['shipped_bytes_per_step'] / 1e6:.2f} MB of {summary['checkpoint_bytes'] / 1e6:.0f} MB "
                f"({formats}); to the last worker in {'-' if reach is None else f'{reach:.1f} s'}")


def _held_steps(path: Any) -> dict[int, dict[str, Any]]:
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or replaced while read
        return {}
    steps = status.get("steps") if isinstance(status, dict) else None
    if not isinstance(steps, dict):
        return {}
    held = {}
    for key, value in steps.items():
        if isinstance(value, dict) and key.isdigit() and isinstance(value.get("total_size"), int):
            held[int(key)] = value
    return held
