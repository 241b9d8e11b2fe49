"""Save and resume a DiLoCo peer at a round boundary, through the project's durable writer.

What is saved: the global state (θ, m, round), the peer's error-feedback residual, its inner AdamW
moments and step, and its token count; at a boundary the local params equal θ and the data
position is the round (specs/diloco.md section 3), so nothing else is needed. One safetensors file
(no pickle: a checkpoint may come from anywhere), whose metadata carries the round, the layout
hash and the state hash; a load checks the size before reading, every key, dtype and shape, and
recomputes the state hash, naming the first thing that is wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.outer import GlobalState
from intellect_node.node.diloco.state_hash import state_hash
from intellect_node.node.home.durable import write_durably

FORMAT = "intellect-node/diloco-checkpoint/v1"
VECTORS = ("params", "momentum", "residual", "exp_avg", "exp_avg_sq")
HEADER_ALLOWANCE = 1 << 20


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed from; the message names the file and what was wrong."""


@dataclass
class PeerState:
    """Everything a peer resumes from: the global state plus its own local parts."""

    state: GlobalState
    residual: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    adam_step: int = 0
    tokens: int = 0


def save_checkpoint(path: Path, peer: PeerState) -> bytes:
    """Write ``peer`` durably to ``path``; returns the state hash it recorded."""
    digest = state_hash(peer.state)
    metadata = {"format": FORMAT, "round": str(peer.state.round), "layout": peer.state.layout.digest().hex(),
                "state_hash": digest.hex(), "adam_step": str(peer.adam_step), "tokens": str(peer.tokens)}
    tensors = {"params": peer.state.params, "momentum": peer.state.momentum, "residual": peer.residual,
               "exp_avg": peer.exp_avg, "exp_avg_sq": peer.exp_avg_sq}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_durably(path, save({k: v.contiguous() for k, v in tensors.items()}, metadata))
    return digest


def _int(metadata: dict[str, str], key: str, path: Path, high: int) -> int:
    raw = metadata.get(key, "")
    if not raw.isdigit() or int(raw) >= high:
        raise CheckpointError(f"{path}: metadata {key}={raw[:40]!r} is not a whole number below {high}")
    return int(raw)


def load_checkpoint(path: Path, layout: Layout) -> PeerState:
    """The peer state in ``path``, for a model of ``layout``; CheckpointError on any mismatch."""
    limit = 4 * layout.elements * len(VECTORS) + HEADER_ALLOWANCE
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise CheckpointError(f"{path}: {exc.strerror}") from None
    if size > limit:
        raise CheckpointError(f"{path}: {size} bytes, more than the {limit} a checkpoint of this model can hold")
    try:
        with safe_open(path, "pt") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != FORMAT:
                raise CheckpointError(f"{path}: format {metadata.get('format')!r}, expected {FORMAT!r}")
            if metadata.get("layout") != layout.digest().hex():
                raise CheckpointError(f"{path}: saved for another model (layout hash differs)")
            if set(handle.keys()) != set(VECTORS):
                raise CheckpointError(f"{path}: tensors {sorted(handle.keys())}, expected {sorted(VECTORS)}")
            vectors = {key: handle.get_tensor(key) for key in VECTORS}
    except SafetensorError as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    for key, tensor in vectors.items():
        if tensor.dtype != torch.float32 or tensor.shape != (layout.elements,):
            raise CheckpointError(f"{path}: {key} is {tensor.dtype} {tuple(tensor.shape)}, "
                                  f"expected float32 ({layout.elements},)")
    try:
        state = GlobalState(layout, vectors["params"], vectors["momentum"], _int(metadata, "round", path, 2**32))
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    if state_hash(state).hex() != metadata.get("state_hash"):
        raise CheckpointError(f"{path}: the state does not hash to the recorded state_hash (corrupt or altered)")
    return PeerState(state, vectors["residual"], vectors["exp_avg"], vectors["exp_avg_sq"],
                     _int(metadata, "adam_step", path, 2**63), _int(metadata, "tokens", path, 2**63))


def adamw_vectors(optimizer: torch.optim.Optimizer, named: dict[str, torch.nn.Parameter],
                  layout: Layout) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The inner optimizer's moments as flat vectors in layout order, and its step (zeros before the first)."""
    moments = []
    step = 0
    for key in ("exp_avg", "exp_avg_sq"):
        tensors = {}
        for name in layout.names:
            s = optimizer.state.get(named[name], {})
            tensors[name] = s.get(key, torch.zeros_like(named[name]))
            step = int(s["step"]) if "step" in s else step
        moments.append(layout.flatten(tensors))
    return moments[0], moments[1], step


def restore_adamw(optimizer: torch.optim.Optimizer, named: dict[str, torch.nn.Parameter], layout: Layout,
                  exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: int) -> None:
    """Put saved moments back into a freshly built AdamW (nothing to do before its first step)."""
    if step == 0:
        return
    avg, avg_sq = layout.views(exp_avg), layout.views(exp_avg_sq)
    for name in layout.names:
        optimizer.state[named[name]] = {"step": torch.tensor(float(step)), "exp_avg": avg[name].clone(),
                                        "exp_avg_sq": avg_sq[name].clone()}
