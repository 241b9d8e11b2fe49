"""Low-rank adapters (LoRA): the trainer trains a few small matrices and ships only them.

A full checkpoint per step is the whole policy. With LoRA (Hu et al. 2021) the base weights stay
frozen, travel once, and every step changes only the adapters: for SmolLM2-135M at rank 1 on all
seven linear layers of each block (config.LORA_TARGETS) that is 0.31M parameters, 1.2 MB as a
``lora/v1`` body (float32, protocol/lora.py), against 269 MB for the bfloat16 policy (bench/deltas.py
measures it per step).

Each targeted ``nn.Linear`` (by the last component of its module name) is replaced in place by a
``LoraLinear`` that keeps the original layer frozen and adds ``scaling * B @ A`` to its weight,
with ``A`` rank x in, ``B`` out x rank and ``scaling = alpha / rank``. ``B`` starts at zero, so the
wrapped model computes exactly the base model until the first update; ``A`` starts as
``nn.Linear``'s own weights do (Kaiming-uniform), as PEFT does, from a seeded generator so that
two trainers given the same seed start from the same adapter. Every parameter outside the
adapters is frozen (``requires_grad`` off), so the optimizer keeps state only for the adapters and
a backward pass computes no gradient for the 135M base weights.

The adapter's tensors are named after the wrapped module (``<module>.lora_A`` and
``<module>.lora_B``, plain dotted names a safetensors file and a shard manifest accept), and
``load_adapter`` refuses a set of tensors whose names or shapes differ from the model's before
copying any of them: a node never runs a half-loaded adapter. ``merged_weights`` gives the
effective weights under the base model's own names, which an engine that runs merged weights
loads like any checkpoint; ``merge_lora`` folds the adapters into plain layers in place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from intellect_node.node.roles.trainer.config import LoraConfig


class LoraLinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update: ``base(x) + scaling * x A^T B^T``.

    The update runs as two thin matmuls on the activations (never materializing ``B @ A``), so
    the wrapped layer costs ``rank * (in + out)`` extra multiply-adds per token."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base = base
        base.requires_grad_(False)
        self.rank = rank
        self.scaling = alpha / rank
        weight = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=weight.dtype, device=weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=weight.dtype, device=weight.device))
        with torch.no_grad():
            init = torch.empty(rank, base.in_features, dtype=torch.float32)
            nn.init.kaiming_uniform_(init, a=math.sqrt(5), generator=generator)  # nn.Linear's own initialization
            self.lora_A.copy_(init)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """``scaling * B @ A``: what the adapter adds to the base weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` computing the same function (to float rounding), detached."""
        layer = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None,
                          dtype=self.base.weight.dtype, device=self.base.weight.device)
        with torch.no_grad():
            layer.weight.copy_(self.base.weight + self.delta_weight())
            if self.base.bias is not None:
                layer.bias.copy_(self.base.bias)
        return layer


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def apply_lora(model: nn.Module, config: LoraConfig, seed: int = 0) -> list[str]:
    """Freeze ``model`` and wrap every ``nn.Linear`` named by ``config.targets``; returns the
    wrapped modules' names in model order. Raises ``ValueError`` if nothing matches (a misspelt
    target would otherwise train nothing) or if the model already carries adapters."""
    if lora_modules(model):
        raise ValueError("the model already carries LoRA adapters")
    names = [name for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and name.rpartition(".")[2] in config.targets]
    if not names:
        raise ValueError(f"no nn.Linear named {list(config.targets)} in the model")
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for name in names:
        _set_module(model, name, LoraLinear(model.get_submodule(name), config.rank, config.alpha, generator))
    return names


def lora_modules(model: nn.Module) -> dict[str, LoraLinear]:
    """The wrapped layers by module name, in model order."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLinear)}


def adapter_tensors(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The adapter as it ships: ``<module>.lora_A`` and ``<module>.lora_B`` for every wrapped
    layer, detached copies (in ``dtype`` if given: the policy dtype a step publishes)."""
    tensors = {}
    for name, module in lora_modules(model).items():
        for part in ("lora_A", "lora_B"):
            value = getattr(module, part).detach()
            tensors[f"{name}.{part}"] = value.to(dtype) if dtype is not None else value.clone()
    return tensors


def load_adapter(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy an adapter into the model's wrapped layers (cast to their dtype). The names and
    shapes are checked against the model's adapters first, all of them: on any difference
    nothing is copied and ``ValueError`` names the first one."""
    expected = {name: tuple(value.shape) for name, value in adapter_tensors(model).items()}
    if set(tensors) != set(expected):
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        raise ValueError(f"adapter tensors do not match the model's: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"adapter tensor {name!r} has shape {tuple(tensors[name].shape)}, the model's is {shape}")
        if not tensors[name].is_floating_point():
            raise ValueError(f"adapter tensor {name!r} has dtype {tensors[name].dtype}, not a float type")
    modules = lora_modules(model)
    with torch.no_grad():
        for name, value in tensors.items():
            module_name, _, part = name.rpartition(".")
            getattr(modules[module_name], part).copy_(value)


def merged_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The effective weights under the base model's own names (``<module>.weight`` = base +
    ``scaling * B @ A``), detached: what an engine running merged weights loads."""
    modules = lora_modules(model)
    weights = {}
    with torch.no_grad():
        for name, value in model.state_dict().items():
            module_name, _, part = name.rpartition(".")
            if module_name in modules and part in ("lora_A", "lora_B"):
                continue
            owner, _, inner = module_name.rpartition(".")
            if inner == "base" and owner in modules:  # <module>.base.weight -> <module>.weight
                if part == "weight":
                    value = value + modules[owner].delta_weight()
                name = f"{owner}.{part}"
            weights[name] = value.detach()
    return weights


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into a plain ``nn.Linear`` in place (the base model's structure and
    names again); returns ``model``. The merged layers keep the base's ``requires_grad`` off."""
    for name, module in lora_modules(model).items():
        merged = module.merged()
        merged.requires_grad_(False)
        _set_module(model, name, merged)
    return model
