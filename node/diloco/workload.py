"""What a workload plugs into DiLoCo, and the workloads this process knows.

Why an interface: the peer, its settings and its role are the same for every workload; a workload
brings only its model presets (``llama`` shapes) and their build, the syntax of its ``[diloco]
data`` spec, and its data with their loss (``data.PeerData``). The toy LM (``toy_lm``) is built in;
any other workload registers itself when its module is imported (node/metagene/workload.py, which
the node's assembly imports), so nothing here imports a workload. Torch-free: a config is checked
without it (a workload's ``open`` and ``build_model`` import what they need).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from intellect_node.node.diloco.llama import Preset

if TYPE_CHECKING:
    import torch

    from intellect_node.node.diloco.data import PeerData


@dataclass(frozen=True)
class Workload:
    kind: str  # the head of its data specs: "metagene" in "metagene:store=DIR"
    syntax: str  # its data spec as errors show it
    presets: Mapping[str, Preset]  # the models it adds, by ``[diloco] model`` name
    parse: Callable[[str], Any]  # a data spec checked for syntax (nothing opened)
    open: Callable[[Any, int, int, int, int, int], PeerData]  # (parsed spec, seed, batch, H, context, vocab)
    build_model: Callable[[Preset, int], torch.nn.Module]  # (preset, seed): θ0, the same on every peer
    preset_rule: str = ""  # non-empty: its data needs one of its own presets, and why (the error says it)


_WORKLOADS: dict[str, Workload] = {}


def register(workload: Workload) -> None:
    """Make ``workload`` known (again: a no-op); a kind or preset name already taken is an error."""
    known = _WORKLOADS.get(workload.kind)
    if known is workload:
        return
    taken = sorted(set(workload.presets) & set(models()))
    if known is not None or taken:
        raise ValueError(f"workload {workload.kind!r}: its kind or presets {taken} are another workload's")
    _WORKLOADS[workload.kind] = workload


def models() -> dict[str, Preset]:
    """Every known preset by name, in the order the workloads registered."""
    return {name: preset for workload in _WORKLOADS.values() for name, preset in workload.presets.items()}


def workload_of_data(spec: str) -> Workload:
    """The workload whose data a ``[diloco] data`` spec names (by its ``kind:`` head)."""
    workload = _WORKLOADS.get(spec.partition(":")[0])
    if workload is None:
        raise ValueError(f"data spec {spec!r}: expected {' or '.join(w.syntax for w in _WORKLOADS.values())}")
    return workload


def open_data(spec: str, seed: int, batch: int, H: int, context: int, vocab: int) -> PeerData:
    """The data source a spec names; errors name the spec (or what it points at)."""
    workload = workload_of_data(spec)
    return workload.open(workload.parse(spec), seed, batch, H, context, vocab)


def build_model(model: str, seed: int) -> torch.nn.Module:
    """θ0 of the ``[diloco] model`` preset ``model``, built by the workload that names it."""
    for workload in _WORKLOADS.values():
        if model in workload.presets:
            return workload.build_model(workload.presets[model], seed)
    raise ValueError(f"unknown model {model!r}; choose one of {', '.join(models())}")
