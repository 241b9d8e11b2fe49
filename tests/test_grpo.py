"""The GRPO objective, rewards and one learner step, against hand-computed values."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from intellect_node.node.roles.trainer.config import LossConfig, OptimConfig, RewardConfig
from intellect_node.node.roles.trainer.learner import GRPOLearner, _pack, _Row, token_logprobs
from intellect_node.node.roles.trainer.loss import grpo_loss
from intellect_node.node.roles.trainer.rewards import group_advantages, length_reward, total_rewards
from intellect_node.node.roles.trainer.state import load_state, save_state
from intellect_node.node.tasks.verify import teaches_nothing
from tests.support.grpo_groups import make_groups, small_model, token_scores

CFG = LossConfig()  # eps 0.2, delta 4


def one_token(ratio: float, advantage: float, config: LossConfig = CFG):
    """Loss and d(loss)/d(logprob) for a single token with the given ratio and advantage."""
    logprob = torch.tensor([[math.log(ratio)]], requires_grad=True)
    terms = grpo_loss(logprob, torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1), 1.0, config)
    terms.loss.backward()
    return float(terms.loss.detach()), float(logprob.grad), terms.clipped_tokens


@pytest.mark.parametrize(("ratio", "advantage", "loss", "grad", "clipped"), [
    (1.0, 1.0, -1.0, -1.0, 0),      # on-policy: -r * A, gradient -r * A
    (1.5, 1.0, -1.2, 0.0, 1),       # A > 0, ratio above 1 + eps: clipped, no gradient
    (0.5, 1.0, -0.5, -0.5, 0),      # A > 0, ratio below 1 - eps: the unclipped term is the min
    (1.5, -1.0, 1.5, 1.5, 0),       # A < 0, ratio above 1 + eps but under delta: gradient flows
    (0.5, -1.0, 0.8, 0.0, 1),       # A < 0, ratio below 1 - eps: clipped
    (5.0, -1.0, 4.0, 0.0, 1),       # A < 0, ratio above delta: capped at delta * A, no gradient
    (100.0, -2.0, 8.0, 0.0, 1),     # the cap bounds the loss whatever the ratio
    (5.0, 1.0, -1.2, 0.0, 1),       # A > 0: the eps clip already bounds it
])
def test_each_clipping_regime(ratio, advantage, loss, grad, clipped) -> None:
    got_loss, got_grad, got_clipped = one_token(ratio, advantage)
    assert got_loss == pytest.approx(loss, abs=1e-6)
    assert got_grad == pytest.approx(grad, abs=1e-6)
    assert got_clipped == clipped


def test_without_the_delta_cap_a_negative_advantage_is_unbounded() -> None:
    """What delta protects against: with a huge cap, ratio 100 and A = -2 cost 200."""
    loss, grad, _ = one_token(100.0, -2.0, LossConfig(ratio_cap=1e9))
    assert loss == pytest.approx(200.0, rel=1e-5) and grad == pytest.approx(200.0, rel=1e-5)


def test_normalizer_and_mask() -> None:
    logprobs = torch.zeros(2, 3)  # ratio 1 everywhere: per-token loss = -A
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    advantages = torch.tensor([1.0, -2.0])
    # token normalization: (-1 - 1 + 2) / 3 tokens
    assert float(grpo_loss(logprobs, logprobs, advantages, mask, 3.0, CFG).loss) == pytest.approx(0.0)
    advantages = torch.tensor([3.0, 0.0])
    assert float(grpo_loss(logprobs, logprobs, advantages, mask, 3.0, CFG).loss) == pytest.approx(-2.0)
    # constant normalization: the same sum over rows * max_tokens (2 * 3)
    assert float(grpo_loss(logprobs, logprobs, advantages, mask, 6.0, CFG).loss) == pytest.approx(-1.0)


def test_entropy_bonus_and_kl_terms() -> None:
    logprobs = torch.full((1, 1), math.log(0.5))
    ref = torch.full((1, 1), math.log(0.25))
    config = LossConfig(entropy_coef=0.1, kl_coef=0.5)
    terms = grpo_loss(logprobs, logprobs, torch.tensor([0.0]), torch.ones(1, 1), 1.0, config,
                      entropy=torch.full((1, 1), 2.0), ref_logprobs=ref)
    kl = 0.5 - math.log(0.5) - 1  # k3 with ref/pi = 0.5
    assert terms.kl_sum == pytest.approx(kl, abs=1e-6)
    assert float(terms.loss) == pytest.approx(0.5 * kl - 0.1 * 2.0, abs=1e-6)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="normalization"):
        LossConfig(normalization="sequence")
    with pytest.raises(ValueError, match="delta"):
        LossConfig(ratio_cap=1.1)
    with pytest.raises(ValueError, match="form"):
        RewardConfig(length_form="square")


def test_length_reward_forms() -> None:
    absolute = RewardConfig()
    assert length_reward(10, 64, absolute) == pytest.approx(-0.0003 * 54)
    assert length_reward(70, 64, absolute) == pytest.approx(-0.0003 * 6)
    assert length_reward(10, None, absolute) == 0.0
    over = RewardConfig(length_coef=0.01, length_form="over")
    assert length_reward(10, 64, over) == 0.0 and length_reward(70, 64, over) == pytest.approx(-0.06)
    assert length_reward(70, 64, RewardConfig(length_form="none")) == 0.0
    assert total_rewards([1.0, 0.0], [4, 8], 4, absolute).tolist() == pytest.approx([1.0, -0.0012])


def test_group_advantages_and_the_online_filter() -> None:
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 0.0]))
    std = math.sqrt(0.1875)
    assert adv.tolist() == pytest.approx([0.75 / (std + 1e-6)] + [-0.25 / (std + 1e-6)] * 3)
    assert group_advantages(np.array([0.5, 0.5])).tolist() == [0.0, 0.0]
    assert teaches_nothing([1.0, 1.0, 1.0]) and teaches_nothing([0.0, 0.0])
    assert not teaches_nothing([0.0, 1.0, 0.0])


# ---- the learner on a small random model -------------------------------------------------------

def sequence_logprob(model, prompt, completion) -> float:
    return sum(token_scores(model, prompt, completion))


def test_a_step_raises_rewarded_completions_and_lowers_the_rest() -> None:
    model = small_model()
    learner = GRPOLearner(model, pad_id=0, optim=OptimConfig(lr=1e-2, warmup_steps=0))
    groups = make_groups(4)
    before = [[sequence_logprob(model, g.prompt, c) for c in g.completions] for g in groups]
    for _ in range(3):
        metrics = learner.step(groups)
    after = [[sequence_logprob(model, g.prompt, c) for c in g.completions] for g in groups]
    for b, a in zip(before, after, strict=True):
        assert a[0] > b[0] and a[3] > b[3]  # reward 1
        assert a[1] < b[1] and a[2] < b[2]  # reward 0
    assert learner.updates == 3
    assert metrics["task_reward"] == pytest.approx(0.5)
    assert metrics["tokens"] == sum(len(c) for g in groups for c in g.completions)
    assert 0.0 <= metrics["clip_fraction"] <= 1.0 and metrics["entropy"] > 0


def test_groups_adopted_without_logprobs_train_every_row_like_recomputed_ones() -> None:
    """An adopted verdict's group has no behavior logprobs: the learner recomputes them with the
    current weights, so its step equals a step whose logprobs are those same weights' (and every
    row is trained: none dropped for lack of logprobs)."""
    adopted = [dataclasses.replace(g, logprobs=()) for g in make_groups(3)]
    results = []
    for groups in (adopted, make_groups(3)):  # make_groups' logprobs are small_model()'s
        model = small_model()
        metrics = GRPOLearner(model, pad_id=0, optim=OptimConfig(lr=1e-2, warmup_steps=0)).step(groups)
        assert metrics["rows"] == 12 and metrics["tokens"] == sum(len(c) for g in groups for c in g.completions)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(results[0], results[1], atol=1e-5)


@pytest.mark.parametrize("normalization", ["token", "constant"])
def test_micro_batches_add_up_to_the_whole_batch(normalization: str) -> None:
    """Gradient accumulation: 2-row micro-batches give the same update as one 64-row batch."""
    results = []
    for rows in (64, 2):
        model = small_model()
        learner = GRPOLearner(model, pad_id=0, optim=OptimConfig(lr=1e-2, warmup_steps=0, micro_batch_rows=rows),
                              loss=LossConfig(normalization=normalization))
        learner.step(make_groups(3))
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(results[0], results[1], atol=1e-5)


def test_several_optimizer_steps_per_rollout_step_and_warmup() -> None:
    model = small_model()
    learner = GRPOLearner(model, pad_id=0, optim=OptimConfig(lr=1e-3, warmup_steps=4, micro_batch_rows=4,
                                                             optimizer_steps=2))
    metrics = learner.step(make_groups(2))  # 8 rows: 2 micro-batches, one optimizer step each
    assert learner.scheduler.last_epoch == 2 and metrics["lr"] == pytest.approx(1e-3 * 3 / 4)
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-9)  # the second mini-batch saw moved weights


def test_cosine_decay_after_warmup_then_constant_and_resumed_with_the_state(tmp_path) -> None:
    config = OptimConfig(lr=1e-3, warmup_steps=2, decay_steps=4, final_lr_fraction=0.1)
    assert [config.lr_factor(n) for n in range(2)] == [0.5, 1.0]  # warm-up
    assert config.lr_factor(2) == pytest.approx(1.0) and config.lr_factor(4) == pytest.approx(0.55)
    assert config.lr_factor(6) == pytest.approx(0.1) and config.lr_factor(1000) == pytest.approx(0.1)
    assert all(config.lr_factor(n) > config.lr_factor(n + 1) for n in range(2, 6))
    assert OptimConfig(warmup_steps=0).lr_factor(10_000) == 1.0  # no decay unless asked
    learner = GRPOLearner(small_model(), pad_id=0, optim=config)
    lrs = [learner.step(make_groups(1))["lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-3 * config.lr_factor(n) for n in range(1, 4)])
    save_state(tmp_path, {"learner": learner.state_dict()})
    resumed = GRPOLearner(small_model(), pad_id=0, optim=config)
    resumed.load_state_dict(load_state(tmp_path)["learner"])
    assert resumed.step(make_groups(1))["lr"] == pytest.approx(1e-3 * config.lr_factor(4))
    for bad in ({"decay_steps": -1}, {"final_lr_fraction": 0.0}, {"final_lr_fraction": 1.5}):
        with pytest.raises(ValueError):
            OptimConfig(**bad)


def test_state_round_trip_resumes_identically(tmp_path) -> None:
    """Saved and loaded through the trainer's state file, a learner continues exactly."""
    first = GRPOLearner(small_model(), pad_id=0, optim=OptimConfig(lr=1e-2, warmup_steps=0))
    first.step(make_groups(2))
    save_state(tmp_path, {"learner": first.state_dict()})
    second = GRPOLearner(small_model(seed=5), pad_id=0, optim=OptimConfig(lr=1e-2, warmup_steps=0))
    second.load_state_dict(load_state(tmp_path)["learner"])
    groups = make_groups(2, seed=1)
    first.step(groups)
    second.step(groups)
    assert second.updates == 2
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.allclose(a, b)


