"""LoRA adapters (node/roles/trainer/lora.py): the wrapped model starts as the base model, trains
only its adapters, merges to the same function, and refuses an adapter of another shape."""

from __future__ import annotations

import pytest
import torch

from intellect_node.node.roles.trainer.config import LoraConfig, OptimConfig
from intellect_node.node.roles.trainer.learner import GRPOLearner
from intellect_node.node.roles.trainer.lora import (
    LoraLinear,
    adapter_tensors,
    apply_lora,
    load_adapter,
    lora_modules,
    merge_lora,
    merged_weights,
)
from tests.support.grpo_groups import VOCAB, make_groups, small_model

CONFIG = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))


def tokens() -> torch.Tensor:
    return torch.randint(2, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens()).logits


def perturb(model: torch.nn.Module) -> None:
    """Adapters as after training: B nonzero, so the adapters change the function."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for module in lora_modules(model).values():
            module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=g) * 0.1)


def test_wraps_the_targets_with_the_right_shapes_and_starts_as_the_base_model() -> None:
    base, model = small_model(), small_model()
    names = apply_lora(model, CONFIG)
    assert names == [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")]
    config = model.config
    kv_out = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    shapes = {name: tuple(t.shape) for name, t in adapter_tensors(model).items()}
    assert shapes["model.layers.0.self_attn.q_proj.lora_A"] == (4, 32)
    assert shapes["model.layers.0.self_attn.q_proj.lora_B"] == (32, 4)
    assert shapes["model.layers.1.self_attn.v_proj.lora_A"] == (4, 32)
    assert shapes["model.layers.1.self_attn.v_proj.lora_B"] == (kv_out, 4)
    assert len(shapes) == 8
    assert torch.equal(logits(model), logits(base))  # B = 0: exactly the base function


def test_only_the_adapters_get_gradients_and_change_in_a_learner_step() -> None:
    model = small_model()
    apply_lora(model, CONFIG)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{name}.{part}" for name in lora_modules(model) for part in ("lora_A", "lora_B")}
    model(input_ids=tokens()).logits.square().mean().backward()
    with_grad = {name for name, p in model.named_parameters() if p.grad is not None}
    assert with_grad == trainable
    model.zero_grad(set_to_none=True)

    before = {name: value.clone() for name, value in model.state_dict().items()}
    learner = GRPOLearner(model, pad_id=0, optim=OptimConfig(lr=1e-2, warmup_steps=0))
    learner.step(make_groups(4))
    changed = {name for name, value in model.state_dict().items() if not torch.equal(value, before[name])}
    assert changed and changed <= trainable


def test_merged_and_unmerged_compute_the_same_function() -> None:
    model = small_model()
    apply_lora(model, CONFIG)
    perturb(model)
    wrapped = logits(model)
    assert not torch.allclose(wrapped, logits(small_model()), atol=1e-4)  # the adapters matter

    plain = small_model()
    plain.load_state_dict(merged_weights(model))  # the base model's own names, strictly
    assert torch.allclose(logits(plain), wrapped, atol=1e-5)

    merge_lora(model)
    assert not lora_modules(model) and not any(isinstance(m, LoraLinear) for m in model.modules())
    assert torch.allclose(logits(model), wrapped, atol=1e-5)
    assert set(model.state_dict()) == set(small_model().state_dict())


def test_an_adapter_round_trips_and_a_wrong_one_is_refused_whole() -> None:
    source = small_model()
    apply_lora(source, CONFIG)
    perturb(source)
    shipped = adapter_tensors(source, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in shipped.values())

    target = small_model()
    apply_lora(target, CONFIG)
    load_adapter(target, shipped)
    assert all(torch.equal(t.to(torch.bfloat16), shipped[name]) for name, t in adapter_tensors(target).items())

    untouched = adapter_tensors(target)
    wrong = dict(shipped) | {"model.layers.1.self_attn.v_proj.lora_B": torch.zeros(32, 4)}
    with pytest.raises(ValueError, match="shape"):
        load_adapter(target, wrong)
    with pytest.raises(ValueError, match="missing"):
        load_adapter(target, {k: v for k, v in shipped.items() if "layers.0" not in k})
    with pytest.raises(ValueError, match="unexpected"):
        load_adapter(target, dict(shipped) | {"model.layers.0.mlp.up_proj.lora_A": torch.zeros(4, 32)})
    assert all(torch.equal(t, untouched[name]) for name, t in adapter_tensors(target).items())  # nothing copied


def test_bad_configs_and_targets_are_refused() -> None:
    with pytest.raises(ValueError):
        LoraConfig(rank=0)
    with pytest.raises(ValueError):
        LoraConfig(targets=())
    model = small_model()
    with pytest.raises(ValueError, match="no nn.Linear"):
        apply_lora(model, LoraConfig(targets=("qproj",)))
    apply_lora(model, CONFIG)
    with pytest.raises(ValueError, match="already"):
        apply_lora(model, CONFIG)


def test_the_same_seed_gives_the_same_adapter() -> None:
    a, b = small_model(), small_model()
    apply_lora(a, CONFIG, seed=3)
    apply_lora(b, CONFIG, seed=3)
    assert all(torch.equal(t, adapter_tensors(b)[name]) for name, t in adapter_tensors(a).items())
