"""The FSDP2-sharded GRPO step (node/roles/trainer/sharded.py) against the one-process learner.

Real torch.distributed: 2 processes on the gloo backend over 127.0.0.1, spawned per test.

Tolerance: ``ATOL`` = 1e-5 on weights that one step moves by ~1.5e-2 (lr 1e-2). Both sides
compute in fp32 and differ only in the order of additions (each rank sums its own rows, then the
reduce-scatter adds the ranks): a few ulps per gradient element. AdamW divides each element by
its own gradient size, so where a gradient is near zero the rounding noise decides the update:
the k-projection biases have a mathematically zero gradient (softmax ignores a shift shared by
all keys), and there the two sides differ most, measured 1.5e-6 (every other tensor <= 9e-7).
A wrong split moves weights by the size of an update, 1000x the tolerance. The grad norm is
compared too (rel 1e-5): AdamW is blind to a uniform gradient scale (m / sqrt(v)), so a split
that forgets FSDP's averaging (gradients halved) would leave the weights almost equal; the norm
catches it, and ``test_the_comparison_catches_fsdp_default_averaging`` proves that it does.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule

from intellect_node.node.roles.trainer import ranks
from intellect_node.node.roles.trainer.config import LossConfig, OptimConfig, RewardConfig
from intellect_node.node.roles.trainer.groups import TrainingGroup
from intellect_node.node.roles.trainer.learner import GRPOLearner
from intellect_node.node.roles.trainer.sharded import ShardedLearner
from intellect_node.node.roles.trainer.state import load_state, save_state
from tests.support.grpo_groups import make_groups, small_model

ATOL = 1e-5
NORM_RTOL = 1e-5
# 11 rows in micro-batches of 2, two optimizer steps: mini-batches of 6 and 5 rows, so one rank
# gets 3 rows (2 micro-batches) and the other 2 (1 + a placeholder) in the second
OPTIM = OptimConfig(lr=1e-2, warmup_steps=2, micro_batch_rows=2, optimizer_steps=2)
WORLD = 2


def step_groups(seed: int) -> list[TrainingGroup]:
    """Three groups: one of 4 rows, one of 3 (odd row counts), one adopted without behavior
    logprobs (the old policy recomputed for it: a forward every rank must run)."""
    full, odd, adopted = make_groups(3, seed=seed)
    odd = dataclasses.replace(odd, completions=odd.completions[:3], task_rewards=(1.0, 0.0, 0.0),
                              logprobs=odd.logprobs[:3])
    return [full, odd, dataclasses.replace(adopted, logprobs=())]


# ---- the processes ---------------------------------------------------------------------------

def _step_job(mesh: DeviceMesh, directory: Path) -> None:
    """One step with the correct split, then one with FSDP's default averaging put back."""
    for name, divide in (("summed", 1.0), ("averaged", float(mesh.size()))):
        learner = ShardedLearner(small_model(), 0, mesh, optim=OPTIM)
        for module in learner.scorer.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(divide)
        metrics = learner.step(step_groups(0))
        weights = learner.weights()
        if mesh.get_local_rank() == 0:
            torch.save({"metrics": metrics, "weights": weights}, directory / f"{name}.pt")


def _resume_job(mesh: DeviceMesh, directory: Path) -> None:
    """Two steps, a save, the third step; and the third step from the parent's 1-process save."""
    rank0 = mesh.get_local_rank() == 0
    learner = ShardedLearner(small_model(), 0, mesh, optim=OPTIM)
    for seed in range(2):
        learner.step(step_groups(seed))
    state = learner.state_dict()
    if rank0:
        save_state(directory / "saved-by-2", {"learner": state})
    learner.step(step_groups(2))
    continued = learner.weights()
    resumed = ShardedLearner(small_model(seed=5), 0, mesh, optim=OPTIM)
    resumed.load_state_dict(load_state(directory / "saved-by-1")["learner"] if rank0 else None)
    resumed.step(step_groups(2))
    weights = resumed.weights()
    if rank0:
        torch.save({"continued": continued, "resumed": weights, "updates": resumed.updates},
                   directory / "resume.pt")


def _lead_job(mesh: DeviceMesh, directory: Path) -> None:
    """The node's path: rank 0 leads through ``make_learner``, rank 1 only follows (its model is
    built from the config and gets rank 0's weights)."""
    if mesh.get_local_rank() != 0:
        ranks.follow()
        return
    learner = ranks.make_learner(small_model(), 0, optim=OPTIM, loss=LossConfig(), rewards=RewardConfig(),
                                 reference=None, seed=0)
    metrics = learner.step(step_groups(0))
    weights, state = learner.weights(), learner.state_dict()
    ranks.release()
    torch.save({"metrics": metrics, "weights": weights, "state_weights": state["model"]}, directory / "lead.pt")