def test_kl_needs_a_reference() -> None:
    with pytest.raises(ValueError, match="reference"):
        GRPOLearner(small_model(), pad_id=0, loss=LossConfig(kl_coef=0.1))


def test_old_policy_behavior_clips_what_already_moved_and_recompute_does_not() -> None:
    """Behavior logprobs 1 nat below the current policy: every ratio is e, above 1 + eps, so
    rewarded tokens get no gradient while unrewarded ones (under delta) still do. With
    ``recompute`` the ratio starts at 1 and nothing is clipped."""
    model = small_model()
    stale = [dataclasses.replace(g, logprobs=tuple(tuple(x - 1.0 for x in lp) for lp in g.logprobs))
             for g in make_groups(2, policy=model)]
    rewarded = sum(len(c) for g in stale for c, r in zip(g.completions, g.task_rewards, strict=True) if r > 0)
    total = sum(len(c) for g in stale for c in g.completions)
    behavior = GRPOLearner(small_model(), pad_id=0, optim=OptimConfig(warmup_steps=0)).step(stale)
    assert behavior["clip_fraction"] == pytest.approx(rewarded / total, abs=1e-6)
    assert behavior["ratio_mean"] == pytest.approx(math.e, rel=1e-4)
    recompute = GRPOLearner(small_model(), pad_id=0,
                            optim=OptimConfig(warmup_steps=0, old_policy="recompute")).step(stale)
    assert recompute["clip_fraction"] == 0.0 and recompute["ratio_mean"] == pytest.approx(1.0, abs=1e-5)


