"""A small random Qwen2 policy and GRPO groups sampled as if from it, for the learner tests."""

from __future__ import annotations

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from intellect_node.node.roles.trainer.groups import TrainingGroup

VOCAB = 40


def small_model(seed: int = 0) -> Qwen2ForCausalLM:
    """Two layers, hidden size 32, vocabulary of ``VOCAB``: a learner step takes milliseconds."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1)
    return Qwen2ForCausalLM(config)


def make_groups(count: int, seed: int = 0, policy: Qwen2ForCausalLM | None = None) -> list[TrainingGroup]:
    """Random groups, half rewarded; their behavior logprobs are ``policy``'s (default: the
    untrained ``small_model()``), as if it had sampled them."""
    policy = policy or small_model()
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(count):
        prompt = tuple(int(t) for t in rng.integers(2, VOCAB, size=int(rng.integers(3, 7))))
        completions = tuple(tuple(int(t) for t in rng.integers(2, VOCAB, size=int(rng.integers(1, 6)))) + (1,)
                            for _ in range(4))
        groups.append(TrainingGroup(key=f"{g:064x}:{g}", worker="w", policy_step=0, task_id=f"t{g}",
                                    length_target=8, prompt=prompt, completions=completions,
                                    task_rewards=(1.0, 0.0, 0.0, 1.0),
                                    logprobs=tuple(tuple(token_scores(policy, prompt, c)) for c in completions)))
    return groups


def token_scores(model, prompt, completion) -> list[float]:
    """Each completion token's logprob from one plain forward pass of prompt + completion."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + list(completion)])).logits[0, len(prompt) - 1: -1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()