JOBS = {"step": _step_job, "resume": _resume_job, "lead": _lead_job}


def _process(rank: int, world: int, port: int, job: str, directory: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        JOBS[job](init_device_mesh("cpu", (world,)), Path(directory))
    finally:
        dist.destroy_process_group()
    # The job's results are on disk. Interpreter teardown can still destroy one of gloo's C++
    # threads while it is joinable ("terminate called without an active exception": SIGABRT in
    # about 1 run of 3 here, after the job had finished), which the comparisons do not judge.
    os._exit(0)


def run_processes(job: str, directory: Path, world: int = WORLD) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_process, args=(world, port, job, str(directory)), nprocs=world, join=True)


# ---- comparisons -----------------------------------------------------------------------------

def weight_mismatches(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> list[str]:
    assert expected.keys() == got.keys()
    return [f"{name}: max |diff| {float((expected[name] - got[name]).abs().max()):.2e}"
            for name in expected if not torch.allclose(expected[name], got[name], rtol=0, atol=ATOL)]


def step_mismatches(expected_weights: dict[str, torch.Tensor], expected: dict[str, float],
                    got: dict[str, Any]) -> list[str]:
    problems = weight_mismatches(expected_weights, got["weights"])
    if got["metrics"]["grad_norm"] != pytest.approx(expected["grad_norm"], rel=NORM_RTOL):
        problems.append(f"grad_norm {got['metrics']['grad_norm']} != {expected['grad_norm']}")
    for key in ("loss", "tokens", "rows", "clip_fraction", "ratio_mean", "entropy", "lr"):
        if got["metrics"][key] != pytest.approx(expected[key], rel=1e-5, abs=1e-7):
            problems.append(f"{key} {got['metrics'][key]} != {expected[key]}")
    return problems


@pytest.fixture(scope="module")
def step_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], dict[str, float], Path]:
    """The 1-process step and the 2-process runs of ``_step_job``, shared by two tests."""
    directory = tmp_path_factory.mktemp("fsdp-step")
    reference = GRPOLearner(small_model(), 0, optim=OPTIM)
    metrics = reference.step(step_groups(0))
    run_processes("step", directory)
    return reference.weights(), metrics, directory


def test_two_process_step_equals_one_process(step_run) -> None:
    weights, metrics, directory = step_run
    initial = small_model().state_dict()
    moved = max(float((weights[k] - initial[k]).abs().max()) for k in weights)
    assert moved > 1e3 * ATOL  # the step moved the weights by 1.5e-2, far beyond the tolerance
    assert step_mismatches(weights, metrics, torch.load(directory / "summed.pt")) == []


def test_the_comparison_catches_fsdp_default_averaging(step_run) -> None:
    """Without the divide-factor correction the gradient is halved: the comparison must say so."""
    weights, metrics, directory = step_run
    averaged = torch.load(directory / "averaged.pt")
    assert averaged["metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"] / WORLD, rel=NORM_RTOL)
    assert any(p.startswith("grad_norm") for p in step_mismatches(weights, metrics, averaged))


@pytest.mark.slow  # about 20 s: two spawned processes
def test_the_lead_drives_its_followers(step_run, tmp_path: Path) -> None:
    weights, metrics, _ = step_run
    run_processes("lead", tmp_path)
    ran = torch.load(tmp_path / "lead.pt")
    assert step_mismatches(weights, metrics, ran) == []
    assert weight_mismatches(weights, ran["state_weights"]) == []


@pytest.mark.slow  # 24 s on a busy 2-core machine: two spawned processes run 6 steps
def test_resume_with_a_different_process_count(tmp_path: Path) -> None:
    """Saved by 2 processes, resumed by 1 (and saved by 1, resumed by 2): the same third step."""
    plain = GRPOLearner(small_model(), 0, optim=OPTIM)
    for seed in range(2):
        plain.step(step_groups(seed))
    (tmp_path / "saved-by-1").mkdir()
    (tmp_path / "saved-by-2").mkdir()
    save_state(tmp_path / "saved-by-1", {"learner": plain.state_dict()})
    run_processes("resume", tmp_path)
    plain.step(step_groups(2))
    ran = torch.load(tmp_path / "resume.pt")
    assert ran["updates"] == 3
    one_from_two = GRPOLearner(small_model(seed=5), 0, optim=OPTIM)
    one_from_two.load_state_dict(load_state(tmp_path / "saved-by-2")["learner"])
    one_from_two.step(step_groups(2))
    assert weight_mismatches(ran["continued"], one_from_two.weights()) == []
    assert weight_mismatches(plain.weights(), ran["resumed"]) == []
    assert weight_mismatches(plain.weights(), ran["continued"]) == []
