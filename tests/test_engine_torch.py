"""The torch engine against plain recomputation, its own prefill, seeds, stops and reloads."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from intellect_node.crypto.toploc import build_proofs, verify_proofs
from intellect_node.node.engine import EngineChoice, EngineUnavailable, build_engine, select_engine
from intellect_node.node.engine.base import Completion, SamplingParams, encode_prompt
from intellect_node.node.engine.proofs import PART_ROWS, build_completion_proofs
from intellect_node.node.engine.torch_engine import TorchEngine
from tests.support.engine_helpers import quick_tiny_model

PROMPTS = [
    "What is 12 + 34?",
    "Reverse the digits 98765. Think for 16 tokens before giving a response.",
    "What is 99 + 1? Think for 128 tokens before giving a response.",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return quick_tiny_model()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module", params=[False, True], ids=["exact-decode", "padded-decode"])
def engine(model_dir: Path, request: pytest.FixtureRequest) -> TorchEngine:
    """Each test runs on both decode shapes: the CPU's exact one and the GPU's padded one
    (static_decode: power-of-two row buckets, attention over the whole cache), here run eagerly."""
    return TorchEngine.from_checkpoint(model_dir, max_batch_rows=8, padded_decode=request.param)


@pytest.fixture(scope="module")
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    ids = [encode_prompt(tokenizer, p) for p in PROMPTS]
    assert len({len(p) for p in ids}) > 1, "prompts of different lengths exercise left padding"
    return ids


# no stop tokens: every completion runs to max_tokens, so long sequences are compared
FREE = SamplingParams(temperature=1.0, max_tokens=24, stop_token_ids=(), seed=11)


@pytest.fixture(scope="module")
def sampled(engine: TorchEngine, prompts: list[list[int]]) -> list[list[Completion]]:
    # n=3 with max_batch_rows=8: two chunks, the second with a single prompt
    return engine.generate(prompts, n=3, params=FREE)


def test_shapes_and_indices(sampled: list[list[Completion]], engine: TorchEngine) -> None:
    assert [len(group) for group in sampled] == [3, 3, 3]
    for p, group in enumerate(sampled):
        for j, c in enumerate(group):
            assert (c.prompt_index, c.sample_index) == (p, j)
            assert len(c.token_ids) == len(c.logprobs) == 24
            assert c.finish_reason == "length"
            assert c.hidden_states is not None
            assert c.hidden_states.shape == (24, engine.hidden_size)


def test_logprobs_and_hidden_states_match_a_plain_forward(
    sampled: list[list[Completion]], prompts: list[list[int]], model_dir: Path
) -> None:
    """Recompute each sequence alone with an independent HF model: no cache, no padding."""
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for group in sampled:
            for c in group:
                prompt = prompts[c.prompt_index]
                ids = torch.tensor([prompt + c.token_ids])
                out = reference(input_ids=ids, output_hidden_states=True)
                start = len(prompt) - 1
                rows = slice(start, start + len(c.token_ids))
                logprobs = torch.log_softmax(out.logits[0, rows].float(), dim=-1)
                expected = logprobs.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
                torch.testing.assert_close(
                    torch.tensor(c.logprobs), expected, atol=1e-4, rtol=1e-4
                )
                # hidden_states[-1] of HF is the post-norm state TOPLOC proves
                torch.testing.assert_close(
                    c.hidden_states, out.hidden_states[-1][0, rows], atol=1e-4, rtol=1e-4
                )


def test_prefill_reproduces_generation(
    engine: TorchEngine, sampled: list[list[Completion]], prompts: list[list[int]]
) -> None:
    """What a validator recomputes equals what the worker captured (proofs will verify)."""
    flat = [c for group in sampled for c in group]
    results = engine.prefill([prompts[c.prompt_index] for c in flat], [c.token_ids for c in flat])
    for c, r in zip(flat, results, strict=True):
        torch.testing.assert_close(r.hidden_states, c.hidden_states, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(r.logprobs, torch.tensor(c.logprobs), atol=1e-4, rtol=1e-4)
        # bf16 (what TOPLOC keeps) agrees on nearly every element
        same = r.hidden_states.bfloat16() == c.hidden_states.bfloat16()
        assert same.float().mean() > 0.99


def test_prefill_in_any_order_and_head_budget_matches_per_pair_prefill(
    engine: TorchEngine, sampled: list[list[Completion]], prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each prompt runs once for the rows that continue it: shuffled rows of mixed prompts, empty
    and one-token completions, and a head budget of one position (every completion its own
    span) give what each pair gives alone, replay margins included."""
    from intellect_node.node.engine import torch_prefill
    from intellect_node.protocol.sampling import Replay

    flat = [c for group in sampled for c in group]
    pairs = [(prompts[c.prompt_index], list(c.token_ids)) for c in flat]
    pairs += [(prompts[0], []), (prompts[1], list(flat[0].token_ids[:1])), (prompts[2], list(flat[3].token_ids[:2]))]
    order = list(reversed(range(len(pairs))))
    replays = [Replay(seed=7 + i, temperature=1.0, top_p=0.9, slack=1e-3) for i in range(len(pairs))]
    monkeypatch.setattr(torch_prefill, "HEAD_ELEMENTS", 1)
    together = engine.prefill([pairs[i][0] for i in order], [pairs[i][1] for i in order], [replays[i] for i in order])
    for i, got in zip(order, together, strict=True):
        (alone,) = engine.prefill([pairs[i][0]], [pairs[i][1]], [replays[i]])
        assert got.hidden_states.shape == (len(pairs[i][1]), alone.hidden_states.shape[-1])
        torch.testing.assert_close(got.hidden_states, alone.hidden_states, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.logprobs, alone.logprobs, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(got.sampling_margins, alone.sampling_margins, atol=1e-3)


def test_toploc_proofs_from_generation_verify_against_prefill(
    engine: TorchEngine, sampled: list[list[Completion]], prompts: list[list[int]]
) -> None:
    """A worker's proofs pass a validator's recomputation, with no measurable error at all.

    (Rejection of forgeries is crypto.toploc's to test: on a model this small, the top-k of the
    final hidden states hardly depends on the tokens, so a tampered completion is not a useful
    negative here.)
    """
    flat = [c for group in sampled for c in group]
    recomputed = engine.prefill(
        [prompts[c.prompt_index] for c in flat], [c.token_ids for c in flat]
    )
    for c, r in zip(flat, recomputed, strict=True):
        assert c.hidden_states is not None
        proofs = build_proofs(c.hidden_states)
        assert len(proofs) == 1  # 24 tokens: one (short) chunk of 32
        verdicts = verify_proofs(r.hidden_states, proofs)
        assert [v.ok for v in verdicts] == [True]
        assert verdicts[0].exp_mismatches == 0


def test_batched_proofs_equal_per_completion_proofs() -> None:
    generator = torch.Generator().manual_seed(0)
    lengths = [1, 5, 31, 32, 33, 64, 65, 100, 5, 33, 0]
    hidden = [torch.randn(n, 192, generator=generator) for n in lengths]
    assert build_completion_proofs(hidden) == [build_proofs(h) for h in hidden]


def test_proofs_of_a_batch_larger_than_one_part_are_the_same_bytes() -> None:
    """A GPU batch goes in parts of about PART_ROWS rows on threads: same proofs, same order."""
    generator = torch.Generator().manual_seed(1)
    lengths = [PART_ROWS + 7, 0, *[(37 * i) % 300 for i in range(60)], 1]  # a completion alone over a part, too
    hidden = [torch.randn(n, 192, generator=generator) for n in lengths]
    assert sum(lengths) > 3 * PART_ROWS
    assert build_completion_proofs(hidden) == [build_proofs(h) for h in hidden]


def test_prefill_of_a_tampered_completion_differs(
    engine: TorchEngine, sampled: list[list[Completion]], prompts: list[list[int]]
) -> None:
    c = sampled[0][0]
    tampered = list(c.token_ids)
    tampered[5] = (tampered[5] + 1) % engine.vocab_size
    (honest, forged) = engine.prefill([prompts[0]] * 2, [c.token_ids, tampered])
    assert torch.equal(honest.hidden_states[:6], forged.hidden_states[:6])  # causal: 0..5 same
    assert not torch.allclose(honest.hidden_states[6:], forged.hidden_states[6:], atol=1e-3)


def test_sampling_is_deterministic_per_seed(
    engine: TorchEngine, prompts: list[list[int]], sampled: list[list[Completion]]
) -> None:
    again = engine.generate(prompts, n=3, params=FREE, capture_hidden=False)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in sampled]
    assert all(c.hidden_states is None for g in again for c in g)
    other = engine.generate(prompts, n=3, params=SamplingParams(**{**FREE.__dict__, "seed": 12}))
    assert [c.token_ids for c in other[0]] != [c.token_ids for c in sampled[0]]
    # the n samples of one prompt differ from one another
    assert len({tuple(c.token_ids) for c in sampled[1]}) == 3


