"""VllmEngine's bookkeeping around vLLM, with a stand-in for vLLM (no GPU here; the real one runs in
bench/gpu_engines.py and bench/cross_engine.py on a lent GPU).

The stand-in does what vLLM's engine does to the parts the engine relies on: it keeps a persistent
batch whose rows it moves and swaps between steps (and tells the logits processor so), runs the real
model for every scheduled request, hands ``compute_logits`` the final-norm rows in batch order, lets
the processor pick the token, and, as asynchronous scheduling does, runs one step past a stop before
it drops the request. The engine's completions must then be what the verifier's prefill replays: the
protocol's tokens, each hidden state and log-probability at its position."""

from __future__ import annotations

import copy
import random
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from intellect_node.node.engine.base import SamplingParams
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.engine.vllm_engine import ProtocolBatch, VllmEngine
from intellect_node.protocol.sampling import Replay
from tests.support.engine_helpers import quick_tiny_model


class Direction:
    """vLLM's MoveDirectionality, by name."""

    def __init__(self, name: str) -> None:
        self.name = name


class StandInModel:
    """The model as ``apply_model`` hands it over: ``compute_logits`` on final-norm rows, and
    ``load_weights`` taking HF-named tensors in place."""

    def __init__(self, hf: torch.nn.Module) -> None:
        self.hf = hf

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(hidden_states)

    def load_weights(self, weights) -> set[str]:  # noqa: ANN001 - vLLM's signature
        self.hf.load_state_dict(dict(weights), strict=False)
        return set()


class StandInLLM:
    """``vllm.LLM`` as VllmEngine uses it, over a real (tiny) model, one token per request per step."""

    def __init__(self, hf: torch.nn.Module, batch: ProtocolBatch, seed: int) -> None:
        self.model = StandInModel(hf)
        self.batch = batch
        self.rng = random.Random(seed)
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(dtype=next(hf.parameters()).dtype,
                                                                      max_model_len=hf.config.max_position_embeddings))
        self.cut_at: int | None = None  # vLLM's LENGTH_CAPPED: a completion cut short yet reported as "length"
        self.steps_past_stop = 0  # rows run past their stop (their capture must not be taken)
        self.prefix_cache_resets, self.prefix_cache_clears = 0, True

    def apply_model(self, func):  # noqa: ANN001, ANN201 - vLLM's signature
        return [func(self.model)]

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        return self.prefix_cache_clears

    def generate(self, requests: list, params: list, use_tqdm: bool = False) -> list:
        outputs = [[] for _ in requests]
        finish: list[str | None] = [None] * len(requests)
        slots = list(range(len(requests)))  # batch index -> request
        self.batch.update(SimpleNamespace(removed=[], moved=[], added=[
            (i, params[i], requests[i]["prompt_token_ids"], outputs[i]) for i in slots]))
        past_stop: set[int] = set()
        while slots:
            if len(slots) > 1:  # vLLM reorders its persistent batch between steps
                a, b = self.rng.sample(range(len(slots)), 2)
                slots[a], slots[b] = slots[b], slots[a]
                self.batch.update(SimpleNamespace(removed=[], added=[], moved=[(a, b, Direction("SWAP"))]))
            with torch.inference_mode():
                states = [self.model.hf.model(input_ids=torch.tensor([requests[r]["prompt_token_ids"] + [
                    t for t in outputs[r]]])).last_hidden_state[0, -1] for r in slots]
                hidden = torch.stack(states)
                logits = self.model.compute_logits(hidden).float()  # compute_logits wrapped by the engine
                chosen = self.batch.apply(logits).argmax(dim=-1).tolist()  # vLLM samples under inference mode
            removed = []
            for index, r in enumerate(slots):
                if r in past_stop:  # the queued step past a stop: its token is dropped
                    removed.append(index)
                    self.steps_past_stop += 1
                    continue
                outputs[r].append(chosen[index])
                if chosen[index] in params[r].stop_token_ids:
                    finish[r] = "stop"
                    past_stop.add(r)
                elif len(outputs[r]) in (params[r].max_tokens, self.cut_at):
                    finish[r] = "length"
                    removed.append(index)
            slots = [r for index, r in enumerate(slots) if index not in removed]
            # vLLM compacts: the remaining requests take indices 0..len-1 (told as a fresh batch here)
            self.batch.update(SimpleNamespace(removed=list(range(len(slots) + len(removed))), moved=[], added=[
                (i, params[r], requests[r]["prompt_token_ids"], outputs[r]) for i, r in enumerate(slots)]))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=outputs[i], finish_reason=finish[i])])
                for i in range(len(requests))]


@pytest.fixture()
def standin_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vllm.SamplingParams`` and ``vllm.inputs.TokensPrompt`` as plain records."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **fields: SimpleNamespace(**fields)  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


