"""A worker's batch, built by the real torch engine, checks out against a prefill recomputation."""


import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from intellect_node.crypto.identity import Identity
from intellect_node.crypto.toploc import verify_proofs
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.tasks.toy import generate_toy_tasks
from intellect_node.protocol import codec
from intellect_node.protocol.assignment import task_index
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import RolloutBatch, proof_key, unpack_logprobs, unpack_tokens
from tests.support.engine_helpers import wide_tiny_model

WORKER = Identity.generate()


SETTINGS = RolloutShape(group_size=3, groups_per_batch=2, max_tokens=40)


@pytest.fixture(scope="module")
def built():
    torch.set_num_threads(2)
    model = wide_tiny_model()
    engine = TorchEngine.from_checkpoint(model, max_batch_rows=8)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = generate_toy_tasks(seed=5, count=50)
    result = build_batch(engine, tokenizer, tasks, run_id="r", worker=WORKER.peer_id, step=4,
                         manifest_hash=bytes(32), first_counter=10, settings=SETTINGS)
    return engine, tasks, result


def test_batch_is_a_valid_signed_wire_message_with_assigned_tasks(built):
    _, tasks, result = built
    decoded = codec.decode(codec.encode(result.batch, WORKER, lifetime_s=600), RolloutBatch).message
    assert decoded == result.batch
    assert [g.counter for g in decoded.groups] == [10, 11]
    for group in decoded.groups:
        assert group.task_id == tasks[task_index("r", WORKER.peer_id, 4, group.counter, len(tasks),
                                               beacon=decoded.manifest_hash)].problem_id
        assert len(group.completions) == SETTINGS.group_size
    assert result.generated_tokens == sum(c.num_tokens for g in decoded.groups for c in g.completions)


def test_proofs_and_logprobs_match_a_prefill_with_the_same_checkpoint(built):
    engine, _, result = built
    for group in result.batch.groups:
        prompt = unpack_tokens(group.prompt_ids).tolist()
        completions = [unpack_tokens(c.token_ids).tolist() for c in group.completions]
        recomputed = engine.prefill([prompt] * len(completions), completions)
        for record, again in zip(group.completions, recomputed, strict=True):
            key = proof_key(result.batch.manifest_hash, result.batch.policy_step, group.prompt_ids, record.token_ids)
            verdicts = verify_proofs(again.hidden_states, list(record.proofs), key=key)
            assert all(v.ok for v in verdicts), verdicts
            assert np.allclose(unpack_logprobs(record.logprobs), again.logprobs.numpy(), atol=1e-4)


def test_proofs_do_not_verify_against_other_weights(built):
    engine, _, result = built
    other = TorchEngine.from_checkpoint(wide_tiny_model(), max_batch_rows=8)
    with torch.no_grad():
        for parameter in other.model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3 * parameter.abs())  # other weights
    group = result.batch.groups[0]
    record = group.completions[0]
    again = other.prefill([unpack_tokens(group.prompt_ids).tolist()], [unpack_tokens(record.token_ids).tolist()])[0]
    key = proof_key(result.batch.manifest_hash, result.batch.policy_step, group.prompt_ids, record.token_ids)
    assert not all(v.ok for v in verify_proofs(again.hidden_states, list(record.proofs), key=key))