def test_completion_tokens_do_not_depend_on_batching(
    engine: TorchEngine, prompts: list[list[int]], sampled: list[list[Completion]]
) -> None:
    alone = engine.generate(prompts[:1], n=3, params=FREE)
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in sampled[0]]


def test_prompt_seeds_give_each_prompt_the_tokens_of_its_own_call(
    engine: TorchEngine, prompts: list[list[int]]
) -> None:
    """Rollout groups batched into one call (each with its counter's seed) sample what each would
    alone: the worker's batching is invisible to a verifier replaying one group."""
    seeds = (101, 202, 303)
    together = engine.generate(prompts, n=3, params=dataclasses.replace(FREE, prompt_seeds=seeds))
    for p, seed in enumerate(seeds):
        alone = engine.generate([prompts[p]], n=3, params=dataclasses.replace(FREE, seed=seed))
        assert [c.token_ids for c in together[p]] == [c.token_ids for c in alone[0]]
    with pytest.raises(ValueError, match="2 prompt_seeds for 3 prompts"):
        engine.generate(prompts, n=1, params=dataclasses.replace(FREE, prompt_seeds=seeds[:2]))
    with pytest.raises(ValueError, match="prompt_seeds"):
        SamplingParams(prompt_seeds=(2**64,))


def test_decode_cache_is_kept_padded_grows_and_is_freed_exact(model_dir: Path, prompts: list[list[int]]) -> None:
    """A padded decoder (a GPU's: its graphs are captured once) serves later calls that fit it and
    is replaced by a larger one for a call that does not; calls give the tokens a fresh engine
    gives whatever decoder they ran on. An exact decoder (a CPU's) is not kept."""
    short = dataclasses.replace(FREE, max_tokens=6)
    long = dataclasses.replace(FREE, max_tokens=90)  # past the first decoder's 64 columns
    padded = TorchEngine.from_checkpoint(model_dir, max_batch_rows=8, padded_decode=True)
    first = padded.generate(prompts[:1], n=2, params=short)
    small = padded._decoder
    assert small is not None and (small.capacity, small.length) == (8, 64)
    second = padded.generate(prompts, n=2, params=long)
    large = padded._decoder
    assert large is not small and large.capacity == 8 and large.length >= 90 + max(map(len, prompts))
    third = padded.generate(prompts[:1], n=2, params=short)
    assert padded._decoder is large
    exact = TorchEngine.from_checkpoint(model_dir, max_batch_rows=8, padded_decode=False)
    for params, prompt_set, got in ((short, prompts[:1], first), (long, prompts, second), (short, prompts[:1], third)):
        assert [[c.token_ids for c in g] for g in got] == [
            [c.token_ids for c in g] for g in exact.generate(prompt_set, n=2, params=params)
        ]
        assert exact._decoder is None


