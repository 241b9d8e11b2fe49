"""The GPU engine: vLLM generates with the protocol's sampler and hands over its own hidden states.

Why not a forward hook. vLLM is fast because its forward runs as captured CUDA graphs over a
flattened batch of every scheduled request's tokens; a hook does not run inside a graph. The first
version of this engine hooked the final norm with ``enforce_eager`` (no graphs) and ran a separate
prefill per completion to map rows to requests: 0.032x of plain vLLM on an H200. Here vLLM runs as
it does for anyone (graphs, prefix caching, asynchronous scheduling) and two things are ours, both
outside the graph and both in the order of vLLM's persistent batch:

- the model's ``compute_logits`` is wrapped (``_capture_hidden``): it receives one final-norm row
  per scheduled request (the row the next token is sampled from) and leaves it with ``ProtocolBatch``;
- ``ProtocolBatch``, run by ``_ProtocolSampler`` (vLLM's v1 ``LogitsProcessor``, which sees the raw
  float32 logits of the same rows next), races the protocol sampler (``protocol.sampling.choose``)
  over every protocol row of the step in one call on the GPU (greedy rows take the argmax), writes
  each row's hidden state and raw log-probability into the call's ``Capture`` at the request's
  position, and leaves the chosen token the only finite logit: vLLM samples greedily, so its
  sampler takes that token.

A request's position is its output length (vLLM's live list, asynchronous placeholders included):
it depends on neither batching nor scheduling. A step vLLM runs for a request that is not sampled
from (a chunk of a long prompt, a step past a stop that asynchronous scheduling already queued) writes
a position the request later overwrites, or the spare last column; every position a completion has
must be written, or ``generate`` raises.

Verification (``prefill``) runs on ``verifier``, a ``TorchEngine`` holding the same weights in the same
precision on the same GPU: the prompts once per group, ``completion[:-1]`` after its cache. That is
a second copy of the weights (2 bytes per parameter in bf16) next to vLLM's share of the GPU
(``gpu_memory_utilization``, 0.6 by default, leaves the verifier room). The run spec's vllm/torch pair
is calibrated on exactly these figures (``intellect-node calibrate``, bench/cross_engine.py).

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the processor, the
wrapper and the weights handed to ``load_state_dict`` then share objects by reference, not pickling.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch

from intellect_node.node.engine.base import (
    Completion,
    Engine,
    FinishReason,
    PrefillResult,
    SamplingParams,
    check_prompts,
)
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.protocol.sampling import Replay, choose, key_tensor, position_key

SLOT_ARG = "ina_slot"  # SamplingParams.extra_args keys: the request's row in the call's Capture,
SEED_ARG = "ina_seed"  # and (sampled rows only) the completion's protocol seed and settings
TEMPERATURE_ARG = "ina_temperature"
TOP_P_ARG = "ina_top_p"
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Capture:
    """One ``generate`` call's hidden states and raw log-probabilities, by (request slot, position),
    on the GPU. The last column is spare: writes past a completion's end land there."""

    hidden: torch.Tensor  # [requests, max_tokens + 1, hidden_size], the model's dtype
    logprobs: torch.Tensor  # [requests, max_tokens + 1], float32
    written: torch.Tensor  # [requests, max_tokens + 1], bool

    @classmethod
    def empty(cls, requests: int, max_tokens: int, hidden_size: int, dtype: torch.dtype,
              device: torch.device | str) -> Capture:
        shape = (requests, max_tokens + 1)
        return cls(torch.zeros((*shape, hidden_size), dtype=dtype, device=device),
                   torch.zeros(shape, dtype=torch.float32, device=device),
                   torch.zeros(shape, dtype=torch.bool, device=device))


@dataclass(frozen=True)
class _Row:
    slot: int
    seed: int | None  # None: greedy
    temperature: float
    top_p: float
    output: list[int]  # vLLM's live list of the request's output tokens


