"""``--tasks`` specifications: ``toy:seed=S,count=N[,kinds=add+reverse]`` or a task file path.

Every role of a run must load the same list in the same order, since assignment indexes into it.
"""

from __future__ import annotations

from pathlib import Path

from intellect_node.node.tasks.schema import Task, load_tasks
from intellect_node.node.tasks.toy import TOY_KINDS, generate_toy_tasks


class TaskSpecError(ValueError):
    pass


def load_task_spec(spec: str) -> list[Task]:
    if spec.startswith("toy:") or spec == "toy":
        options: dict[str, str] = {}
        for part in filter(None, spec.removeprefix("toy").removeprefix(":").split(",")):
            key, sep, value = part.partition("=")
            if not sep or key not in ("seed", "count", "kinds"):
                raise TaskSpecError(f"bad toy task option {part!r}; use seed=S,count=N,kinds=add+reverse")
            options[key] = value
        try:
            seed, count = int(options.get("seed", "0")), int(options.get("count", "1000"))
        except ValueError:
            raise TaskSpecError(f"seed and count must be integers in {spec!r}") from None
        kinds = tuple(options["kinds"].split("+")) if "kinds" in options else TOY_KINDS
        if count < 1 or any(kind not in TOY_KINDS for kind in kinds):
            raise TaskSpecError(f"count must be >= 1 and kinds among {TOY_KINDS} in {spec!r}")
        return generate_toy_tasks(seed, count, kinds)
    path = Path(spec)
    if not path.exists():
        raise TaskSpecError(f"no task file at {path} (or use toy:seed=S,count=N)")
    tasks = load_tasks(path)
    if not tasks:
        raise TaskSpecError(f"{path} holds no tasks")
    return tasks