def test_greedy_ignores_seed_and_tiny_top_p_is_greedy(
    engine: TorchEngine, prompts: list[list[int]]
) -> None:
    greedy = [
        engine.generate(prompts, n=1, params=SamplingParams(0.0, 1.0, 12, (), seed))
        for seed in (1, 2)
    ]
    assert [g[0].token_ids for g in greedy[0]] == [g[0].token_ids for g in greedy[1]]
    nucleus = engine.generate(prompts, n=1, params=SamplingParams(1.0, 1e-6, 12, (), 3))
    assert [g[0].token_ids for g in nucleus] == [g[0].token_ids for g in greedy[0]]


def test_stop_token_ends_a_completion(
    engine: TorchEngine, prompts: list[list[int]], sampled: list[list[Completion]]
) -> None:
    """Pick a token each free-running completion emits mid-way and make it the stop token."""
    reference = sampled[1]
    stop = reference[0].token_ids[7]
    params = SamplingParams(**{**FREE.__dict__, "stop_token_ids": (stop,)})
    stopped = engine.generate(prompts, n=3, params=params)
    for free, c in zip(reference, stopped[1], strict=True):
        if stop in free.token_ids:
            cut = free.token_ids.index(stop) + 1
            assert c.finish_reason == "stop"
            assert c.token_ids == free.token_ids[:cut]  # the stop token kept, nothing after it
            assert c.hidden_states is not None and c.hidden_states.shape[0] == cut
            torch.testing.assert_close(c.hidden_states, free.hidden_states[:cut], atol=1e-5, rtol=0)
        else:
            assert c.finish_reason == "length" and c.token_ids == free.token_ids
    assert stopped[1][0].finish_reason == "stop"


