"""The static decoder against transformers' own decode, in both of its shapes."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from intellect_node.node.engine.static_decode import StaticDecoder, bucket_rows
from tests.support.decode_reference import feed, prompt_run, static_decode, transformers_decode

VOCAB = 97


def _llama() -> PreTrainedModel:
    """Grouped-query attention with three query heads per key/value head."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


def _qwen2() -> PreTrainedModel:
    """Biased query/key/value projections, tied embeddings."""
    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


MODELS = {"llama": _llama, "qwen2": _qwen2}
PROMPTS = [[5, 17, 3], [40, 2, 2, 9, 61, 7, 11], [8], [33, 34, 35, 36, 37]]
STEPS = 12


DROPS = {3: [0, 2, 3], 7: [2], 10: [0]}  # 4 live rows, then 3, then 1 (across the padded buckets 4, 4, 1)


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded"])
@pytest.mark.parametrize("name", MODELS)
def test_decode_is_transformers_decode(name: str, padded: bool) -> None:
    """Exact shapes are transformers' decode bit for bit (on a CPU generation's numbers do not move:
    the calibrated tolerances stay what they measured); padded ones (padding rows, masked future
    columns) differ by summation order only."""
    model = MODELS[name]()
    with torch.inference_mode():
        expected = transformers_decode(model, PROMPTS, STEPS, DROPS)
        got, _ = static_decode(model, PROMPTS, STEPS, DROPS, padded=padded)
    tolerance = 1e-5 if padded else 0.0
    for step, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert want.shape == have.shape
        torch.testing.assert_close(have, want, rtol=tolerance, atol=tolerance, msg=f"step {step}")


def test_padding_rows_do_not_reach_live_rows() -> None:
    """Whatever the padding rows hold (here: huge keys and values), the live rows' states are theirs."""
    model = _llama()
    with torch.inference_mode():
        clean, _ = static_decode(model, PROMPTS[:3], STEPS, padded=True)
        mask, cache = prompt_run(model, PROMPTS[:3])
        decoder = StaticDecoder(model, capacity=8, length=mask.shape[1] + STEPS + 5, padded=True)
        decoder.load_prompts(cache, mask, repeats=1)
        for buffer in (*decoder.keys, *decoder.values):
            buffer[3:] = 1e4  # row 3 pads the bucket of 4; rows 4-7 are outside it
        decoder.valid[3:] = False
        lengths = torch.tensor([len(p) for p in PROMPTS[:3]])
        for step in range(STEPS):
            state = decoder.step(feed(step, 3, model), lengths + step, mask.shape[1] + step)
            assert torch.isfinite(state).all()
            torch.testing.assert_close(state, clean[step], rtol=0, atol=0)


def test_an_earlier_calls_columns_do_not_reach_a_padded_step() -> None:
    """A kept padded decoder reads every column of its buffers, masked or not: whatever an earlier
    call left past the new prompts (here inf, which a mask alone turns into NaN) is cleared."""
    model = _llama()
    with torch.inference_mode():
        clean, _ = static_decode(model, PROMPTS, STEPS, padded=True)
        mask, cache = prompt_run(model, PROMPTS)
        decoder = StaticDecoder(model, capacity=8, length=mask.shape[1] + STEPS + 5, padded=True)
        for buffer in (*decoder.keys, *decoder.values):
            buffer.fill_(float("inf"))
        decoder.positions.fill_(10_000)
        decoder.load_prompts(cache, mask, repeats=1)
        lengths = torch.tensor([len(p) for p in PROMPTS])
        for step in range(STEPS):
            state = decoder.step(feed(step, 4, model), lengths + step, mask.shape[1] + step)
            torch.testing.assert_close(state, clean[step], rtol=0, atol=0)
    assert not decoder.positions[4:].any()  # padding rows' positions are 0, not a stale large one


def test_repeated_prompts_and_bucket_sizes() -> None:
    model = _qwen2()
    with torch.inference_mode():
        mask, cache = prompt_run(model, PROMPTS[:2])
        decoder = StaticDecoder(model, capacity=8, length=32, padded=True)
        decoder.load_prompts(cache, mask, repeats=3)
        assert decoder.live == 6
        width = mask.shape[1]
        state = decoder.step(torch.tensor([4] * 6), torch.tensor([3] * 3 + [7] * 3), width)
    # the three rows of each prompt fed the same token are the same row
    assert torch.equal(state[0], state[2]) and torch.equal(state[3], state[5])
    assert not torch.equal(state[0], state[3])
    assert [bucket_rows(r, 8) for r in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert bucket_rows(9, 12) == 12


def test_bad_calls_are_refused() -> None:
    model = _qwen2()
    with torch.inference_mode():
        mask, cache = prompt_run(model, PROMPTS)
        with pytest.raises(ValueError, match="do not fit"):
            StaticDecoder(model, capacity=3, length=32, padded=False).load_prompts(cache, mask, repeats=1)
        with pytest.raises(ValueError, match="do not fit"):
            StaticDecoder(model, capacity=8, length=mask.shape[1], padded=False).load_prompts(cache, mask, 1)
        decoder = StaticDecoder(model, capacity=8, length=16, padded=False)
        decoder.load_prompts(cache, mask, repeats=1)
        with pytest.raises(ValueError, match="live rows"):
            decoder.step(torch.tensor([1, 2]), torch.tensor([3, 4]), mask.shape[1])
        with pytest.raises(ValueError, match="column"):
            decoder.step(feed(0, 4, model), torch.tensor([3, 7, 1, 5]), 16)


def test_sliding_window_models_are_refused() -> None:
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                         sliding_window=8, max_window_layers=1)
    with pytest.raises(ValueError, match="full attention only"):
        StaticDecoder(Qwen2ForCausalLM(config), capacity=4, length=16, padded=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_replay_the_padded_step(dtype: torch.dtype) -> None:
    """On a GPU: captured graphs give what the eager padded step gives, across row buckets, and a
    decoder reused for a second call replays its graphs on the new prompts."""
    model = _llama().to(device="cuda", dtype=dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        eager, _ = static_decode(model, PROMPTS, STEPS, DROPS, padded=True)
        graphed, decoder = static_decode(model, PROMPTS, STEPS, DROPS, padded=True, cuda_graphs=True)
        assert decoder.cuda_graphs and set(decoder._graphs) == {4, 1}  # captured, not fallen back
        for step, (want, have) in enumerate(zip(eager, graphed, strict=True)):
            torch.testing.assert_close(have, want, rtol=tolerance, atol=tolerance, msg=f"step {step}")
        # the same decoder, a second call: other prompts, no rows dropped
        others = [p[::-1] for p in PROMPTS]
        mask, cache = prompt_run(model, others)
        decoder.load_prompts(cache, mask, repeats=1)
        lengths = torch.tensor([len(p) for p in others], device="cuda")
        again, _ = static_decode(model, others, STEPS, padded=True)
        for step in range(STEPS):
            state = decoder.step(feed(step, 4, model), lengths + step, mask.shape[1] + step)
            torch.testing.assert_close(state, again[step], rtol=tolerance, atol=tolerance, msg=f"second call, {step}")
