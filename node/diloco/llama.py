"""Llama-shaped decoder presets and their seeded build: the models DiLoCo workloads train.

Why Llama: METAGENE-1 is a Llama-2-shaped decoder (RMSNorm, SwiGLU MLP, rotary positions, no
biases, untied embeddings), and transformers' ``LlamaForCausalLM`` is what every engine loads. A
workload names its presets (node/metagene/presets.py: tiny to METAGENE-1 7B; ``toy_lm``: a CPU-sized
one) and its special token ids; θ0 is a function of the preset, the ids and the seed alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # torch and transformers take seconds to import: naming a preset in a config must not
    from transformers import LlamaConfig, LlamaForCausalLM


class SpecialIds(NamedTuple):
    """A tokenizer's ids the model config names: ``pad``'s embedding row starts at zero."""

    pad: int
    bos: int | None = None
    eos: int | None = None


@dataclass(frozen=True)
class Preset:
    """A model shape."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    context: int
    vocab: int

    def config(self, special: SpecialIds) -> LlamaConfig:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.heads, max_position_embeddings=self.context,
                           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                           attention_bias=False, mlp_bias=False, hidden_act="silu",
                           pad_token_id=special.pad, bos_token_id=special.bos, eos_token_id=special.eos)

    def parameter_count(self) -> int:
        """Parameters of the built model, from the shape alone (embeddings, head, per layer the
        four attention projections, the three MLP matrices and two norms, the final norm)."""
        h = self.hidden
        per_layer = 4 * h * h + 3 * h * self.intermediate + 2 * h
        return 2 * self.vocab * h + self.layers * per_layer + h


def build_model(preset: Preset, seed: int, special: SpecialIds) -> LlamaForCausalLM:
    """A randomly initialised model of ``preset``, reproducible from ``seed``. Eager attention:
    on CPU with a 4D document mask it is as fast as SDPA at these sizes and bit-stable."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = preset.config(special)
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config)
