"""node/engine/calibration.py: an engine pair's tolerances measured from honest work.

A bf16 worker judged by an fp32 validator (both the torch engine on this CPU) is refused under
the exact pair's tolerances and accepted under the calibrated ones; the calibrated pair still
refuses a forged token and a model that is not the checkpoint's.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from intellect_node.crypto.identity import Identity
from intellect_node.node.engine.calibration import (
    NOISE_SAFETY,
    UNIT_FALSE_REJECT,
    PairFigures,
    calibrated_pair,
    honest_depth,
    noise_of_flips,
    tail_quantile,
)
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.roles.validator.calibrate import measure_engines
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import RunContext, verify_batch
from intellect_node.node.tasks.toy import generate_toy_tasks
from intellect_node.protocol import codec
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import RolloutBatch, pack_tokens, unpack_tokens
from intellect_node.protocol.run_spec import TORCH_TORCH, build_run_spec
from intellect_node.protocol.sampling import MAX_SLACK, flip_chance
from intellect_node.protocol.verdicts import INCONCLUSIVE
from tests.support.engine_helpers import wide_tiny_model

RUN, MANIFEST = "calibration-run", bytes(range(32))
SETTINGS = RolloutShape(group_size=8, groups_per_batch=8, max_tokens=40)
TASKS = generate_toy_tasks(seed=11, count=400)


def test_the_noise_level_matches_the_flips_it_is_given() -> None:
    gaps = np.abs(np.random.default_rng(0).normal(0, 1, 5000))
    sigma = noise_of_flips(gaps, 50)
    expected = float(flip_chance(gaps, sigma).sum())
    assert expected == pytest.approx(50, rel=1e-3)
    assert noise_of_flips(gaps, 0) == 0.0 and noise_of_flips(gaps, 100) > sigma


def test_a_tail_fit_extrapolates_beyond_the_largest_sample() -> None:
    """Exponential errors: the 1e-8 quantile is ln(1e8) = 18.4, far beyond the largest of 20,000
    (about 10.5); fitted to the 50 largest, two samples of the same law agree."""
    rng = np.random.default_rng(1)
    first, second = rng.exponential(1.0, 20_000), rng.exponential(1.0, 20_000)
    fitted = tail_quantile(first, 1e-8, points=50)
    assert fitted == pytest.approx(math.log(1e8), rel=0.2) and fitted > first.max() * 1.4
    assert abs(fitted - tail_quantile(second, 1e-8, points=50)) < 0.25 * fitted
    assert tail_quantile(first, 1e-8) > first.max()  # the default: few points, still beyond the data
    assert tail_quantile(first, 0.5) == pytest.approx(math.log(2), rel=0.05)  # inside the data: empirical
    assert tail_quantile(np.zeros(0)) == 0.0 and tail_quantile(np.array([0.3])) == 0.3


def test_the_honest_depth_inverts_the_flip_tests_curve() -> None:
    for noise, exceed in ((0.0251, UNIT_FALSE_REJECT), (1e-4, 1e-3), (0.5, 0.25)):
        depth = honest_depth(noise, exceed)
        assert float(flip_chance(np.array([depth]), noise)[0]) == pytest.approx(exceed, rel=1e-6)
    assert honest_depth(0.02, 0.5) == 0.0 and honest_depth(0.0) == 0.0
    assert honest_depth(0.01) == pytest.approx(0.01 * 7071, rel=1e-3)  # the t2 tail: depth ** -2


def test_a_pair_whose_flips_reach_past_the_wire_gets_its_bound() -> None:
    """The CPU bf16/fp32 figures of 2026-12-06 (512 groups per combination): exponential fits to
    the largest figures gave slack 0.689 and logprob tolerance 1.25, where the flip test's own curve
    puts one honest token in 1e8 past 177: both are the wire's bounds."""
    cpu = PairFigures(positions=18_588, flips=66, noise=0.0165, worst_margin=-0.242, max_logprob_error=0.418,
                      max_exp_mismatches=11, max_mant_err_mean=2.63, max_mant_err_median=1.0, depth_tail=0.689)
    pair = calibrated_pair("torch", "torch", cpu)
    assert (pair.sampling_slack, pair.logprob_atol) == (MAX_SLACK, 10.0)
    # a pair whose noise the curve carries no further than the fit keeps the fit's (and never the base's less)
    quiet = dataclasses.replace(cpu, noise=1e-5, depth_tail=0.3, worst_margin=-0.01)
    assert calibrated_pair("torch", "torch", quiet).sampling_slack == pytest.approx(0.3)
    assert honest_depth(NOISE_SAFETY * 1e-5) < 0.3


def test_tail_fits_widen_a_pair_past_safety_times_the_maximum() -> None:
    figures = PairFigures(positions=20_000, flips=80, noise=1e-4, worst_margin=-0.4, max_logprob_error=0.5,
                          max_exp_mismatches=10, max_mant_err_mean=3.0, max_mant_err_median=2.0,
                          depth_tail=1.7, logprob_tail=2.2, exp_mismatches_tail=50.2, mant_err_mean_tail=9.0,
                          mant_err_median_tail=1.0)
    pair = calibrated_pair("torch", "torch", figures)
    assert (pair.sampling_slack, pair.logprob_atol) == (pytest.approx(1.7), pytest.approx(2.2))
    assert (pair.toploc_max_exp_mismatches, pair.toploc_max_mant_err_mean) == (51, pytest.approx(9.0))
    assert pair.toploc_max_mant_err_median == pytest.approx(4.0)  # safety times the maximum is the larger
    assert calibrated_pair("torch", "torch", dataclasses.replace(figures, depth_tail=7.0)).sampling_slack == MAX_SLACK


