"""The vLLM engine's protocol sampler and capture, without vLLM: ``ProtocolBatch`` follows vLLM's
batch updates (removed, added, moved, swapped), leaves each of the engine's rows exactly the token the
protocol's sampler picks at the row's output length (greedy rows the argmax), records the row's hidden
state and raw log-probability at (slot, position), and leaves every other row untouched. vLLM itself
is exercised on a GPU (bench/gpu_engines.py, bench/cross_engine.py with a vLLM worker)."""

from __future__ import annotations

import enum
import math
from types import SimpleNamespace

import pytest
import torch

from intellect_node.node.engine.vllm_engine import (
    SEED_ARG,
    SLOT_ARG,
    TEMPERATURE_ARG,
    TOP_P_ARG,
    Capture,
    ProtocolBatch,
)
from intellect_node.protocol.sampling import choose, key_tensor, position_key, sample

VOCAB = 300


class Direction(enum.Enum):  # the names of vLLM's MoveDirectionality
    UNIDIRECTIONAL = 1
    SWAP = 2


def params(seed: int | None, temperature: float = 1.0, top_p: float = 1.0, slot: int | None = 0,
           greedy: bool = False) -> SimpleNamespace:
    """A request's parameters as the engine sets them: no slot is a request of vLLM's own."""
    if slot is None:
        return SimpleNamespace(extra_args=None)
    extra = {SLOT_ARG: slot}
    if not greedy:
        extra.update({SEED_ARG: seed, TEMPERATURE_ARG: temperature, TOP_P_ARG: top_p})
    return SimpleNamespace(extra_args=extra)


def update(removed=(), added=(), moved=()) -> SimpleNamespace:
    return SimpleNamespace(batch_size=0, removed=list(removed), added=list(added), moved=list(moved))


def logits_for(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows)) * 3


def test_choose_with_derived_keys_is_sample() -> None:
    logits = logits_for(6)
    seeds, positions = [3, 4, 5, 6, 7, 8], [0, 1, 2, 9, 40, 7]
    keys = [position_key(s, p) for s, p in zip(seeds, positions, strict=True)]
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        expected = sample(logits, seeds, positions, temperature, top_p)
        assert torch.equal(choose(logits, key_tensor(keys), temperature, top_p), expected)
        assert torch.equal(choose(logits, keys, temperature, top_p), expected)


def test_each_protocol_row_keeps_only_the_protocol_token_at_its_output_length() -> None:
    batch = ProtocolBatch()
    outputs = [[5, 6, 7], [], [9], [1, 2]]
    batch.update(update(added=[(0, params(11), [1], outputs[0]), (1, params(12, 0.6, 0.8), [1], outputs[1]),
                               (2, params(None, slot=None), [1], outputs[2]), (3, params(13), [1], outputs[3])]))
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
    assert batch.rows[0].seed == 3 and batch.rows[1].seed == 2
    batch.update(update(moved=[(0, 1, Direction.SWAP)]))
    assert batch.rows[0].seed == 2 and batch.rows[1].seed == 3 and batch.rows[1].output is c
    batch.update(update(moved=[(1, 4, Direction.UNIDIRECTIONAL)]))
    assert set(batch.rows) == {0, 4} and batch.rows[4].seed == 3
    batch.update(update(added=[(0, params(None, slot=None), [], [])]))  # a request of vLLM's own takes index 0
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


def test_capture_records_each_rows_hidden_state_and_raw_logprob_at_its_slot_and_position() -> None:
    batch = ProtocolBatch()
    outputs = [[4, 4], [], [7]]
    batch.update(update(added=[(0, params(21, slot=2), [], outputs[0]), (1, params(None, slot=None), [], []),
                               (2, params(None, slot=0, greedy=True), [], outputs[1]),
                               (3, params(22, 0.5, 0.9, slot=1), [], outputs[2])]))
    batch.capture = Capture.empty(3, 4, 8, torch.bfloat16, "cpu")
    logits, hidden = logits_for(4), torch.randn(4, 8)
    original = logits.clone()
    batch.take_hidden(hidden)
    tokens = batch.apply(logits).argmax(dim=-1)
    assert int(tokens[2]) == int(original[2].argmax())  # the greedy row: vLLM's own choice
    assert int(tokens[3]) == int(sample(original[3:4], [22], [1], 0.5, 0.9))
    for row, slot, position in ((0, 2, 2), (2, 0, 0), (3, 1, 1)):
        assert torch.equal(batch.capture.hidden[slot, position], hidden[row].to(torch.bfloat16))
        expected = torch.log_softmax(original[row], dim=-1)[tokens[row]]  # raw: no temperature, no top-p
        assert math.isclose(float(batch.capture.logprobs[slot, position]), float(expected), rel_tol=1e-6)
    assert int(batch.capture.written.sum()) == 3
    assert batch.hidden is None  # a step's rows are used once


def test_a_position_past_the_capture_lands_in_the_spare_column() -> None:
    """Asynchronous scheduling may run one step past a stop; its row must not overwrite a real one."""
    batch = ProtocolBatch()
    output = [1] * 9  # max_tokens 4: positions 0-3 are real, column 4 is spare
    batch.update(update(added=[(0, params(5, slot=0), [], output)]))
    batch.capture = Capture.empty(1, 4, 8, torch.float32, "cpu")
    batch.take_hidden(torch.ones(1, 8))
    batch.apply(logits_for(1))
    assert batch.capture.written[0].tolist() == [False, False, False, False, True]


def test_a_step_without_its_hidden_rows_is_an_error() -> None:
    batch = ProtocolBatch()
    batch.update(update(added=[(0, params(5, slot=0), [], [])]))
    batch.capture = Capture.empty(1, 4, 8, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="compute_logits"):
        batch.apply(logits_for(1))
