"""Depth proves by count under a pair at the wire's slack bound (specs/sampling.md section 4, "The
bounds"): honest bf16/fp32 numerics flip a token past any proof bound the wire can state now and then
(bench/HISTORY.md, issue 50: margins -2.17 and -6.37 among 16,000 groups), so under such a pair a
finite margin past the proof bound sets its group aside, and the group is a proven cheat when more of
its completions hold one than the flip test's curve explains (``deep_flip_test``). Under a pair below
the bound, one such token is a proof, as before (tests/test_two_bounds.py, tests/test_cheats.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from intellect_node.node.engine.base import derive_seed
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import RunContext, deep_flip_test
from intellect_node.protocol.assignment import sampling_seed
from intellect_node.protocol.rollouts import RolloutBatch, unpack_tokens
from intellect_node.protocol.run_spec import TORCH_TORCH
from intellect_node.protocol.sampling import FLIP_ALPHA, MAX_SLACK, Replay, TokenReplay, flip_chance
from intellect_node.protocol.verdicts import INCONCLUSIVE, PROOF_FACTOR
from tests.support.judging_world import CHEATER, RUN, SETTINGS, STEP, World, reasons

# the loosest calibrated pair's slack and noise (vLLM bf16 judged by torch), on the exact fp32 engines
CAPPED = dataclasses.replace(TORCH_TORCH, sampling_slack=MAX_SLACK, margin_noise=0.036, logprob_atol=6.55)
PROOF = PROOF_FACTOR * MAX_SLACK


def replay(margins: list[float], gap: float = 5.0) -> TokenReplay:
    return TokenReplay(np.array(margins, dtype=np.float64), np.full(len(margins), gap))


def chance(gap: float) -> float:
    return float(flip_chance(np.array([gap]), CAPPED.margin_noise)[0])


def test_a_deep_token_counts_once_per_prefix_and_only_past_the_proof_bound() -> None:
    """Completions 0 and 1 share the prefix [5, 6] and take the same deep token in it (honest
    precision is a property of the state: both saw the same logits): one; completion 1's next
    token reads it: not counted again; completion 2's token at the bound is not past it."""
    completions = [[5, 6, 7], [5, 6, 7, 9], [5, 7, 9]]
    replays = [replay([0.5, 0.3, -PROOF - 1e-6]), replay([0.5, 0.3, -9.0, -7.0]), replay([0.5, 0.2, -PROOF])]
    test = deep_flip_test(completions, replays, CAPPED)
    assert test.flips == 1
    # ten tokens, every gap (5) past the proof bound (4): the gap rules
    assert test.expected == pytest.approx(10 * chance(5.0)) and chance(5.0) < chance(PROOF)
    assert test.p_value == pytest.approx(test.expected, rel=1e-3)
    assert deep_flip_test([[5]], [replay([0.1])], CAPPED).flips == 0


def test_distinct_prefixes_count_each() -> None:
    """Deep tokens 2 and 3 after the same prefix [1], and 4 in the prompt's state: three."""
    test = deep_flip_test([[1, 2], [1, 3], [4, 2]], [replay([0.1, -5.0]), replay([0.1, -6.0]), replay([-4.5, 0.1])],
                          CAPPED)
    assert test.flips == 3


def test_the_expectation_takes_the_proof_bound_at_near_ties() -> None:
    assert deep_flip_test([[1, 2, 3]], [replay([0.01] * 3, gap=0.01)], CAPPED).expected == pytest.approx(
        3 * chance(PROOF))


def test_one_deep_token_is_honest_chance_and_many_are_a_proof() -> None:
    """A group of 8 completions of 36 tokens: one deep token has the chance the curve gives it
    (about 1e-3), one in each completion (distinct first tokens) far less than FLIP_ALPHA."""
    completions = [[100 * j + k for k in range(36)] for j in range(8)]
    honest = [replay([0.2] * 36)] * 7
    one = deep_flip_test(completions, [replay([0.2] * 35 + [-6.37])] + honest, CAPPED)
    assert one.flips == 1 and FLIP_ALPHA < one.p_value < 1e-2
    every = deep_flip_test(completions, [replay([-5.0] + [0.2] * 35)] * 8, CAPPED)
    assert every.flips == 8 and every.p_value < FLIP_ALPHA


@pytest.fixture(scope="module")
def world() -> World:
    return World()


