"""Toy tasks generated from a seed, small enough for a few-M-parameter model on CPU.

Two kinds: ``add`` (two-digit addition, as in the GRPO experiment in design.md) and ``reverse``
(reverse a string of 3 to 6 digits). Both answers are digit strings on purpose: the tiny model's
tokenizer splits digits individually, so no answer depends on how a BPE merged random letters.

The same seed gives the same tasks on every machine (Python's ``random.Random`` is specified to be
reproducible for a given seed), so a swarm can agree on a task set by agreeing on
``(seed, count, kinds)``.

A completion is correct when its last whitespace-separated word equals the answer: the model may
"think" before answering (length targets ask it to), but the final word must be the answer.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from intellect_node.node.tasks.schema import Task

TOY_KINDS = ("add", "reverse")


def toy_example(kind: str, rng: random.Random) -> tuple[str, str]:
    """One (prompt, answer) pair of ``kind`` drawn from ``rng``."""
    if kind == "add":
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"What is {a} + {b}?", str(a + b)
    if kind == "reverse":
        digits = "".join(rng.choice(string.digits) for _ in range(rng.randint(3, 6)))
        return f"Reverse the digits {digits}.", digits[::-1]
    raise ValueError(f"unknown toy task kind {kind!r}; known: {TOY_KINDS}")


def generate_toy_tasks(seed: int, count: int, kinds: Sequence[str] = TOY_KINDS) -> list[Task]:
    """``count`` tasks cycling through ``kinds``; ids name the seed so sets never collide."""
    if count < 0:
        raise ValueError("count must be >= 0")
    rng = random.Random(f"intellect-node/toy/{seed}")
    tasks = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        prompt, answer = toy_example(kind, rng)
        tasks.append(
            Task(
                problem_id=f"toy-{seed}-{i}-{kind}",
                task_type="toy",
                prompt=prompt,
                verification_info={"kind": kind, "answer": answer},
                solve_rate=None,
            )
        )
    return tasks


def verify_toy(completion: str, verification_info: dict[str, str]) -> bool:
    """True when the completion's last word is the expected answer."""
    words = completion.split()
    return bool(words) and words[-1] == verification_info["answer"]