def test_a_group_must_be_consistent() -> None:
    group = make_groups(1)[0]
    with pytest.raises(ValueError, match="empty completion"):
        dataclasses.replace(group, completions=((),) + group.completions[1:],
                            logprobs=((),) + group.logprobs[1:])
    with pytest.raises(ValueError, match="logprobs"):
        dataclasses.replace(group, logprobs=((-1.0,),) + group.logprobs[1:])
    with pytest.raises(ValueError, match="rewards"):
        dataclasses.replace(group, task_rewards=(1.0,))


def test_shared_prompt_scoring_equals_a_plain_forward_pass() -> None:
    """Prompts of different lengths, run once each (left-padded) with their KV cache repeated for
    their rows: every completion token's logprob equals a plain forward of prompt + completion,
    and so does the gradient of their sum."""
    groups = make_groups(3, seed=4)
    rows = [_Row(g.prompt, c, 0.0) for g in groups for c in g.completions]
    model = small_model()
    logprobs, entropy = token_logprobs(model, _pack(rows, pad_id=0), with_entropy=True)
    for i, row in enumerate(rows):
        expected = token_scores(model, row.prompt, row.completion)
        assert logprobs[i, : len(row.completion)].tolist() == pytest.approx(expected, abs=1e-5)
    assert entropy is not None and bool((entropy > 0).all())
    tensors = _pack(rows, pad_id=0)
    (token_logprobs(model, tensors, with_entropy=False)[0] * tensors.mask).sum().backward()
    shared = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for row in rows:
        logits = model(input_ids=torch.tensor([list(row.prompt)
                                               + list(row.completion)])).logits[0, len(row.prompt) - 1: -1]
        torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(row.completion)[:, None]).sum().backward()
    for a, p in zip(shared, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, atol=1e-4)
