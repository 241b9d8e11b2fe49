"""Steering forgers under the loosest calibrated engine pair (slack 2.0, logprob 6.55, margin noise
0.036: vLLM bf16 judged by torch, applied here through a ``[[run.engines]]`` table): a worker that
generates honestly and then flips the tokens of its final answer within the slack, re-proven with
the real proof builder, is never accepted: its groups are set aside for the flip in the answer
span; honest groups pass the same pair (specs/sampling.md section 4, "The answer span";
bench/steering.py measures the rates).
"""

from __future__ import annotations

import re

import pytest

from intellect_node.node.roles.validator.answer_span import answer_span_flip, answer_span_start
from intellect_node.node.roles.validator.validation import RunContext
from intellect_node.protocol.rollouts import unpack_tokens
from intellect_node.protocol.verdicts import INCONCLUSIVE
from tests.support.judging_world import CHEATER, SETTINGS, World, reasons
from tests.support.steering import SteeringForger, final_word, loosest_pair

CHOSEN = "7"  # an answer of the forger's choosing: no toy task of the tiny model's kinds has it


@pytest.fixture(scope="module")
def world() -> World:
    world = World()
    world.run = RunContext(world.spec(SETTINGS, loosest_pair()), world.tasks)
    return world


def forger(world: World, **options) -> SteeringForger:
    return SteeringForger(world.worker, world.tokenizer, world.run.spec, loosest_pair(), CHEATER.peer_id, **options)


def test_honest_groups_pass_the_loosest_pair(world: World) -> None:
    assert reasons(world.verify(world.build())) == [None] * SETTINGS.groups_per_batch


def test_the_answer_span_is_the_final_word_and_what_follows(world: World) -> None:
    tokenizer, eos = world.tokenizer, world.validator.eos_token_ids[0]
    words = tokenizer.encode("12 plus 3 is 15", add_special_tokens=False)
    start = answer_span_start(words + [eos], tokenizer)
    assert tokenizer.decode(words[start:]).strip() == "15" and tokenizer.decode(words[:start]).endswith("is")
    assert answer_span_start(tokenizer.encode("15", add_special_tokens=False) + [eos], tokenizer) == 0
    margins = [0.0] * (len(words) + 1)
    margins[start - 1] = -0.5  # a flip before the span: the flip test's business, not this rule's
    assert answer_span_flip(words + [eos], margins, tokenizer) is None
    margins[-1] = -0.01  # the end of the completion is part of the answer
    assert answer_span_flip(words + [eos], margins, tokenizer) == len(words)


def test_a_forger_steering_its_answers_within_the_slack_is_never_accepted(world: World) -> None:
    """A forger of the rules before the answer span: it flips its answer's tokens (and an early
    end) in wherever each stays within the slack and the group's flip count within its bound: the
    groups it steered are set aside for the flip in the answer span, never accepted."""
    naive = forger(world, strategy="answer", knows_span_rule=False)
    steered = 0
    for _ in range(3):
        batch, report = naive.steer(world.build(), lambda task_id: CHOSEN)
        verdict = world.verify(batch)
        for summary, group, result in zip(report, batch.groups, verdict.groups, strict=True):
            if not summary.forged:
                continue
            steered += 1
            ends = [final_word(world.tokenizer.decode(unpack_tokens(c.token_ids).tolist(), skip_special_tokens=True))
                    for c in group.completions]
            assert CHOSEN in ends  # the forgery reached its answer ...
            # ... and earns nothing: set aside by the answer-span rule, which every other check let through
            assert result.reason == INCONCLUSIVE and "final answer span" in result.detail, result
        if steered >= 2:
            break
    assert steered >= 2




def test_a_forger_adapted_to_a_softer_rule_flips_its_answers_no_deeper(world: World) -> None:
    """A forger measuring a softer rule (bench/steering.py --span-depth) steers only with answer-span
    flips at most that deep. Its groups report the least depth that steers them (``depth_needed``):
    a forger allowed exactly the batch's least one steers a group, which the validator's rule sets
    aside for a flip no deeper; allowed a little less, or none (the validator's rule), it steers
    nothing (an answer written in without a flip is the honest completion itself)."""
    honest, choose = world.build(), lambda task_id: CHOSEN
    reach = forger(world, strategy="answer", span_depth=loosest_pair().sampling_slack).steer(honest, choose)[1]
    needed = min(summary.depth_needed for summary in reach)
    assert 0 < needed <= loosest_pair().sampling_slack
    batch, report = forger(world, strategy="answer", span_depth=needed).steer(honest, choose)
    steered = [(summary, result) for summary, result in zip(report, world.verify(batch).groups, strict=True)
               if summary.forged]
    assert steered
    for summary, result in steered:
        assert summary.depth_needed == needed  # the least of the batch, and steered at it
        assert result.reason == INCONCLUSIVE and "final answer span" in result.detail, result
        margin = float(re.search(r"\(margin (\S+)\)", result.detail).group(1))
        assert -needed - 1e-3 <= margin < 0
    for shallower in (needed * 0.999, 0.0):
        report = forger(world, strategy="answer", span_depth=shallower).steer(honest, choose)[1]
        assert not any(summary.forged for summary in report)
