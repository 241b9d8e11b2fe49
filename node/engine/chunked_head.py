"""Log-probabilities of chosen tokens with the LM head run over a few rows at a time.

``log_softmax(head(states))`` over a whole batch materializes ``rows x vocab`` float32 logits, plus
the same again for the log-softmax and, when training, for autograd: 16 x 128 rows over SmolLM2's
49,152 tokens are 400 MB per copy, over Qwen2's 151,936 tokens 1.2 GB. Here the head runs on at
most ``chunk_rows`` rows at once and only the chosen token's log-probability (and optionally the
entropy) of each row is kept, so peak memory is ``chunk_rows x vocab`` whatever the batch.

Rows are independent in a log-softmax, so each row's result is computed exactly as the unchunked
form computes it (same ops, same float32 upcast); only BLAS's blocking of the matmul may differ
with the number of rows, which stays within float32 rounding. Under autograd every chunk is
checkpointed: its logits are recomputed in backward instead of kept, which is what bounds the
trainer's memory.

The trainer's ``token_logprobs`` (node/roles/trainer/learner.py) computes its policy and reference
log-probabilities through it. ``TorchEngine.prefill`` bounds its own head calls (torch_prefill.py ``HEAD_ELEMENTS``)
because verification also needs each row's full logits for the sampling margins.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

Head = Callable[[torch.Tensor], torch.Tensor]
DEFAULT_CHUNK_ROWS = 256


def _chunk(head: Head, states: torch.Tensor, targets: torch.Tensor,
           with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(head(states).float(), dim=-1)
    chosen = logp.gather(-1, targets[:, None])[:, 0]
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else chosen.new_zeros(0)
    return chosen, entropy


def chunked_token_logprobs(
    head: Head,
    states: torch.Tensor,
    targets: torch.Tensor,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(head(states))`` at ``targets`` (and the entropy per row when asked).

    ``states`` is ``[..., hidden]``, ``targets`` the matching ``[...]`` token ids; results have
    the shape of ``targets``, float32.
    """
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be >= 1")
    if states.shape[:-1] != targets.shape:
        raise ValueError(f"states {tuple(states.shape)} and targets {tuple(targets.shape)} do not match")
    flat_states = states.reshape(-1, states.shape[-1])
    flat_targets = targets.reshape(-1)
    track = torch.is_grad_enabled()
    chosen_parts, entropy_parts = [], []
    for start in range(0, flat_states.shape[0], chunk_rows):
        rows = flat_states[start:start + chunk_rows]
        row_targets = flat_targets[start:start + chunk_rows]
        if track:
            chosen, entropy = checkpoint(_chunk, head, rows, row_targets, with_entropy, use_reentrant=False)
        else:
            chosen, entropy = _chunk(head, rows, row_targets, with_entropy)
        chosen_parts.append(chosen)
        entropy_parts.append(entropy)
    empty = states.new_zeros(0, dtype=torch.float32)
    chosen = (torch.cat(chosen_parts) if chosen_parts else empty).reshape(targets.shape)
    if not with_entropy:
        return chosen, None
    return chosen, (torch.cat(entropy_parts) if entropy_parts else empty).reshape(targets.shape)
