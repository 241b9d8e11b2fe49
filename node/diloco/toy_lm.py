"""The toy LM workload, built into DiLoCo: the generated corpus (``data_spec``, ``data``) and a
tiny Llama (``llama``), so a run needs no other workload and a CPU round takes seconds.

Registered on import; ``settings`` imports it (its preset is the default ``[diloco] model``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from intellect_node.node.diloco.data_spec import CorpusSpec
from intellect_node.node.diloco.llama import Preset, SpecialIds, build_model
from intellect_node.node.diloco.workload import Workload, register

if TYPE_CHECKING:
    import torch

    from intellect_node.node.diloco.data import GeneratedData

# Small enough for a CPU round in seconds; the vocabulary covers the generated corpus's default 256 tokens.
TINY = Preset("diloco-tiny", hidden=64, layers=2, heads=4, intermediate=176, context=128, vocab=256)
SPECIAL = SpecialIds(pad=0)  # the corpus has no special tokens; the config names a pad id (its row starts at zero)


def open_generated(spec: CorpusSpec, seed: int, batch: int, H: int, context: int, vocab: int) -> GeneratedData:
    """The corpus the spec describes, rebuilt here (every peer builds the same rows from the spec alone)."""
    from intellect_node.node.diloco.data import GeneratedData, generate

    return GeneratedData(generate(spec), seed, batch)


def build_toy(preset: Preset, seed: int) -> torch.nn.Module:
    """A model of ``preset`` (``TINY``, or a test's smaller shape) with the toy LM's ids, from ``seed``."""
    return build_model(preset, seed, SPECIAL)


TOY_LM = Workload("generated", "'generated:...'", {TINY.name: TINY}, CorpusSpec.parse, open_generated, build_toy)
register(TOY_LM)
