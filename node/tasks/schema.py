"""The task record every task set shares (the INTELLECT-2 dataset schema), files and filters.

A task is what a worker is asked to solve and what a validator and the trainer check against:
``problem_id``, ``task_type`` (``toy``, ``math`` or ``code``), ``prompt``, ``verification_info``
(what the verifier of that type needs, e.g. the ground truth) and ``solve_rate`` (the base
model's measured pass rate, or None when unknown). Task files are JSON lines with exactly these
fields; ``verification_info`` may be a JSON object or, as in the published INTELLECT-2 data, a
string holding one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASK_TYPES = ("toy", "math", "code")
_FIELDS = ("problem_id", "task_type", "prompt", "verification_info", "solve_rate")
LENGTH_SUFFIX = "Think for {n} tokens before giving a response."
# Bounds on a task file, read before decoding: a code task with its tests is tens of KB, and
# INTELLECT-2's whole RL set (285k tasks) is a few hundred MB.
MAX_TASK_LINE_BYTES = 16 << 20
MAX_TASK_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class Task:
    """One problem; frozen so that a task list shared between roles cannot drift."""

    problem_id: str
    task_type: str
    prompt: str
    verification_info: dict[str, Any] = field(hash=False)
    solve_rate: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.problem_id, str) or not self.problem_id:
            raise ValueError("problem_id must be a non-empty string")
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"task_type must be one of {TASK_TYPES}, got {self.task_type!r}")
        if not isinstance(self.prompt, str) or not self.prompt:
            raise ValueError(f"{self.problem_id}: prompt must be a non-empty string")
        if not isinstance(self.verification_info, dict):
            raise ValueError(f"{self.problem_id}: verification_info must be an object")
        rate = self.solve_rate
        if rate is not None and (
            isinstance(rate, bool)
            or not isinstance(rate, (int, float))
            or not math.isfinite(rate)
            or not 0.0 <= rate <= 1.0
        ):
            raise ValueError(f"{self.problem_id}: solve_rate must be in [0, 1] or null")

    def to_json(self) -> dict[str, Any]:
        """The JSON-lines record (verification_info kept as an object)."""
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Task:
        """Parse one record; unknown or missing fields are errors, not silently dropped."""
        if not isinstance(record, dict):
            raise ValueError("a task record must be a JSON object")
        missing = [name for name in _FIELDS if name not in record]
        extra = sorted(set(record) - set(_FIELDS))
        if missing or extra:
            raise ValueError(f"task record: missing fields {missing}, unknown fields {extra}")
        info = record["verification_info"]
        if isinstance(info, str):
            info = json.loads(info)
        return cls(
            problem_id=record["problem_id"],
            task_type=record["task_type"],
            prompt=record["prompt"],
            verification_info=info,
            solve_rate=record["solve_rate"],
        )


def load_tasks(path: str | Path) -> list[Task]:
    """Read a JSON-lines task file; duplicate problem ids are refused (they would skew sampling).

    A user's file: its size and each line's length are bounded before anything is decoded (a file
    of one endless line costs ``MAX_TASK_LINE_BYTES``, not the file), and every way a line can be
    wrong (not UTF-8, not JSON, nested past the parser's recursion) is a ValueError naming the line.
    """
    tasks: list[Task] = []
    seen: set[str] = set()
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_TASK_FILE_BYTES:
            raise ValueError(f"{path}: {size:,} bytes, more than a task file's {MAX_TASK_FILE_BYTES:,}")
        for line_no, raw in enumerate(iter(lambda: handle.readline(MAX_TASK_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_TASK_LINE_BYTES:
                raise ValueError(f"{path}:{line_no}: line longer than {MAX_TASK_LINE_BYTES:,} bytes")
            if not raw.strip():
                continue
            try:
                task = Task.from_json(json.loads(raw.decode("utf-8")))
            except (ValueError, TypeError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                raise ValueError(f"{path}:{line_no}: {exc}") from exc
            except RecursionError:
                raise ValueError(f"{path}:{line_no}: JSON nested too deeply") from None
            if task.problem_id in seen:
                raise ValueError(f"{path}:{line_no}: duplicate problem_id {task.problem_id!r}")
            seen.add(task.problem_id)
            tasks.append(task)
    return tasks


def save_tasks(path: str | Path, tasks: Iterable[Task]) -> None:
    """Write a JSON-lines task file, one record per line, keys in schema order."""
    with open(path, "w", encoding="utf-8") as handle:
        for task in tasks:
            handle.write(json.dumps(task.to_json(), ensure_ascii=False) + "\n")


def filter_by_solve_rate(
    tasks: Iterable[Task], low: float = 0.1, high: float = 0.8, keep_unknown: bool = False
) -> list[Task]:
    """Offline filter of INTELLECT-2: keep tasks the base model solves sometimes, not always.

    Tasks solved almost never or almost always give groups with zero advantage, i.e. no
    learning signal; both bounds are inclusive. Tasks with unknown solve rate are dropped
    unless ``keep_unknown``.
    """
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError("need 0 <= low <= high <= 1")
    return [
        t
        for t in tasks
        if (t.solve_rate is None and keep_unknown)
        or (t.solve_rate is not None and low <= t.solve_rate <= high)
    ]


@dataclass(frozen=True)
class TargetedPrompt:
    """A task's prompt with the length instruction appended, and the target it states."""

    task: Task
    prompt: str
    length_target: int


def with_length_target(task: Task, target: int) -> TargetedPrompt:
    """Append "Think for N tokens before giving a response." and record N for the reward.

    In the swarm the target comes from ``intellect_node.protocol.assignment.length_target``, so that a validator
    can recompute which target the prompt had to state.
    """
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise ValueError("length target must be a positive integer")
    prompt = f"{task.prompt.rstrip()} {LENGTH_SUFFIX.format(n=target)}"
    return TargetedPrompt(task=task, prompt=prompt, length_target=target)

