"""A tiny random Llama and its tokenizer written as a GGUF file the way llama.cpp lays one out.

Tests import it with ``model import`` and compare against the model it came from, so the writer
follows llama.cpp's convert_hf_to_gguf.py exactly: its tensor names, its Q/K row permutation (which
transformers undoes on load) and its byte-level BPE tokenizer metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The answer is \\boxed{42}. Think step by step about the question.",
    "Alice has 3 apples and buys 4 more; how many apples does she have now?",
] * 20


def tiny_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<|endoftext|>")


def tiny_llama(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random init has tiny norms; make the logits spread so greedy is stable
        for param in model.parameters():
            param.mul_(4.0) if param.dim() > 1 else None
    return model


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary row order for Q and K (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(path: Path, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast,
               architecture: str = "llama", tokenizer_model: str = "gpt2") -> Path:
    """Write ``model`` and ``tokenizer`` as an F32 GGUF at ``path``."""
    from gguf import GGUFWriter, TokenType

    c = model.config
    writer = GGUFWriter(str(path), architecture)
    writer.add_name("tiny-test-llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL for t in tokens])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                   "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                   "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                   "mlp.down_proj": "ffn_down"}
    for key, tensor in model.state_dict().items():
        data = tensor.detach().float().numpy()
        if key.startswith("model.layers."):
            _, _, index, rest = key.split(".", 3)
            module = rest.rsplit(".", 1)[0]
            name = f"blk.{index}.{layer_names[module]}.weight"
            if module == "self_attn.q_proj":
                data = _permute(data, c.num_attention_heads)
            elif module == "self_attn.k_proj":
                data = _permute(data, c.num_key_value_heads)
        else:
            name = names[key]
        writer.add_tensor(name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