class ProtocolBatch:
    """The engine's view of vLLM's persistent batch: per batch index, the request's slot, seed,
    temperature, top-p and live output token list (requests without a slot are not the engine's).

    ``update`` follows vLLM's ``BatchUpdate`` (removed, then added, then moved, as its interface
    says: an added request may take a removed one's index); ``take_hidden`` receives the step's
    final-norm rows; ``apply`` picks every engine row's token, records its hidden state and
    log-probability in ``capture`` and leaves the token the only finite logit of its row.
    """

    latest: ClassVar[ProtocolBatch | None] = None  # the one the last vLLM engine built (in-process)

    def __init__(self) -> None:
        self.rows: dict[int, _Row] = {}
        self.capture: Capture | None = None
        self.hidden: torch.Tensor | None = None
        ProtocolBatch.latest = self

    def update(self, batch_update: Any) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            extra = (getattr(params, "extra_args", None) or {}) if params is not None else {}
            if SLOT_ARG in extra:
                sampled = SEED_ARG in extra
                self.rows[index] = _Row(int(extra[SLOT_ARG]), int(extra[SEED_ARG]) if sampled else None,
                                        float(extra[TEMPERATURE_ARG]) if sampled else 0.0,
                                        float(extra[TOP_P_ARG]) if sampled else 1.0, output)
            else:
                self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            first, second = self.rows.pop(a, None), self.rows.pop(b, None)
            if first is not None:
                self.rows[b] = first
            if second is not None and direction.name == "SWAP":
                self.rows[a] = second

    def take_hidden(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        hidden, self.hidden = self.hidden, None
        if not self.rows:
            return logits
        width = None if self.capture is None else self.capture.logprobs.shape[1]
        settings: dict[tuple[float, float] | None, list[tuple[int, int, int, int]]] = {}
        for index, row in self.rows.items():
            position = len(row.output)
            key = 0 if row.seed is None else position_key(row.seed, position)
            spot = position if width is None else min(position, width - 1)
            settings.setdefault(None if row.seed is None else (row.temperature, row.top_p), []).append(
                (index, row.slot, spot, key))
        indices, chosen, slots, positions = [], [], [], []
        for setting, members in settings.items():
            rows = _to_device(torch.tensor([m[0] for m in members], dtype=torch.long), logits.device)
            part = logits.index_select(0, rows)
            if setting is None:
                chosen.append(part.argmax(dim=-1))
            else:
                keys = _to_device(key_tensor([m[3] for m in members]), logits.device)
                chosen.append(choose(part, keys, *setting))
            indices.append(rows)
            slots += [m[1] for m in members]
            positions += [m[2] for m in members]
        rows, tokens = torch.cat(indices), torch.cat(chosen)
        if self.capture is not None:
            self._record(logits, hidden, rows, tokens, slots, positions)
        logits.index_fill_(0, rows, -math.inf)
        logits[rows, tokens] = 0.0
        return logits

    def _record(self, logits: torch.Tensor, hidden: torch.Tensor | None, rows: torch.Tensor, tokens: torch.Tensor,
                slots: list[int], positions: list[int]) -> None:
        """The rows' hidden states and raw log-probabilities of their tokens, at (slot, position)."""
        capture = self.capture
        assert capture is not None
        if hidden is None or hidden.shape[0] != logits.shape[0]:
            raise RuntimeError(f"vLLM sampled {logits.shape[0]} rows but the capture saw "
                               f"{None if hidden is None else hidden.shape[0]} hidden rows: is compute_logits wrapped?")
        at = (_to_device(torch.tensor(slots, dtype=torch.long), logits.device),
              _to_device(torch.tensor(positions, dtype=torch.long), logits.device))
        chosen_logits = logits.index_select(0, rows)
        capture.logprobs[at] = torch.log_softmax(chosen_logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
        capture.hidden[at] = hidden.index_select(0, rows).to(capture.hidden.dtype)
        capture.written[at] = True


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor on ``device`` without waiting for the device's queued work (pinned, async)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _protocol_sampler_class() -> type:
    """``_ProtocolSampler`` (vLLM imported only here, so the module loads without it)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class _ProtocolSampler(LogitsProcessor):
        """``ProtocolBatch`` behind vLLM's v1 logits-processor interface."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.batch = ProtocolBatch()

        def is_argmax_invariant(self) -> bool:
            return False  # it picks the token: it must run before vLLM's (greedy) choice

        def update_state(self, batch_update: Any) -> None:
            self.batch.update(batch_update)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            return self.batch.apply(logits)

    return _ProtocolSampler


def _capture_hidden(batch: ProtocolBatch, model: torch.nn.Module) -> None:
    """Wrap ``model.compute_logits`` (run eagerly after the graphed forward, on one final-norm row per
    scheduled request, in batch order) so that ``batch`` sees the rows its logits come from."""
    original = model.compute_logits

    def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        batch.take_hidden(hidden_states)
        return original(hidden_states, *args, **kwargs)

    model.compute_logits = compute_logits


def _load_weights(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    model.load_weights(weights=tensors.items())


class VllmEngine(Engine):
    """vLLM generation on one GPU with the protocol's sampler and its own hidden states; verification
    prefill on ``verifier``."""

    name = "vllm"

    def __init__(self, llm: Any, batch: ProtocolBatch, verifier: TorchEngine) -> None:
        self.llm = llm
        self.batch = batch
        self.verifier = verifier
        self.vocab_size = verifier.vocab_size
        self._dtype = llm.llm_engine.model_config.dtype
        self._max_model_len = int(llm.llm_engine.model_config.max_model_len)
        self._failed: str | None = None
        llm.apply_model(partial(_capture_hidden, batch))

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.6,
        max_batch_rows: int = 256,
        **options: Any,
    ) -> VllmEngine:
        """vLLM on ``path`` (one GPU) with the protocol sampler, and a torch twin in ``dtype`` on the
        same GPU for verification (``max_batch_rows`` sequences per prefill batch); ``options`` go to
        ``vllm.LLM``."""
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {tuple(TORCH_DTYPES)}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # the processor is written to the V1 model runner's interface: vLLM 0.26 picks that runner for
        # custom processors itself, later releases (0.33) would take their V2 runner unless told
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        from vllm import LLM

        ProtocolBatch.latest = None
        llm = LLM(
            model=str(path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            logits_processors=[_protocol_sampler_class()],
            **options,
        )
        if ProtocolBatch.latest is None:
            raise RuntimeError("vLLM built no protocol sampler: is its engine core in another process?")
        verifier = TorchEngine.from_checkpoint(path, device="cuda", dtype=TORCH_DTYPES[dtype],
                                             max_batch_rows=max_batch_rows)
        return cls(llm, ProtocolBatch.latest, verifier)

    @property
    def hidden_size(self) -> int:
        return self.verifier.hidden_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.verifier.eos_token_ids

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.verifier.load_state_dict(tensors)  # checks every name and shape before anything changes
        self.llm.apply_model(partial(_load_weights, dict(tensors)))
        if self.llm.reset_prefix_cache() is False:  # cached blocks would keep the old weights' keys and values
            raise RuntimeError("vLLM kept its prefix cache after a weight reload (blocks still in use)")

    def _requests(self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams) -> tuple[list, list]:
        """One vLLM request per completion, prompt-major: completion j of prompt p is slot p * n + j."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        stops = list(params.stops(self.eos_token_ids))
        requests, request_params = [], []
        for p, prompt in enumerate(prompts):
            for j in range(n):
                extra: dict[str, Any] = {SLOT_ARG: len(requests)}
                if params.temperature > 0:
                    extra.update({SEED_ARG: params.completion_seed(p, n, j), TEMPERATURE_ARG: params.temperature,
                                  TOP_P_ARG: params.top_p})
                requests.append(TokensPrompt(prompt_token_ids=list(prompt)))
                request_params.append(VllmSamplingParams(
                    n=1,
                    temperature=0.0,  # vLLM's greedy choice takes the one token the protocol left finite
                    max_tokens=params.max_tokens,
                    extra_args=extra,
                    stop_token_ids=stops,
                    ignore_eos=True,  # the stops are ``stops``: vLLM's tokenizer EOS may not be among them
                    detokenize=False,
                ))
        return requests, request_params

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        capture_hidden: bool = True,
    ) -> list[list[Completion]]:
        if self._failed is not None:
            raise RuntimeError(f"this vLLM engine failed earlier ({self._failed}); build a new one")
        if n < 1:
            raise ValueError("n must be >= 1")
        check_prompts(prompts, self.vocab_size)
        params.check_prompt_count(len(prompts))
        longest = max((len(p) for p in prompts), default=0)
        if longest + params.max_tokens > self._max_model_len:  # vLLM would cut such a completion short
            raise ValueError(f"prompt ({longest}) + max_tokens ({params.max_tokens}) exceeds vLLM's max_model_len "
                             f"({self._max_model_len})")
        requests, request_params = self._requests(prompts, n, params)
        capture = Capture.empty(len(requests), params.max_tokens, self.hidden_size, self._dtype, self.verifier.device)
        self.batch.capture = capture
        try:
            outputs = self.llm.generate(requests, request_params, use_tqdm=False)
        except BaseException as error:
            # requests of this call may still be in vLLM's batch and would write into the next call's capture
            self._failed = f"{type(error).__name__}: {error}"[:200]
            raise
        finally:
            self.batch.capture = None
        stops = set(params.stops(self.eos_token_ids))
        for output in outputs:
            sample = output.outputs[0]
            ended = (sample.finish_reason == "stop" and bool(sample.token_ids) and sample.token_ids[-1] in stops) or (
                sample.finish_reason == "length" and len(sample.token_ids) == params.max_tokens)
            if not ended:
                raise RuntimeError(f"vLLM finished a completion as {sample.finish_reason!r} after "
                                   f"{len(sample.token_ids)} of {params.max_tokens} tokens")
        lengths = [len(output.outputs[0].token_ids) for output in outputs]
        wanted = torch.arange(capture.written.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        if not bool(capture.written.cpu()[wanted].all()):
            raise RuntimeError("vLLM sampled positions the protocol sampler never saw")
        wanted = wanted.to(capture.written.device)
        logprobs = capture.logprobs[wanted].cpu().split(lengths)
        hidden = capture.hidden[wanted].cpu().split(lengths) if capture_hidden else [None] * len(lengths)
        results: list[list[Completion]] = [[] for _ in prompts]
        for slot, output in enumerate(outputs):
            sample = output.outputs[0]
            finish: FinishReason = sample.finish_reason  # "stop" or "length", checked above
            results[slot // n].append(Completion(
                prompt_index=slot // n,
                sample_index=slot % n,
                token_ids=list(sample.token_ids),
                logprobs=logprobs[slot].tolist(),
                finish_reason=finish,
                hidden_states=hidden[slot],
            ))
        return results

    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        replays: Sequence[Replay] | None = None,
    ) -> list[PrefillResult]:
        return self.verifier.prefill(prompts, completions, replays)