def engine_over_standin(seed: int) -> tuple[VllmEngine, StandInLLM]:
    verifier = TorchEngine.from_checkpoint(quick_tiny_model(), device="cpu")
    batch = ProtocolBatch()
    llm = StandInLLM(copy.deepcopy(verifier.model), batch, seed)  # vLLM holds its own copy of the weights
    return VllmEngine(llm, batch, verifier), llm


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_completions_replay_on_the_verifier_with_their_own_hidden_states(standin_vllm: None, temperature: float,
                                                                         top_p: float) -> None:
    engine, llm = engine_over_standin(seed=3)
    prompts = [[1, 5, 6, 7], [1, 9, 8], [1, 4]]
    eos = engine.eos_token_ids
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=12, seed=11)
    groups = engine.generate(prompts, 3, params)
    assert [[c.sample_index for c in g] for g in groups] == [[0, 1, 2]] * 3
    rows = [(p, c) for p, g in enumerate(groups) for c in g]
    replays = ([Replay(params.completion_seed(p, 3, c.sample_index), temperature, top_p, 0.0) for p, c in rows]
               if temperature else None)
    again = engine.prefill([prompts[p] for p, _ in rows], [c.token_ids for _, c in rows], replays)
    for (_, c), r in zip(rows, again, strict=True):
        assert 1 <= len(c.token_ids) <= 12
        assert c.finish_reason == ("stop" if c.token_ids[-1] in eos else "length")
        assert c.hidden_states is not None and c.hidden_states.shape == (len(c.token_ids), engine.hidden_size)
        assert torch.allclose(c.hidden_states, r.hidden_states, atol=1e-4)
        assert torch.allclose(torch.tensor(c.logprobs), r.logprobs, atol=1e-4)
        if temperature:
            assert float(r.sampling_margins.min()) >= -1e-4  # every token is the protocol's choice
    if not temperature:  # greedy: the argmax at every position, as the torch engine takes it
        torch_groups = engine.verifier.generate(prompts, 3, params, capture_hidden=False)
        assert [[c.token_ids for c in g] for g in groups] == [[c.token_ids for c in g] for g in torch_groups]
    assert llm.steps_past_stop == sum(c.finish_reason == "stop" for _, c in rows) > 0


def test_tokens_are_the_torch_engines_for_the_same_seeds(standin_vllm: None) -> None:
    """The protocol's sampler gives the same tokens in either engine (one model, one precision)."""
    engine, _ = engine_over_standin(seed=5)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=4, stop_token_ids=())
    ours = engine.generate([[1, 5, 6]], 4, params, capture_hidden=False)
    torch_engine = engine.verifier.generate([[1, 5, 6]], 4, params, capture_hidden=False)
    assert [c.token_ids for c in ours[0]] == [c.token_ids for c in torch_engine[0]]
    assert all(c.hidden_states is None and len(c.token_ids) == 10 for c in ours[0])


def test_a_position_the_sampler_never_saw_is_an_error(standin_vllm: None) -> None:
    engine, llm = engine_over_standin(seed=1)
    real = llm.batch.apply
    llm.batch.apply = lambda logits: logits  # a vLLM that samples without the processor
    with pytest.raises(RuntimeError, match="never saw"):
        engine.generate([[1, 5]], 1, SamplingParams(temperature=1.0, max_tokens=3, seed=1, stop_token_ids=()))
    llm.batch.apply = real


def test_a_completion_cut_short_is_an_error_and_the_engine_refuses_further_calls(standin_vllm: None) -> None:
    engine, llm = engine_over_standin(seed=2)
    llm.cut_at = 3
    with pytest.raises(RuntimeError, match="'length' after 3 of 8 tokens"):
        engine.generate([[1, 5]], 2, SamplingParams(temperature=1.0, max_tokens=8, seed=1, stop_token_ids=()))
    llm.cut_at = None
    llm.generate = lambda *args, **kwargs: (_ for _ in ()).throw(MemoryError("CUDA out of memory"))
    with pytest.raises(MemoryError):
        engine.generate([[1, 5]], 1, SamplingParams(temperature=1.0, max_tokens=2, seed=1))
    with pytest.raises(RuntimeError, match="failed earlier .*out of memory"):
        engine.generate([[1, 5]], 1, SamplingParams(temperature=1.0, max_tokens=2, seed=1))


def test_a_prompt_that_leaves_no_room_for_max_tokens_is_refused(standin_vllm: None) -> None:
    engine, _ = engine_over_standin(seed=2)
    room = engine.verifier.max_positions
    with pytest.raises(ValueError, match="exceeds vLLM's max_model_len"):
        engine.generate([[1] * (room - 3)], 1, SamplingParams(temperature=1.0, max_tokens=4, seed=1))


def test_new_weights_reach_vllm_and_the_verifier_and_bad_ones_reach_neither(standin_vllm: None) -> None:
    engine, llm = engine_over_standin(seed=4)
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3, stop_token_ids=())
    before = [c.token_ids for c in engine.generate([[1, 5, 6]], 4, params)[0]]
    generator = torch.Generator().manual_seed(0)
    new = {name: value + 0.5 * torch.randn(value.shape, generator=generator)
           for name, value in engine.verifier.model.state_dict().items()}
    wrong = dict(new)
    wrong["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="wrong shape"):
        engine.load_state_dict(wrong)
    assert llm.prefix_cache_resets == 0
    assert [c.token_ids for c in engine.generate([[1, 5, 6]], 4, params)[0]] == before  # nothing changed
    engine.load_state_dict(new)
    assert llm.prefix_cache_resets == 1
    for name, value in llm.model.hf.state_dict().items():
        assert torch.equal(value, engine.verifier.model.state_dict()[name])
    groups = engine.generate([[1, 5, 6]], 4, params)
    assert [c.token_ids for c in groups[0]] != before
    replays = [Replay(params.completion_seed(0, 4, j), 1.0, 1.0, 0.0) for j in range(4)]
    again = engine.prefill([[1, 5, 6]] * 4, [c.token_ids for c in groups[0]], replays)
    assert min(float(r.sampling_margins.min()) for r in again) >= -1e-4  # tokens of the new weights
    llm.prefix_cache_clears = False
    with pytest.raises(RuntimeError, match="prefix cache"):
        engine.load_state_dict(new)
