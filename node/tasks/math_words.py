"""Math word problems with known answers, generated from a seed, for ``math:seed=S,count=N``.

No math data set ships offline in a package we can depend on, so problems are built from templates
whose answer is computed alongside the text (exact, with ``fractions.Fraction``). They are
grade-school style, several steps each, and ask for the answer in ``\\boxed{}`` the way INTELLECT-2's
prompts do; ``ground_truth`` is LaTeX that math-verify parses (an integer or ``\\frac{p}{q}``).

As with the toy tasks, ``random.Random`` seeded with a string is reproducible on every machine, so
a swarm agrees on a task set by agreeing on ``(seed, count)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

from intellect_node.node.tasks.schema import Task

_NAMES = ("Ada", "Bela", "Chen", "Dina", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun")
_INSTRUCTION = "Solve the problem step by step and put the final answer in \\boxed{{}}.\n\n{problem}"


def latex(value: Fraction | int) -> str:
    """An exact answer as math-verify reads it: ``7``, ``-3`` or ``\\frac{5}{4}``."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _bakery(rng: random.Random) -> tuple[str, Fraction]:
    trays, per_tray = rng.randint(3, 12), rng.randint(6, 24)
    sold, eaten = rng.randint(1, trays * per_tray // 2), rng.randint(1, 5)
    text = (f"A bakery makes {trays} trays of muffins with {per_tray} muffins on each tray. It sells "
            f"{sold} muffins in the morning and the staff eat {eaten}. How many muffins are left?")
    return text, Fraction(trays * per_tray - sold - eaten)


def _travel(rng: random.Random) -> tuple[str, Fraction]:
    name = rng.choice(_NAMES)
    speed_1, hours_1 = rng.randint(30, 90), rng.randint(1, 4)
    speed_2, minutes = rng.randint(20, 80), rng.choice((15, 30, 45, 90))
    text = (f"{name} drives at {speed_1} km/h for {hours_1} hours, then at {speed_2} km/h for "
            f"{minutes} minutes. How many kilometres does {name} drive in total?")
    return text, Fraction(speed_1 * hours_1) + Fraction(speed_2 * minutes, 60)


def _recipe(rng: random.Random) -> tuple[str, Fraction]:
    numerator, denominator = rng.randint(1, 5), rng.choice((2, 3, 4, 8))
    batches = rng.randint(2, 9)
    text = (f"A recipe needs {numerator}/{denominator} of a cup of sugar per batch. How many cups of "
            f"sugar are needed for {batches} batches? Give an exact fraction or integer.")
    return text, Fraction(numerator, denominator) * batches


def _equation(rng: random.Random) -> tuple[str, Fraction]:
    x, a = rng.randint(-20, 20), rng.randint(2, 12)
    b = rng.randint(-50, 50)
    text = f"Find x if {a}x {'+' if b >= 0 else '-'} {abs(b)} = {a * x + b}."
    return text, Fraction(x)


def _discount(rng: random.Random) -> tuple[str, Fraction]:
    price, percent, count = rng.randint(4, 60) * 5, rng.choice((10, 20, 25, 40, 50)), rng.randint(2, 6)
    text = (f"A jacket costs {price} dollars. During a sale every jacket is {percent}% off. How many "
            f"dollars do {count} jackets cost during the sale?")
    return text, Fraction(price * count * (100 - percent), 100)


def _shares(rng: random.Random) -> tuple[str, Fraction]:
    first, second = rng.sample(_NAMES, 2)
    parts_a, parts_b = rng.sample(range(1, 7), 2)
    unit = rng.randint(2, 15)
    total = (parts_a + parts_b) * unit
    text = (f"{first} and {second} share {total} stickers in the ratio {parts_a}:{parts_b}. "
            f"How many more stickers does the one with the larger share get than the other?")
    return text, Fraction(abs(parts_a - parts_b) * unit)


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, Fraction]]] = {
    "bakery": _bakery,
    "travel": _travel,
    "recipe": _recipe,
    "equation": _equation,
    "discount": _discount,
    "shares": _shares,
}


def generate_math_tasks(seed: int, count: int) -> list[Task]:
    """``count`` word problems cycling through the templates; ids name the seed."""
    if count < 0:
        raise ValueError("count must be >= 0")
    rng = random.Random(f"intellect-node/math/{seed}")
    kinds = tuple(TEMPLATES)
    tasks = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        problem, answer = TEMPLATES[kind](rng)
        tasks.append(Task(
            problem_id=f"math-{seed}-{i}-{kind}",
            task_type="math",
            prompt=_INSTRUCTION.format(problem=problem),
            verification_info={"ground_truth": latex(answer)},
            solve_rate=None,
        ))
    return tasks
