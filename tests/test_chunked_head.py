"""The chunked LM head gives the unchunked log-probabilities, entropies and gradients.

Checked on a 49,152-token head (SmolLM2's vocabulary) with a chunk that does not divide the rows.
"""

from __future__ import annotations

import pytest
import torch

from intellect_node.node.engine.chunked_head import chunked_token_logprobs

VOCAB, HIDDEN = 49152, 32


def _reference(head: torch.nn.Module, states: torch.Tensor, targets: torch.Tensor):
    logp = torch.log_softmax(head(states).float(), dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.fixture()
def case():
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    states = torch.randn(2, 21, HIDDEN, requires_grad=True)
    targets = torch.randint(0, VOCAB, (2, 21))
    return head, states, targets


def test_values_match_the_unchunked_head(case) -> None:
    head, states, targets = case
    with torch.no_grad():
        want_lp, want_ent = _reference(head, states, targets)
        got_lp, got_ent = chunked_token_logprobs(head, states, targets, chunk_rows=8, with_entropy=True)
        whole, _ = chunked_token_logprobs(head, states, targets, chunk_rows=10_000)
    assert got_lp.shape == targets.shape and got_lp.dtype == torch.float32
    torch.testing.assert_close(got_lp, want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_ent, want_ent, rtol=1e-5, atol=1e-5)
    assert torch.equal(whole, want_lp)  # one chunk is the unchunked computation


def test_gradients_match_through_checkpointed_chunks(case) -> None:
    head, states, targets = case
    want_lp, want_ent = _reference(head, states, targets)
    (want_lp.sum() + 0.1 * want_ent.sum()).backward()
    want_states, want_head = states.grad.clone(), head.weight.grad.clone()
    states.grad, head.weight.grad = None, None
    got_lp, got_ent = chunked_token_logprobs(head, states, targets, chunk_rows=8, with_entropy=True)
    (got_lp.sum() + 0.1 * got_ent.sum()).backward()
    torch.testing.assert_close(states.grad, want_states, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(head.weight.grad, want_head, rtol=1e-4, atol=1e-6)


def test_shapes_are_checked(case) -> None:
    head, states, targets = case
    with pytest.raises(ValueError, match="do not match"):
        chunked_token_logprobs(head, states, targets[:, :-1])
    with pytest.raises(ValueError, match="chunk_rows"):
        chunked_token_logprobs(head, states, targets, chunk_rows=0)
