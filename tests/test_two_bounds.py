"""Two bounds per figure (specs/validation.md, "Two bounds"): past the engine pair's tolerance but
within PROOF_FACTOR times it, a group is ``inconclusive`` (not credited for training, nobody banned);
past the proof bound it is a proven cheat; a proof in one completion is never hidden behind an
inconclusive figure in another."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from intellect_node.crypto.toploc import ChunkVerdict, Thresholds, rejudge
from intellect_node.node.engine.base import derive_seed
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import RunContext
from intellect_node.protocol.assignment import sampling_seed
from intellect_node.protocol.rollouts import RolloutBatch, pack_logprobs, unpack_tokens
from intellect_node.protocol.run_spec import TORCH_TORCH
from intellect_node.protocol.sampling import Replay
from intellect_node.protocol.verdicts import INCONCLUSIVE, PROOF_FACTOR, PROVEN_CHEATS
from tests.support.judging_world import CHEATER, RUN, SETTINGS, STEP, World, reasons


@pytest.fixture(scope="module")
def world() -> World:
    return World()


def fresh_judge(world: World, batch: RolloutBatch) -> None:
    """Judge ``batch`` afresh: its counters and contents not seen yet."""
    world.seen = JudgeState()
    world.seen.credit(CHEATER.peer_id, STEP, range(batch.groups[0].counter))


def shifted_logprobs(batch: RolloutBatch, shifts: dict[tuple[int, int], float]) -> RolloutBatch:
    """``batch`` with the first claimed logprob of completion (group, j) moved by ``shifts[group, j]``."""
    groups = list(batch.groups)
    for (g, j), shift in shifts.items():
        records = list(groups[g].completions)
        values = np.frombuffer(records[j].logprobs, dtype="<f4").copy()
        values[0] += shift
        records[j] = dataclasses.replace(records[j], logprobs=pack_logprobs(values))
        groups[g] = dataclasses.replace(groups[g], completions=tuple(records))
    return dataclasses.replace(batch, groups=tuple(groups))


def test_a_logprob_past_the_tolerance_within_the_proof_bound_is_inconclusive_not_a_cheat(world: World) -> None:
    atol = TORCH_TORCH.logprob_atol
    batch = world.build()
    fresh_judge(world, batch)
    verdict = world.verify(shifted_logprobs(batch, {(1, 0): 1.5 * atol}))
    assert reasons(verdict) == [None, INCONCLUSIVE, None, None], verdict.groups[1].detail
    assert INCONCLUSIVE not in PROVEN_CHEATS
    assert batch.groups[1].counter in verdict.credited  # judged: the counter is used up, not a gap
    assert "logprob error" in verdict.groups[1].detail and not verdict.groups[1].rewards  # nothing to train on


def test_a_logprob_past_the_proof_bound_is_a_proven_cheat(world: World) -> None:
    batch = world.build()
    fresh_judge(world, batch)
    verdict = world.verify(shifted_logprobs(batch, {(2, 1): (PROOF_FACTOR + 0.5) * TORCH_TORCH.logprob_atol}))
    assert reasons(verdict) == [None, None, "logprobs", None]


def test_a_proof_in_one_completion_is_not_hidden_behind_an_inconclusive_one(world: World) -> None:
    atol = TORCH_TORCH.logprob_atol
    batch = world.build()
    fresh_judge(world, batch)
    verdict = world.verify(shifted_logprobs(batch, {(0, 0): 1.5 * atol, (0, 3): 0.2}))
    assert reasons(verdict)[0] == "logprobs"


def close_runner_up_forgery(world: World, batch: RolloutBatch) -> tuple[RolloutBatch, int, float]:
    """``batch`` with one token of one completion (the last, or the one before an end-of-sequence
    token) replaced by a token the sampler ranks close behind its choice (margin between -1.5 and
    -0.05) that leaves every other token the sampler's exact choice, logprobs and proofs remade:
    a forgery only the sampling replay can see. Returns (forged batch, group, margin)."""
    spec = world.run.spec
    for g, group in enumerate(batch.groups):
        prompt = unpack_tokens(group.prompt_ids).tolist()
        for j, record in enumerate(group.completions):
            tokens = unpack_tokens(record.token_ids).tolist()
            position = len(tokens) - (2 if record.finish_reason == "stop" else 1)
            if position < 0:
                continue
            seed = derive_seed(sampling_seed(RUN, CHEATER.peer_id, STEP, group.counter), j)
            replay = Replay(seed, spec.temperature, spec.top_p, 0.0)
            for candidate in range(4, world.validator.vocab_size):
                edited = [*tokens[:position], candidate, *tokens[position + 1:]]
                if candidate == tokens[position] or candidate in world.validator.eos_token_ids:
                    continue
                [result] = world.validator.prefill([prompt], [edited], [replay])
                margins = np.delete(result.sampling_margins, position)
                margin = float(result.sampling_margins[position])
                if -1.5 < margin < -0.05 and margins.min(initial=0.0) >= 0:
                    completions = [unpack_tokens(c.token_ids).tolist() for c in group.completions]
                    completions[j] = edited
                    return world.remake(batch, g, tokens=completions), g, margin
    pytest.skip("no token with a close runner-up that leaves the rest exact (the tiny model's outputs changed)")


def test_a_token_past_the_slack_within_the_proof_bound_is_inconclusive_and_past_it_a_proven_cheat(
        world: World) -> None:
    batch = world.build()
    forged, g, margin = close_runner_up_forgery(world, batch)
    depth = -margin
    for slack, expected in ((depth / 1.5, INCONCLUSIVE), (depth / (PROOF_FACTOR + 0.5), "sampling")):
        pair = dataclasses.replace(TORCH_TORCH, sampling_slack=slack)
        fresh_judge(world, batch)
        verdict = world.verify(forged, run=RunContext(world.spec(SETTINGS, pair), world.tasks))
        assert reasons(verdict)[g] == expected, (slack, verdict.groups[g].detail)
        assert [r for i, r in enumerate(reasons(verdict)) if i != g] == [None] * (len(batch.groups) - 1)


def test_rejudging_a_chunk_uses_its_measured_figures_and_keeps_an_unmeasured_one_refused() -> None:
    measured = ChunkVerdict(12, 3.0, 2.0, True, "ok")
    assert rejudge(measured, Thresholds(10, 9.0, 9.0)).reason == "exp_mismatch"
    assert rejudge(measured, Thresholds(12, 3.0, 2.0)).ok  # a figure equal to its limit passes
    assert rejudge(measured, Thresholds(40, 2.5, 9.0)).reason == "mantissa_mean"
    malformed = ChunkVerdict(128, float("inf"), float("inf"), False, "malformed_length")
    assert not rejudge(malformed, Thresholds(10**6, 1e9, 1e9)).ok

