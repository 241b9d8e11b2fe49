"""The final answer span of a completion, and the first flip in it (specs/sampling.md section 4,
"The answer span").

Why a rule of its own: inside a wide engine pair's slack a forger can replace tokens where the
validator's race put another token only a little ahead, and the flip test counts such flips, not
where they are. Flipped into the tokens a reward reads, they choose the answer (bench/steering.py:
under the loosest calibrated pair a forger made a chosen answer in most groups it tried). A group
whose final answer span holds a flip is therefore set aside (``inconclusive``: neither trained on
nor rewarded, nobody charged), whatever its flip count: a forgery there earns nothing, and an honest
worker whose engines differ loses the groups their noise flips there (about one in nine bf16/fp32
groups on the tiny model, whose completions are almost all span). No softer depth (a span flip let
through when shallow) keeps forgers under 1 in 1,000 groups and gives that back (specs/sampling.md
section 4, measured by bench/steering.py and bench/cross_engine.py).

The span is what the tasks' verifiers read last: the completion's final whitespace-separated word,
the whitespace before it and everything after it (trailing punctuation, the end-of-sequence
token), in tokens: every token from the last one whose prefix text ends at or before that
whitespace. A completion with no word is all span.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

_LAST_WORD = re.compile(r"\s\S*$")  # the whitespace before the final word, and the word


def answer_span_start(tokens: Sequence[int], tokenizer: object) -> int:
    """The first position of the final answer span of ``tokens`` (0: the whole completion)."""
    text = tokenizer.decode(list(tokens), skip_special_tokens=True)
    stripped = text.rstrip()
    if not stripped:
        return 0
    last = _LAST_WORD.search(stripped)
    if last is None:
        return 0
    boundary = last.start()
    # the span's tokens are few: walk back from the end, decoding each shorter prefix once
    for k in range(len(tokens), -1, -1):
        if len(tokenizer.decode(list(tokens[:k]), skip_special_tokens=True)) <= boundary:
            return k
    return 0


def span_flip_depth(tokens: Sequence[int], margins: np.ndarray, tokenizer: object) -> float:
    """How far below the replay's exact choice the deepest token of the final answer span lies
    (``-min(margin)`` over the span, 0 when none is a flip): the least depth a softer rule
    would have to let through for this completion to keep its group (bench/steering.py and
    bench/cross_engine.py measure forgers and honest pairs by it)."""
    span = np.asarray(margins[answer_span_start(tokens, tokenizer):], dtype=np.float64)
    deepest = -float(span.min()) if span.size else 0.0
    return 0.0 if deepest <= 0 else deepest


def answer_span_flip(tokens: Sequence[int], margins: np.ndarray, tokenizer: object, depth: float = 0.0) -> int | None:
    """The first position of the final answer span whose token is more than ``depth`` below the
    replay's exact choice (margin < -depth), or None.

    The validator's rule is ``depth`` 0: no flip at all. A softer depth is what bench/steering.py's
    forgers adapt to when measuring one."""
    start = answer_span_start(tokens, tokenizer)
    flipped = np.nonzero(~(np.asarray(margins[start:]) >= -depth))[0]
    return start + int(flipped[0]) if flipped.size else None
