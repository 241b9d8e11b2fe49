"""Llama-shaped model presets, from a CPU-sized one to the METAGENE-1 7B configuration.

Why Llama: METAGENE-1 is a Llama-2-shaped decoder (RMSNorm, SwiGLU MLP, rotary positions, no
biases, untied embeddings), and transformers' ``LlamaForCausalLM`` is what every engine loads. The
7B preset is exactly METAGENE-1's shape (32 layers, width 4096, 32 heads, MLP 11008, context 512,
vocabulary 1024: 6.48 B parameters); it is for real hardware and is never instantiated in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and transformers take seconds to import: naming a preset in a config must not
    from transformers import LlamaConfig, LlamaForCausalLM

from intellect_node.node.metagene.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE


@dataclass(frozen=True)
class Preset:
    """A model shape."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    context: int = 512
    vocab: int = VOCAB_SIZE

    def config(self) -> LlamaConfig:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.heads, max_position_embeddings=self.context,
                           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                           attention_bias=False, mlp_bias=False, hidden_act="silu",
                           pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)

    def parameter_count(self) -> int:
        """Parameters of the built model, from the shape alone (embeddings, head, per layer the
        four attention projections, the three MLP matrices and two norms, the final norm)."""
        h = self.hidden
        per_layer = 4 * h * h + 3 * h * self.intermediate + 2 * h
        return 2 * self.vocab * h + self.layers * per_layer + h


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("tiny", hidden=64, layers=2, heads=4, intermediate=176),       # ~0.2 M: tests, demo
    Preset("small", hidden=256, layers=4, heads=8, intermediate=704),     # ~3.7 M: CPU pretraining
    Preset("base", hidden=1024, layers=12, heads=16, intermediate=2816),  # ~0.15 B: one GPU
    Preset("metagene-7b", hidden=4096, layers=32, heads=32, intermediate=11008),  # METAGENE-1
)}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def build_model(preset: Preset, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised model of ``preset``, reproducible from ``seed``. Eager attention:
    on CPU with a 4D document mask it is as fast as SDPA at these sizes and bit-stable."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = preset.config()
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config)
