"""The vLLM engine's protocol sampler, without vLLM: ``ProtocolBatch`` follows vLLM's batch updates
(removed, added, moved, swapped) and leaves each protocol row exactly the token the protocol's sampler
picks at the row's output length, every other row untouched. vLLM itself is exercised on a GPU
(bench/gpu_engines.py, bench/cross_engine.py with a vLLM worker)."""

from __future__ import annotations

import enum
import math
from types import SimpleNamespace

import pytest
import torch

from intellect_node.node.engine.vllm_engine import SEED_ARG, TEMPERATURE_ARG, TOP_P_ARG, ProtocolBatch
from intellect_node.protocol.sampling import choose, key_tensor, position_key, sample

VOCAB = 300


class Direction(enum.Enum):  # the names of vLLM's MoveDirectionality
    UNIDIRECTIONAL = 1
    SWAP = 2


def params(seed: int | None, temperature: float = 1.0, top_p: float = 1.0) -> SimpleNamespace:
    extra = None if seed is None else {SEED_ARG: seed, TEMPERATURE_ARG: temperature, TOP_P_ARG: top_p}
    return SimpleNamespace(extra_args=extra)


def update(removed=(), added=(), moved=()) -> SimpleNamespace:
    return SimpleNamespace(batch_size=0, removed=list(removed), added=list(added), moved=list(moved))


def logits_for(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows)) * 3


def test_choose_with_derived_keys_is_sample() -> None:
    logits = logits_for(6)
    seeds, positions = [3, 4, 5, 6, 7, 8], [0, 1, 2, 9, 40, 7]
    keys = [position_key(s, p) for s, p in zip(seeds, positions)]
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        expected = sample(logits, seeds, positions, temperature, top_p)
        assert torch.equal(choose(logits, key_tensor(keys), temperature, top_p), expected)
        assert torch.equal(choose(logits, keys, temperature, top_p), expected)


def test_each_protocol_row_keeps_only_the_protocol_token_at_its_output_length() -> None:
    batch = ProtocolBatch()
    outputs = [[5, 6, 7], [], [9], [1, 2]]
    batch.update(update(added=[(0, params(11), [1], outputs[0]), (1, params(12, 0.6, 0.8), [1], outputs[1]),
                               (2, params(None), [1], outputs[2]), (3, params(13), [1], outputs[3])]))
    logits = logits_for(4)
    original = logits.clone()
    out = batch.apply(logits)
    for row, seed, temperature, top_p in ((0, 11, 1.0, 1.0), (1, 12, 0.6, 0.8), (3, 13, 1.0, 1.0)):
        expected = int(sample(original[row:row + 1], [seed], [len(outputs[row])], temperature, top_p))
        finite = torch.isfinite(out[row]).nonzero()[:, 0].tolist()
        assert finite == [expected]
        assert int(out[row].argmax()) == expected  # what vLLM's greedy choice then takes
    assert torch.equal(out[2], original[2])  # not a protocol request: vLLM's own

    outputs[0].append(int(out[0].argmax()))  # vLLM appends the token: the next step is position 4
    again = batch.apply(original.clone())
    assert int(again[0].argmax()) == int(sample(original[0:1], [11], [4], 1.0, 1.0))


def test_batch_updates_follow_removed_then_added_then_moved() -> None:
    batch = ProtocolBatch()
    a, b, c = [1], [1, 2], [1, 2, 3]
    batch.update(update(added=[(0, params(1), [], a), (1, params(2), [], b)]))
    # request 0 finishes and a new request takes its index in the same update
    batch.update(update(removed=[0], added=[(0, params(3), [], c)]))
    assert batch.rows[0][0] == 3 and batch.rows[1][0] == 2
    batch.update(update(moved=[(0, 1, Direction.SWAP)]))
    assert batch.rows[0][0] == 2 and batch.rows[1][0] == 3 and batch.rows[1][3] is c
    batch.update(update(moved=[(1, 4, Direction.UNIDIRECTIONAL)]))
    assert set(batch.rows) == {0, 4} and batch.rows[4][0] == 3
    batch.update(update(added=[(0, params(None), [], [])]))  # a request of vLLM's own takes index 0
    assert set(batch.rows) == {4}
    batch.update(None)  # no change this step
    assert set(batch.rows) == {4}


def test_no_protocol_rows_change_nothing() -> None:
    logits = logits_for(3)
    assert torch.equal(ProtocolBatch().apply(logits.clone()), logits)


@pytest.mark.parametrize("rows", [1, 17])
def test_many_rows_race_in_one_call_as_alone(rows: int) -> None:
    """Batching the race does not change any row's token (the protocol's batch independence)."""
    batch = ProtocolBatch()
    outputs = [[0] * (i % 5) for i in range(rows)]
    batch.update(update(added=[(i, params(100 + i), [], outputs[i]) for i in range(rows)]))
    logits = logits_for(rows)
    chosen = batch.apply(logits.clone()).argmax(dim=-1)
    for i in range(rows):
        assert int(chosen[i]) == int(sample(logits[i:i + 1], [100 + i], [len(outputs[i])], 1.0, 1.0))
        assert not math.isinf(float(logits[i, chosen[i]]))