def deep_forgery(world: World, batch: RolloutBatch, group: int, completions: int) -> RolloutBatch:
    """``batch`` with one token in each of the first ``completions`` completions of ``group`` (the
    last one, not an end-of-sequence token, that has such a replacement) replaced by one the sampler
    ranks more than the proof bound below its choice, each after a prefix of its own (completions
    that share a prefix and a deep token count once); logprobs and proofs remade, so only the replay
    sees the forgery."""
    record = batch.groups[group]
    prompt = unpack_tokens(record.prompt_ids).tolist()
    tokens = [unpack_tokens(c.token_ids).tolist() for c in record.completions]
    eos = set(world.validator.eos_token_ids)
    prefixes: set[tuple[int, ...]] = set()
    for j, completion in enumerate(record.completions[:completions]):
        seed = derive_seed(sampling_seed(RUN, CHEATER.peer_id, STEP, record.counter), j)
        last = len(tokens[j]) - (2 if completion.finish_reason == "stop" else 1)
        chosen = None
        for position in range(last, -1, -1):
            edits = [[*tokens[j][:position], candidate, *tokens[j][position + 1:]]
                     for candidate in range(4, world.validator.vocab_size)
                     if candidate != tokens[j][position] and candidate not in eos]
            replays = [Replay(seed, SETTINGS.temperature, SETTINGS.top_p, MAX_SLACK)] * len(edits)
            results = world.validator.prefill([prompt] * len(edits), edits, replays)
            chosen = next((edit for edit, result in zip(edits, results, strict=True)
                           if result.sampling_margins[position] < -PROOF - 0.5
                           and tuple(edit[:position + 1]) not in prefixes), None)
            if chosen is not None:
                prefixes.add(tuple(chosen[:position + 1]))
                break
        if chosen is None:
            pytest.skip("a completion without a deep edit after a prefix of its own (the tiny model's outputs changed)")
        tokens[j] = chosen
    return world.remake(batch, group, tokens=tokens)


def editable(world: World, completions: int) -> tuple[RolloutBatch, int]:
    """A fresh batch and the index of a group whose first ``completions`` completions each hold a
    token before any end-of-sequence token (a completion may be that token alone)."""
    for _ in range(8):
        batch = world.build(first_counter=world.seen.expected(CHEATER.peer_id, STEP))
        for g, group in enumerate(batch.groups):
            if all(len(unpack_tokens(c.token_ids)) > (1 if c.finish_reason == "stop" else 0)
                   for c in group.completions[:completions]):
                return batch, g
        world.verify(batch)  # its counters judged: the next batch follows them
    pytest.skip("no group with enough completions to edit (the tiny model's outputs changed)")


def test_under_the_capped_pair_one_deep_token_sets_its_group_aside_and_deep_tokens_everywhere_prove(
        world: World) -> None:
    run = RunContext(world.spec(SETTINGS, CAPPED), world.tasks)
    world.seen = JudgeState()
    batch, g = editable(world, SETTINGS.group_size)
    judged = world.seen.expected(CHEATER.peer_id, STEP)
    below = RunContext(world.spec(SETTINGS, dataclasses.replace(CAPPED, sampling_slack=1.9)), world.tasks)
    # one deep token: set aside under the capped pair, a proof on its own under a pair below the bound;
    # one in every completion (each after a prefix of its own): proven under the capped pair too
    for completions, spec, expected in ((1, run, INCONCLUSIVE), (1, below, "sampling"),
                                        (SETTINGS.group_size, run, "sampling")):
        forged = deep_forgery(world, batch, g, completions)
        world.seen = JudgeState()
        world.seen.credit(CHEATER.peer_id, STEP, range(judged))
        verdict = world.verify(forged, run=spec)
        assert reasons(verdict)[g] == expected, verdict.groups[g].detail
    assert "past the proof bound" in verdict.groups[g].detail


def test_a_worker_deep_in_one_prefix_a_group_is_set_aside_then_proven_by_its_history(world: World) -> None:
    """Each group alone holds one deep token (set aside, not proven); summed over the worker's
    groups, the deep tokens pass what the pair's noise explains within a few batches, and from then
    on the worker's groups are refused as ``sampling``."""
    run = RunContext(world.spec(SETTINGS, CAPPED), world.tasks)
    world.seen = JudgeState()
    verdicts = []
    for _ in range(12):
        batch, g = editable(world, 1)
        verdicts.append(world.verify(deep_forgery(world, batch, g, 1), run=run).groups[g])
        if verdicts[-1].reason == "sampling":
            break
    assert verdicts[0].reason == INCONCLUSIVE and "counted" in verdicts[0].detail
    assert verdicts[-1].reason == "sampling" and "this worker's groups hold" in verdicts[-1].detail, verdicts[-1]
    assert {v.reason for v in verdicts[:-1]} == {INCONCLUSIVE} and len(verdicts) >= 2
