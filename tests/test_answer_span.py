"""The answer-span rule's depth logic (node/roles/validator/answer_span.py; specs/sampling.md
section 4, "The answer span"): which tokens are the span, which flips in it count at a given
depth (the validator's rule is depth 0: any flip), and how deep a span's deepest flip is, for
completions with a word before the answer, one token long, and all span. Judged end to end by
tests/test_steering.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from intellect_node.node.models.tiny.build import DEFAULT_RECIPE, build_tokenizer
from intellect_node.node.roles.validator.answer_span import answer_span_flip, answer_span_start, span_flip_depth

DEPTH = 0.1


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(DEFAULT_RECIPE)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def test_a_span_flip_counts_only_past_the_depth(tokenizer) -> None:
    tokens = encode(tokenizer, "12 plus 3 is 15")
    start = answer_span_start(tokens, tokenizer)
    assert 0 < start < len(tokens) - 1
    margins = np.ones(len(tokens))
    margins[start + 1] = -DEPTH  # just inside the bound: let through
    assert answer_span_flip(tokens, margins, tokenizer, DEPTH) is None
    assert answer_span_flip(tokens, margins, tokenizer) == start + 1  # the validator's rule: any flip
    margins[start + 1] = -math.nextafter(DEPTH, 1.0)  # just outside
    assert answer_span_flip(tokens, margins, tokenizer, DEPTH) == start + 1
    assert span_flip_depth(tokens, margins, tokenizer) == pytest.approx(DEPTH)


def test_flips_before_the_span_are_not_its_business(tokenizer) -> None:
    tokens = encode(tokenizer, "12 plus 3 is 15")
    start = answer_span_start(tokens, tokenizer)
    margins = np.ones(len(tokens))
    margins[:start] = -1.5  # deep flips before the span: the flip test's and the slack's business
    assert answer_span_flip(tokens, margins, tokenizer) is None
    assert span_flip_depth(tokens, margins, tokenizer) == 0.0
    margins[-1] = 0.0  # an exact tie is the replay's own choice, not a flip
    assert span_flip_depth(tokens, margins, tokenizer) == 0.0


def test_the_deepest_span_flip_is_reported(tokenizer) -> None:
    tokens = encode(tokenizer, "12 plus 3 is 15")
    start = answer_span_start(tokens, tokenizer)
    margins = np.ones(len(tokens))
    margins[start], margins[-1] = -0.02, -0.3
    assert span_flip_depth(tokens, margins, tokenizer) == pytest.approx(0.3)
    assert answer_span_flip(tokens, margins, tokenizer, 0.05) == len(tokens) - 1  # the first past the depth


@pytest.mark.parametrize("text", ["", "7", "108"])
def test_short_and_wordless_completions_are_all_span(tokenizer, text: str) -> None:
    """An end-of-sequence token alone, one digit, an answer with no word before it: every token,
    the first included, is in the span, at every depth."""
    tokens = encode(tokenizer, text)
    assert answer_span_start(tokens, tokenizer) == 0
    margins = np.ones(len(tokens))
    margins[0] = -0.5
    assert answer_span_flip(tokens, margins, tokenizer) == 0
    assert answer_span_flip(tokens, margins, tokenizer, 0.4) == 0
    assert answer_span_flip(tokens, margins, tokenizer, 0.5) is None
    assert span_flip_depth(tokens, margins, tokenizer) == pytest.approx(0.5)


def test_a_margin_that_is_not_a_number_is_a_flip_at_every_depth(tokenizer) -> None:
    tokens = encode(tokenizer, "108")
    margins = np.array([1.0, float("nan"), 1.0, 1.0])
    assert answer_span_flip(tokens, margins, tokenizer, 2.0) == 1
