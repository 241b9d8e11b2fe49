"""The GPU engine: vLLM for batched generation, a final-norm hook for hidden states.

Not exercised by the test suite (vLLM is GPU-only here and never installed in CI); written
against vLLM's documented offline API (``LLM``, ``SamplingParams``, ``TokensPrompt``,
``LLM.apply_model``) and kept small so that it can be checked by reading.

How hidden states are captured. A forward hook on the model's final norm (``model.model.norm``)
records its output while a capture flag is set. vLLM flattens all scheduled requests of a step
into one token batch and may reorder its persistent batch, so rows of a batched step cannot be
mapped to requests reliably from outside. Capture therefore runs as a separate prefill pass, one
request at a time, over ``prompt + completion`` with ``max_tokens=1`` (the sampled token is never
fed back, so every recorded row is a prompt row, in order) and prefix caching off (a cached
prefix would not be recomputed). That pass also yields vLLM's prompt log-probabilities, which is
all ``prefill`` needs. Its cost is one prefill per completion, small next to decoding. The hook
and its buffer live with the model; ``LLM.apply_model`` runs small functions there and brings
captured rows back as CPU tensors.

Sampling. vLLM's own samplers draw from device generators that no verifier can replay, so the
engine installs ``_ProtocolSampler``, a logits processor (vLLM's v1 ``LogitsProcessor`` interface)
that runs ``intellect_node.protocol.sampling.sample`` on each request's raw logits with the
request's seed (``SamplingParams.extra_args``) and the position (tokens generated so far), and
masks every other token to -inf: vLLM's sampler then has one finite token left, whatever its own
temperature. Non-argmax-invariant processors run before temperature and top-p, and
``logprobs_mode="raw_logprobs"`` reports the unprocessed model's logprobs, as the protocol wants.
Replay (``prefill`` with ``replays``) computes the logits from the captured final-norm rows with
the model's output head on the GPU, in the model's dtype, then ``protocol.sampling.margins``.
Written against vLLM's documented interfaces and not run here (no GPU in the session that wrote
it); the run spec admits no vLLM engine pair until its tolerances are measured on one.

Weight reload: ``model.load_weights`` (vLLM's own HF-name-aware loader, which fuses q/k/v and
gate/up) through ``apply_model``; no restart, no rebuilt KV cache.
"""

from __future__ import annotations

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
from intellect_node.protocol.sampling import Replay, margins_of_rows, sample

SEED_ARG = "ina_seed"  # SamplingParams.extra_args key: the completion's protocol seed
SAMPLING_ARGS = ("ina_temperature", "ina_top_p")