def test_a_pair_is_never_tighter_than_the_exact_one_and_widens_with_its_figures() -> None:
    quiet = PairFigures(positions=100, flips=0, noise=0.0, worst_margin=0.0, max_logprob_error=1e-6,
                        max_exp_mismatches=0, max_mant_err_mean=0.0, max_mant_err_median=0.0)
    assert dataclasses.replace(calibrated_pair("torch", "torch", quiet)) == TORCH_TORCH
    noisy = dataclasses.replace(quiet, flips=9, noise=0.04, worst_margin=-0.3, max_logprob_error=0.5,
                                max_exp_mismatches=40, max_mant_err_mean=3.0, max_mant_err_median=2.0)
    pair = calibrated_pair("vllm", "torch", noisy)
    assert (pair.worker, pair.validator) == ("vllm", "torch")
    assert pair.margin_noise == pytest.approx(0.06) and 0.45 <= pair.sampling_slack <= MAX_SLACK
    # the flip test's curve at that noise carries the logprob tail past the wire's 10
    assert pair.logprob_atol == 10.0 and pair.toploc_max_exp_mismatches == 80
    assert (pair.toploc_max_mant_err_mean, pair.toploc_max_mant_err_median) == (pytest.approx(6.0), 4.0)


@pytest.fixture(scope="module")
def engines() -> dict[str, TorchEngine]:
    torch.set_num_threads(2)
    model = wide_tiny_model()
    return {"fp32": TorchEngine.from_checkpoint(model),
            "bf16": TorchEngine.from_checkpoint(model, dtype=torch.bfloat16),
            "tokenizer": AutoTokenizer.from_pretrained(model)}


def _batch(engines, engine: str, worker: Identity, first: int) -> RolloutBatch:
    return build_batch(engines[engine], engines["tokenizer"], TASKS, run_id=RUN, worker=worker.peer_id, step=0,
                       manifest_hash=MANIFEST, first_counter=first, settings=SETTINGS).batch


def _judge(engines, batch: RolloutBatch, worker: Identity, pair) -> list[str | None]:
    spec = build_run_spec(run_id=RUN, authority="authority", tasks=TASKS, settings=SETTINGS, async_window=2,
                          engines=(pair,))
    signed = codec.decode(codec.encode(batch, worker, lifetime_s=600), RolloutBatch)
    verdict = verify_batch(signed, engine=engines["fp32"], tokenizer=engines["tokenizer"], run=RunContext(spec, TASKS),
                           checkpoint_step_of=lambda h: 0 if h == MANIFEST else None, newest_step=0,
                           state=JudgeState())
    return [g.reason for g in verdict.groups]


def test_a_bf16_worker_judged_in_fp32_passes_under_its_calibrated_pair_and_forgeries_do_not(engines) -> None:
    figures = measure_engines(engines["bf16"], engines["fp32"], engines["tokenizer"], TASKS, SETTINGS, 48)
    assert figures.positions > 48 * 8 and figures.max_logprob_error > TORCH_TORCH.logprob_atol
    pair = calibrated_pair("torch", "torch", figures)

    worker = Identity.generate()  # fresh work: another worker's counter 0 (a judge wants dense counters)
    fresh = _batch(engines, "bf16", worker, 0)
    assert any(_judge(engines, fresh, worker, TORCH_TORCH))  # the exact pair refuses honest bf16 work
    # none refused; a group whose precision noise flips a token of its final answer is set aside,
    # neither rewarded nor charged (specs/sampling.md section 4, "The answer span"): on this model
    # about one honest bf16 group in six when judged in fp32 (bench/HISTORY.md, steering forgers)
    judged = _judge(engines, fresh, worker, pair)
    assert set(judged) <= {None, INCONCLUSIVE} and judged.count(None) * 2 >= len(judged), judged

    group = fresh.groups[0]
    tokens = unpack_tokens(group.completions[0].token_ids).tolist()
    tokens[len(tokens) // 2] = (tokens[len(tokens) // 2] + 7) % (engines["fp32"].vocab_size - 4) + 4
    forged = dataclasses.replace(group.completions[0], token_ids=pack_tokens(tokens))
    batch = dataclasses.replace(fresh, groups=(dataclasses.replace(group, completions=(forged, *group.completions[1:])),
                                               *fresh.groups[1:]))
    assert _judge(engines, batch, worker, pair)[0] in {"sampling", "toploc", "logprobs"}


def test_the_calibrate_command_prints_a_pair_and_refuses_unknown_engines(engines) -> None:
    from typer.testing import CliRunner

    from intellect_node.cli.main import app

    model = str(wide_tiny_model())
    result = CliRunner().invoke(app, ["calibrate", "--model", model, "--groups", "8", "--max-tokens", "24",
                                      "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["figures"]["positions"] > 0
    assert report["engine_pair"]["worker"] == "torch" and report["engine_pair"]["sampling_slack"] >= 1e-3
    refused = CliRunner().invoke(app, ["calibrate", "--model", model, "--worker", "torch:int3"])
    assert refused.exit_code == 2 and "torch:int3" in refused.stderr
