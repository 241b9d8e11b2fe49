"""METAGENE-1's model presets (node/diloco/llama.py's Llama shape), from a CPU-sized one to the 7B.

The 7B preset is exactly METAGENE-1's shape (32 layers, width 4096, 32 heads, MLP 11008, context
512, vocabulary 1024: 6.48 B parameters); it is for real hardware and is never instantiated in tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from intellect_node.node.diloco.llama import Preset, SpecialIds
from intellect_node.node.diloco.llama import build_model as build_llama
from intellect_node.node.metagene.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

if TYPE_CHECKING:  # transformers takes seconds to import: naming a preset in a config must not
    from transformers import LlamaForCausalLM

CONTEXT = 512  # tokens: a read of at most 512 tokens plus EOS fits a row (specs/metagene.md)
SPECIAL = SpecialIds(PAD_ID, BOS_ID, EOS_ID)

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("tiny", hidden=64, layers=2, heads=4, intermediate=176, context=CONTEXT, vocab=VOCAB_SIZE),  # ~0.2 M: tests
    Preset("small", hidden=256, layers=4, heads=8, intermediate=704, context=CONTEXT, vocab=VOCAB_SIZE),  # ~3.7 M: CPU
    Preset("base", hidden=1024, layers=12, heads=16, intermediate=2816, context=CONTEXT, vocab=VOCAB_SIZE),  # 0.15 B
    Preset("metagene-7b", hidden=4096, layers=32, heads=32, intermediate=11008, context=CONTEXT,
           vocab=VOCAB_SIZE),  # METAGENE-1
)}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def build_model(preset: Preset, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised model of ``preset`` with the METAGENE tokenizer's special ids,
    reproducible from ``seed``."""
    return build_llama(preset, seed, SPECIAL)
