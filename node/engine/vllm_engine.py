"""The GPU engine: vLLM chooses the tokens, a torch twin of the model proves them and verifies.

Why two copies of the model. vLLM is fast because its forward runs as captured CUDA graphs over a
flattened batch of every scheduled request's tokens; nothing outside the graph sees a request's
hidden state there. The first version of this engine got them with a forward hook, which needs
``enforce_eager`` (no graphs) and a separate prefill per completion to map rows to requests: it
generated at 0.032x of plain vLLM on an H200. Here vLLM runs as it does for anyone (graphs,
prefix caching, asynchronous scheduling) and only its token choice is the protocol's:

- ``ProtocolBatch``, run by ``_ProtocolSampler`` (vLLM's v1 ``LogitsProcessor``), races the protocol
  sampler (``protocol.sampling.choose``) over every protocol row of a step in one call on the GPU
  and leaves one finite logit per row; vLLM samples greedily, so its sampler takes that token.
  Its position is the request's output length (vLLM's live list, asynchronous placeholders
  included), so it depends on neither batching nor scheduling.
- the hidden states and log-probabilities of the proofs come from one batched prefill of the
  finished completions on ``prover``, a ``TorchEngine`` holding the same weights in the same
  precision on the same GPU (prompts once per group, ``completion[:-1]`` after its cache: a
  fraction of decoding's cost). ``prefill`` (verification on a vLLM node) is the prover's too.

So a verifier sees tokens raced on vLLM's logits and proofs from a torch prefill in the worker's
precision: the run spec's vllm/torch pair is calibrated on exactly that (``intellect-node calibrate``).
The cost is a second copy of the weights (2 bytes per parameter in bf16) next to vLLM's share of
the GPU (``gpu_memory_utilization``, 0.6 by default, leaves the prover room).

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the processor class
and the weights handed to ``load_state_dict`` then move by reference, not through pickling.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

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

SEED_ARG = "ina_seed"  # SamplingParams.extra_args keys: the completion's protocol seed and settings
TEMPERATURE_ARG = "ina_temperature"
TOP_P_ARG = "ina_top_p"
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ProtocolBatch:
    """The protocol sampler's view of vLLM's persistent batch: per batch index, the request's seed,
    temperature, top-p and live output token list (rows without a protocol seed are vLLM's own).

    ``update`` follows vLLM's ``BatchUpdate`` (removed, then added, then moved, as its interface
    says: an added request may take a removed one's index); ``apply`` picks every protocol row's
    token and leaves it the only finite logit of its row.
    """

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, float, float, list[int]]] = {}

    def update(self, batch_update: Any) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            extra = (getattr(params, "extra_args", None) or {}) if params is not None else {}
            if SEED_ARG in extra:
                self.rows[index] = (int(extra[SEED_ARG]), float(extra[TEMPERATURE_ARG]), float(extra[TOP_P_ARG]),
                                    output)
            else:
                self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            first, second = self.rows.pop(a, None), self.rows.pop(b, None)
            if first is not None:
                self.rows[b] = first
            if second is not None and direction.name == "SWAP":
                self.rows[a] = second

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        settings: dict[tuple[float, float], tuple[list[int], list[int]]] = {}
        for index, (seed, temperature, top_p, output) in self.rows.items():
            indices, keys = settings.setdefault((temperature, top_p), ([], []))
            indices.append(index)
            keys.append(position_key(seed, len(output)))
        for (temperature, top_p), (indices, keys) in settings.items():
            rows = _to_device(torch.tensor(indices, dtype=torch.long), logits.device)
            chosen = choose(logits.index_select(0, rows), _to_device(key_tensor(keys), logits.device),
                            temperature, top_p)
            logits.index_fill_(0, rows, -math.inf)
            logits[rows, chosen] = 0.0
        return logits


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


def _load_weights(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    model.load_weights(weights=tensors.items())


class VllmEngine(Engine):
    """vLLM generation on one GPU; proofs, log-probabilities and verification from ``prover``."""

    name = "vllm"

    def __init__(self, llm: Any, prover: TorchEngine) -> None:
        self.llm = llm
        self.prover = prover
        self.vocab_size = prover.vocab_size

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.6,
        max_batch_rows: int = 256,
        **options: Any,
    ) -> VllmEngine:
        """vLLM on ``path`` (one GPU) with the protocol sampler, and its torch twin in ``dtype`` on the
        same GPU (``max_batch_rows`` sequences per prefill batch); ``options`` go to ``vllm.LLM``."""
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {tuple(TORCH_DTYPES)}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        llm = LLM(
            model=str(path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            logits_processors=[_protocol_sampler_class()],
            **options,
        )
        prover = TorchEngine.from_checkpoint(path, device="cuda", dtype=TORCH_DTYPES[dtype],
                                             max_batch_rows=max_batch_rows)
        return cls(llm, prover)

    @property
    def hidden_size(self) -> int:
        return self.prover.hidden_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.prover.eos_token_ids

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.prover.load_state_dict(tensors)  # checks every name and shape before anything changes
        self.llm.apply_model(partial(_load_weights, dict(tensors)))
        self.llm.reset_prefix_cache()

    def _requests(self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams) -> tuple[list, list]:
        """One vLLM request per completion, prompt-major (completion j of prompt p is p * n + j)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        stops = list(self.eos_token_ids if params.stop_token_ids is None else params.stop_token_ids)
        requests, request_params = [], []
        for p, prompt in enumerate(prompts):
            for j in range(n):
                seed = params.completion_seed(p, n, j)
                requests.append(TokensPrompt(prompt_token_ids=list(prompt)))
                request_params.append(VllmSamplingParams(
                    n=1,
                    temperature=0.0,  # vLLM's greedy choice takes the one token the protocol left finite
                    max_tokens=params.max_tokens,
                    extra_args=None if params.temperature == 0 else {
                        SEED_ARG: seed, TEMPERATURE_ARG: params.temperature, TOP_P_ARG: params.top_p},
                    stop_token_ids=stops,
                    ignore_eos=params.stop_token_ids is not None,
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
        if n < 1:
            raise ValueError("n must be >= 1")
        check_prompts(prompts, self.vocab_size)
        params.check_prompt_count(len(prompts))
        outputs = self.llm.generate(*self._requests(prompts, n, params), use_tqdm=False)
        rows = [(index // n, list(output.outputs[0].token_ids), output.outputs[0].finish_reason)
                for index, output in enumerate(outputs)]
        proved = self.prover.prefill([prompts[p] for p, _, _ in rows], [tokens for _, tokens, _ in rows])
        results: list[list[Completion]] = [[] for _ in prompts]
        for index, ((p, tokens, reason), proof) in enumerate(zip(rows, proved)):
            finish: FinishReason = "stop" if reason == "stop" else "length"
            results[p].append(Completion(
                prompt_index=p,
                sample_index=index % n,
                token_ids=tokens,
                logprobs=proof.logprobs.tolist(),
                finish_reason=finish,
                hidden_states=proof.hidden_states if capture_hidden else None,
            ))
        return results

    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        replays: Sequence[Replay] | None = None,
    ) -> list[PrefillResult]:
        return self.prover.prefill(prompts, completions, replays)
