"""The global state of a DiLoCo run and its outer step: SGD with Nesterov momentum.

Why our own few lines instead of ``torch.optim.SGD``: every peer must produce the same bits, and
each operation here is one correctly rounded fp32 multiply or add (no ``alpha=`` forms, which a
kernel may fuse into an FMA on one CPU and not on another), in the order specs/diloco.md section 1
fixes. The values equal torch's ``SGD(nesterov=True)`` up to that rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from intellect_node.node.diloco.layout import Layout


@dataclass
class GlobalState:
    """Outer parameters θ and momentum m as flat fp32 vectors in ``layout`` order, and the round."""

    layout: Layout
    params: torch.Tensor
    momentum: torch.Tensor
    round: int = 0

    def __post_init__(self) -> None:
        for name, t in (("params", self.params), ("momentum", self.momentum)):
            if t.dtype != torch.float32 or t.shape != (self.layout.elements,):
                raise ValueError(f"{name}: a flat fp32 vector of {self.layout.elements} elements was expected")
        if not 0 <= self.round < 2**32:
            raise ValueError(f"round {self.round} outside [0, 2^32)")

    @classmethod
    def start(cls, layout: Layout, params: torch.Tensor) -> GlobalState:
        return cls(layout, params.clone(), torch.zeros_like(params), 0)


def outer_step(state: GlobalState, averaged: torch.Tensor, lr: float, momentum: float) -> None:
    """m = μ·m + Δ̄; θ = θ - η·(Δ̄ + μ·m); round + 1 (in place)."""
    if averaged.dtype != torch.float32 or averaged.shape != state.params.shape:
        raise ValueError("the averaged pseudo-gradient does not match the state's layout")
    mu = torch.tensor(momentum, dtype=torch.float32)
    eta = torch.tensor(lr, dtype=torch.float32)
    state.momentum.copy_(torch.add(torch.mul(state.momentum, mu), averaged))
    step = torch.mul(torch.add(averaged, torch.mul(state.momentum, mu)), eta)
    state.params.copy_(torch.sub(state.params, step))
    state.round += 1