def test_eos_is_the_default_stop(engine: TorchEngine, prompts: list[list[int]]) -> None:
    out = engine.generate(prompts, n=4, params=SamplingParams(max_tokens=30, seed=5))
    for c in (c for g in out for c in g):
        eos_at = [i for i, t in enumerate(c.token_ids) if t in engine.eos_token_ids]
        if c.finish_reason == "stop":
            assert eos_at == [len(c.token_ids) - 1]
        else:
            assert not eos_at and len(c.token_ids) == 30
    assert any(c.finish_reason == "stop" for g in out for c in g)  # the model learned to stop


def test_max_tokens_one(engine: TorchEngine, prompts: list[list[int]]) -> None:
    out = engine.generate(prompts, n=2, params=SamplingParams(max_tokens=1, stop_token_ids=()))
    assert all(len(c.token_ids) == 1 and c.finish_reason == "length" for g in out for c in g)


def test_reload_weights_in_place(
    model_dir: Path, prompts: list[list[int]], tmp_path: Path
) -> None:
    engine = TorchEngine.from_checkpoint(model_dir)
    before = engine.generate(prompts, n=2, params=FREE, capture_hidden=False)
    perturbed_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in perturbed_model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    perturbed_model.save_pretrained(tmp_path)
    engine.load_checkpoint(tmp_path)  # same object, new weights (tied head omitted on disk)
    after = engine.generate(prompts, n=2, params=FREE, capture_hidden=False)
    fresh = TorchEngine.from_checkpoint(tmp_path).generate(prompts, n=2, params=FREE)
    tokens = [[c.token_ids for c in g] for g in after]
    assert tokens == [[c.token_ids for c in g] for g in fresh]
    assert tokens != [[c.token_ids for c in g] for g in before]


def test_reload_refuses_a_mismatched_state_dict(engine: TorchEngine) -> None:
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    snapshot = {k: v.clone() for k, v in state.items()}
    broken = dict(state)
    broken.pop("model.norm.weight")
    with pytest.raises(ValueError, match="missing"):
        engine.load_state_dict(broken)
    wrong = {k: torch.zeros(1) if k == "model.norm.weight" else v for k, v in state.items()}
    with pytest.raises(ValueError, match="wrong shape"):
        engine.load_state_dict(wrong)
    extra = state | {"model.extra.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="unknown"):
        engine.load_state_dict(extra)
    for k, v in engine.model.state_dict().items():  # nothing was half-loaded
        assert torch.equal(v, snapshot[k])


def test_bad_requests(engine: TorchEngine, prompts: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], n=1, params=FREE)
    with pytest.raises(ValueError, match="positions"):
        engine.generate(prompts, n=1, params=SamplingParams(max_tokens=10_000))
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[engine.vocab_size]], n=1, params=FREE)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)


def test_select_engine() -> None:
    assert select_engine("torch") is TorchEngine
    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM can run here: auto would rightly pick it")
    assert select_engine("auto") is TorchEngine
    with pytest.raises(EngineUnavailable, match="vllm"):
        select_engine("vllm")
    with pytest.raises(ValueError):
        select_engine("tensorrt")


@pytest.mark.parametrize("text,expected", [
    ("torch", EngineChoice("torch")), ("torch:bfloat16", EngineChoice("torch", "bfloat16")),
    ("auto", EngineChoice("auto")), ("vllm:float16", EngineChoice("vllm", "float16")),
])
def test_engine_choices_parse(text: str, expected: EngineChoice) -> None:
    assert EngineChoice.parse(text) == expected


@pytest.mark.parametrize("text,match", [("tensorrt", "unknown engine"), ("torch:fp8", "unknown precision"),
                                        ("torch:", "unknown precision"), ("", "unknown engine")])
def test_bad_engine_choices_name_the_part_that_is_wrong(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineChoice.parse(text)


def test_build_engine_loads_the_chosen_precision(model_dir: Path) -> None:
    assert build_engine("torch", model_dir, device="cpu").dtype == torch.float32
    bf16 = build_engine("torch:bfloat16", model_dir, device="cpu")
    assert bf16.dtype == torch.bfloat16 and bf16.name == "torch"  # batches name the engine, not its precision