def _protocol_sampler_class() -> type:
    """``_ProtocolSampler`` (vLLM imported only here, so the module loads without it)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class _ProtocolSampler(LogitsProcessor):
        """Per batch row: (seed, temperature, top-p, the request's live output token list)."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.rows: dict[int, tuple[int, float, float, list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it picks the token: it must run before temperature and top-p

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for index, params, _prompt, output in batch_update.added:
                extra = (params.extra_args or {}) if params is not None else {}
                if SEED_ARG in extra:
                    self.rows[index] = (int(extra[SEED_ARG]), float(extra["ina_temperature"]),
                                        float(extra["ina_top_p"]), output)
                else:
                    self.rows.pop(index, None)
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for a, b, direction in batch_update.moved:
                first, second = self.rows.pop(a, None), self.rows.pop(b, None)
                if first is not None:
                    self.rows[b] = first
                if second is not None and direction == MoveDirectionality.SWAP:
                    self.rows[a] = second

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for index, (seed, temperature, top_p, output) in self.rows.items():
                chosen = sample(logits[index:index + 1], [seed], [len(output)], temperature, top_p)
                keep = logits[index, chosen].clone()
                logits[index].fill_(-torch.inf)
                logits[index, chosen] = keep
            return logits

    return _ProtocolSampler


class _Capture:
    """Worker-side state: the hook's switch and the rows it recorded."""

    def __init__(self) -> None:
        self.on = False
        self.rows: list[torch.Tensor] = []

    def hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.on:
            hidden = output[0] if isinstance(output, tuple) else output  # vLLM norms return a pair
            self.rows.append(hidden.detach().to("cpu", copy=True))


def _install(model: torch.nn.Module) -> None:
    capture = _Capture()
    model.model.norm.register_forward_hook(capture.hook)
    model._ina_capture = capture  # type: ignore[attr-defined]


def _switch(on: bool, model: torch.nn.Module) -> None:
    capture: _Capture = model._ina_capture  # type: ignore[attr-defined]
    capture.on, capture.rows = on, []


def _collect(model: torch.nn.Module) -> torch.Tensor:
    capture: _Capture = model._ina_capture  # type: ignore[attr-defined]
    rows, capture.rows, capture.on = capture.rows, [], False
    return torch.cat(rows) if rows else torch.empty(0)


def _load_weights(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    model.load_weights(weights=tensors.items())


def _logits(hidden: torch.Tensor, vocab: int, model: torch.nn.Module) -> torch.Tensor:
    """Logits [rows, vocab] (float32, CPU) of final-norm rows through the model's output head,
    computed on the model's device and in its dtype, as generation computes them."""
    weight = model.lm_head.weight
    with torch.inference_mode():
        out = torch.nn.functional.linear(hidden.to(weight.device, weight.dtype), weight)
    return out[:, :vocab].float().cpu()


class VllmEngine(Engine):
    """vLLM generation on one GPU, with final-norm hidden states for TOPLOC."""

    name = "vllm"

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        model_config = llm.llm_engine.model_config
        self._hidden = int(model_config.get_hidden_size())
        self.vocab_size = int(model_config.get_vocab_size())
        eos = model_config.hf_config.eos_token_id
        self._eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        llm.apply_model(_install)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.85,
        **options: Any,
    ) -> VllmEngine:
        """Start vLLM on ``path`` (one GPU); the fixed options below are what capture relies on.

        The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the hook's
        rows and the weights handed to ``load_state_dict`` then move by reference, not through
        pickling (which vLLM also refuses for functions unless insecure serialization is on).
        """
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        llm = LLM(
            model=str(path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=True,  # hooks do not run inside captured CUDA graphs
            enable_prefix_caching=False,  # a cached prefix would skip the hooked forward
            logprobs_mode="raw_logprobs",  # the convention of node.engine.base
            logits_processors=[_protocol_sampler_class()],  # the replayable sampler
            **options,
        )
        return cls(llm)

    @property
    def hidden_size(self) -> int:
        return self._hidden

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.llm.apply_model(partial(_load_weights, dict(tensors)))
        self.llm.reset_prefix_cache()

    def _capture_pass(self, sequence: list[int]) -> tuple[torch.Tensor, list[float | None]]:
        """Final-norm rows and prompt log-probabilities of one sequence."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        params = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        self.llm.apply_model(partial(_switch, True))
        try:
            (output,) = self.llm.generate(
                [TokensPrompt(prompt_token_ids=sequence)], params, use_tqdm=False
            )
        finally:
            rows = self.llm.apply_model(_collect)[0]  # every rank holds the same rows
        if rows.shape[0] != len(sequence):
            raise RuntimeError(
                f"final-norm hook saw {rows.shape[0]} rows for a {len(sequence)}-token prefill; "
                "is the model compiled or the prefix cached?"
            )
        logprobs = [
            None if entry is None else entry[token].logprob
            for token, entry in zip(sequence, output.prompt_logprobs)
        ]
        return rows, logprobs

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        capture_hidden: bool = True,
    ) -> list[list[Completion]]:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        if n < 1:
            raise ValueError("n must be >= 1")
        check_prompts(prompts, self.vocab_size)
        params.check_prompt_count(len(prompts))
        requests, request_params = [], []
        for p, prompt in enumerate(prompts):
            for j in range(n):
                seed = params.completion_seed(p, n, j)
                requests.append(TokensPrompt(prompt_token_ids=list(prompt)))
                request_params.append(
                    VllmSamplingParams(
                        n=1,
                        # the protocol sampler leaves one finite token; vLLM's own settings
                        # then change nothing (greedy stays vLLM's argmax)
                        temperature=0.0 if params.temperature == 0 else 1.0,
                        top_p=1.0,
                        max_tokens=params.max_tokens,
                        seed=seed,
                        extra_args=None if params.temperature == 0 else {
                            SEED_ARG: seed,
                            "ina_temperature": params.temperature, "ina_top_p": params.top_p},
                        stop_token_ids=list(
                            self._eos if params.stop_token_ids is None else params.stop_token_ids
                        ),
                        ignore_eos=params.stop_token_ids is not None,
                        logprobs=0,
                        detokenize=False,
                    )
                )
        outputs = self.llm.generate(requests, request_params, use_tqdm=False)
        results: list[list[Completion]] = [[] for _ in prompts]
        for index, output in enumerate(outputs):
            p, j = divmod(index, n)
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            hidden = None
            if capture_hidden and tokens:
                rows, _ = self._capture_pass(list(prompts[p]) + tokens)
                hidden = rows[len(prompts[p]) - 1 : len(prompts[p]) - 1 + len(tokens)]
            reason: FinishReason = "stop" if sample.finish_reason == "stop" else "length"
            results[p].append(
                Completion(
                    prompt_index=p,
                    sample_index=j,
                    token_ids=tokens,
                    logprobs=[entry[t].logprob for t, entry in zip(tokens, sample.logprobs)],
                    finish_reason=reason,
                    hidden_states=hidden,
                )
            )
        return results

    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        replays: Sequence[Replay] | None = None,
    ) -> list[PrefillResult]:
        if len(prompts) != len(completions):
            raise ValueError("need one completion per prompt")
        if replays is not None and len(replays) != len(completions):
            raise ValueError("need one replay per completion")
        check_prompts(prompts, self.vocab_size)
        results = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            start, count = len(prompt) - 1, len(completion)
            if count == 0:
                empty = torch.empty((0, self._hidden))
                results.append(PrefillResult(hidden_states=empty, logprobs=torch.empty(0)))
                continue
            rows, logprobs = self._capture_pass(list(prompt) + list(completion))
            hidden = rows[start : start + count]
            replayed = None
            if replays is not None:
                logits = self.llm.apply_model(partial(_logits, hidden, self.vocab_size))[0]
                replayed = margins_of_rows(logits, torch.tensor(list(completion)), [replays[i]], [len(completion)])[0]
            results.append(
                PrefillResult(
                    hidden_states=hidden,
                    logprobs=torch.tensor(logprobs[start + 1 :], dtype=torch.float32),
                    sampling_margins=None if replayed is None else replayed.margins,
                    sampling_gaps=None if replayed is None else replayed.gaps,
                )
            )
        return results
