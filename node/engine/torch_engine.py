"""The CPU engine: HF-layout Llama and Qwen2 models run by transformers, our own decode loop.

Only the decoder stack (``model.model``) and the output head come from transformers; batching,
KV cache use, sampling, stopping and hidden-state capture are here, because the protocol needs
exact control over them:

- the base model's ``last_hidden_state`` is already after the final norm, so capture costs one
  row copy per step, and the output head runs only on the rows that are sampled from;
- prompts are left-padded in one batch and prefilled once by transformers, then their cache is
  copied, repeated for the ``n`` samples, into a ``StaticDecoder`` (``static_decode``) that runs
  the per-token steps over buffers allocated once (on a GPU, each step a replayed CUDA graph);
  finished rows are dropped so that long stragglers do not drag a full batch along;
- each completion samples with the verifiable sampler of ``intellect_node.protocol.sampling``
  from its own seed (``base.derive_seed``), so its tokens depend only on its seed and the model's
  logits, not on batch composition, and any validator can replay them.

Verification prefill reads the same positions the generation captured (see
``intellect_node.node.engine.base``) the way the generation computed them: each distinct prompt runs
once (a GRPO group's rows share one), its cache is repeated for the rows that continue it, and
only ``completion[:-1]`` runs per row, at the positions the generation gave those tokens. On the
demo's short answers that is a third of the tokens of prefilling every ``prompt + completion``
(bench/HISTORY.md, "Cutting the swarm's CPU per step").
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from intellect_node.node.engine.base import (
    Completion,
    Engine,
    FinishReason,
    PrefillResult,
    SamplingParams,
    check_prompts,
)
from intellect_node.node.engine.static_decode import StaticDecoder
from intellect_node.node.engine.torch_prefill import prefill_batch
from intellect_node.protocol.sampling import Replay, sample

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
CACHE_COLUMNS = 64  # the decode cache's length is a multiple of this: one padded shape serves nearby lengths


class TorchEngine(Engine):
    """Batched generation and prefill with PyTorch (on the GPU when there is one, else the CPU).

    ``max_batch_rows`` bounds the rows decoded together: a generation chunk holds
    ``max(1, max_batch_rows // n)`` prompts (so one prompt with a larger ``n`` still goes in one
    piece), a prefill batch ``max_batch_rows`` sequences.

    ``padded_decode``: decode in the padded shapes of ``static_decode`` (rows in power-of-two
    buckets, attention over the cache's whole length), captured as CUDA graphs on a GPU; None
    means on a GPU only. On a CPU the exact shapes do less work.
    """

    name = "torch"

    def __init__(self, model: PreTrainedModel, max_batch_rows: int = 64, padded_decode: bool | None = None) -> None:
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model type {model_type!r} not supported: {SUPPORTED_MODEL_TYPES}")
        if max_batch_rows < 1:
            raise ValueError("max_batch_rows must be >= 1")
        self.model = model.eval()  # generation runs under inference_mode: no grads kept
        self.max_batch_rows = max_batch_rows
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions = int(model.config.max_position_embeddings)
        self.pad_id = int(model.config.pad_token_id or 0)
        eos = model.generation_config.eos_token_id or model.config.eos_token_id
        self._eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        self.padded_decode = self.device.type == "cuda" if padded_decode is None else padded_decode
        # padded: kept between calls (its buffers and graphs are reused); exact: freed after each call
        self._decoder: StaticDecoder | None = None
        self._generating = threading.Lock()  # one generation at a time owns the decoder

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: str | None = None,
        dtype: torch.dtype = torch.float32,
        max_batch_rows: int = 64,
        padded_decode: bool | None = None,
        **options: Any,
    ) -> TorchEngine:
        """Load with transformers (``sdpa`` attention); extra options go to ``from_pretrained``.
        ``device`` None: the first GPU when torch sees one (a node on a GPU machine with
        ``--engine torch`` generates and verifies there), else the CPU."""
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, attn_implementation="sdpa", **options
        ).to(device)
        return cls(model, max_batch_rows=max_batch_rows, padded_decode=padded_decode)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        current = self.model.state_dict()  # shares storage with the parameters
        unknown = sorted(set(tensors) - set(current))
        optional = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        missing = sorted(set(current) - set(tensors) - optional)
        wrong = sorted(k for k in tensors if k in current and tensors[k].shape != current[k].shape)
        if unknown or missing or wrong:
            raise ValueError(
                f"state dict does not fit the model: unknown {unknown[:5]}, "
                f"missing {missing[:5]}, wrong shape {wrong[:5]}"
            )
        with torch.no_grad():
            for key, value in tensors.items():
                current[key].copy_(value)

    # --- generation ---------------------------------------------------------------------------

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden).float()

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
        longest = max((len(p) for p in prompts), default=0)
        if longest + params.max_tokens > self.max_positions:
            raise ValueError(
                f"prompt ({longest}) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"{self.max_positions} positions"
            )
        stops = params.stops(self._eos)
        per_chunk = max(1, self.max_batch_rows // n)
        results: list[list[Completion]] = []
        with self._generating, torch.inference_mode():
            try:
                for start in range(0, len(prompts), per_chunk):
                    chunk = range(start, min(start + per_chunk, len(prompts)))
                    results.extend(self._generate_chunk(prompts, chunk, n, params, stops, capture_hidden))
            finally:
                if not self.padded_decode:
                    self._decoder = None  # a CPU cache is cheap to rebuild and costly to keep
        return results

    def run_prompts(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
        """The prompts left-padded in one batch (each ends at the last column, positions counted
        from its first token), run once: each prompt's last state [prompts, hidden], the attention
        mask and the KV cache, for generation and for verification alike."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, device=self.device)
            mask[row, width - len(prompt) :] = 1
        cache = DynamicCache(config=self.model.config)
        out = self.model.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                               past_key_values=cache, use_cache=True)
        return out.last_hidden_state[:, -1], mask, cache

    def _generate_chunk(
        self,
        prompts: Sequence[Sequence[int]],
        chunk: range,
        n: int,
        params: SamplingParams,
        stops: tuple[int, ...],
        capture: bool,
    ) -> list[list[Completion]]:
        lengths = torch.tensor([len(prompts[p]) for p in chunk], device=self.device)
        last, mask, cache = self.run_prompts([prompts[p] for p in chunk])
        width = mask.shape[1]
        rows = len(chunk) * n
        max_tokens = params.max_tokens
        decoder = self._decoder_for(rows, width + max_tokens)
        decoder.load_prompts(cache, mask, n)
        del cache
        hidden = last.repeat_interleave(n, dim=0)
        next_pos = lengths.repeat_interleave(n)

        tokens = torch.zeros((rows, max_tokens), dtype=torch.long, device=self.device)
        logprobs = torch.zeros((rows, max_tokens), dtype=torch.float32, device=self.device)
        captured = (
            torch.empty((rows, max_tokens, self.hidden_size), dtype=self.dtype, device=self.device)
            if capture
            else None
        )
        seeds = [params.completion_seed(p, n, j) for p in chunk for j in range(n)]
        stop_ids = torch.tensor(stops, dtype=torch.long, device=self.device)
        active = torch.arange(rows, device=self.device)  # original row of each live decoder row
        active_rows = list(range(rows))
        lengths_out = torch.full((rows,), max_tokens, dtype=torch.long)
        reasons: list[FinishReason] = ["length"] * rows

        for step in range(max_tokens):
            if captured is not None:
                captured[active, step] = hidden
            logits = self.head(hidden)
            chosen = self._sample(logits, params, [seeds[r] for r in active_rows], step)
            tokens[active, step] = chosen
            logprobs[active, step] = torch.log_softmax(logits, dim=-1).gather(
                -1, chosen[:, None]
            )[:, 0]
            done = torch.isin(chosen, stop_ids)
            stopped = active[done].tolist()  # the step's one wait for the device
            for r in stopped:
                lengths_out[r], reasons[r] = step + 1, "stop"
            if step + 1 == max_tokens:
                break
            if stopped:
                keep = (~done).nonzero()[:, 0]
                if keep.numel() == 0:
                    break
                decoder.keep(keep)
                active_rows = [active_rows[k] for k in keep.tolist()]
                active, chosen, next_pos = active[keep], chosen[keep], next_pos[keep]
            hidden = decoder.step(chosen, next_pos, width + step)
            next_pos = next_pos + 1

        grouped: list[list[Completion]] = []
        for i, p in enumerate(chunk):
            group = []
            for j in range(n):
                row = i * n + j
                k = int(lengths_out[row])
                group.append(
                    Completion(
                        prompt_index=p,
                        sample_index=j,
                        token_ids=tokens[row, :k].tolist(),
                        logprobs=logprobs[row, :k].tolist(),
                        finish_reason=reasons[row],
                        hidden_states=captured[row, :k].to("cpu", copy=True) if captured is not None else None,
                    )
                )
            grouped.append(group)
        return grouped

    def _decoder_for(self, rows: int, columns: int) -> StaticDecoder:
        """A decoder with room for ``rows`` rows of ``columns`` columns: the current one when it
        has room, else a new one that also holds what the current one held (it only grows, so a
        GPU captures each bucket's graph once, not once per prompt length)."""
        length = -(-columns // CACHE_COLUMNS) * CACHE_COLUMNS
        capacity = max(rows, self.max_batch_rows) if self.padded_decode else rows  # padded: room for any chunk
        current = self._decoder
        if current is not None:
            if current.capacity >= rows and current.length >= length:
                return current
            capacity, length = max(capacity, current.capacity), max(length, current.length)
        self._decoder = current = None  # freed before the next one is allocated
        self._decoder = StaticDecoder(self.model, capacity, length, padded=self.padded_decode, cuda_graphs=True)
        return self._decoder

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams, seeds: list[int], step: int) -> torch.Tensor:
        """One token per row: greedy at temperature 0, else the verifiable sampler."""
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        return sample(logits, seeds, [step] * len(seeds), params.temperature, params.top_p)

    # --- verification -------------------------------------------------------------------------

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
        for i, c in enumerate(completions):
            if c and (min(c) < 0 or max(c) >= self.vocab_size):
                raise ValueError(f"completion {i} has token ids outside [0, {self.vocab_size})")
            if len(prompts[i]) + len(c) > self.max_positions + 1:
                raise ValueError(f"pair {i} is longer than the model's positions")
        results: list[PrefillResult | None] = [None] * len(prompts)
        # the rows of one prompt together (they share its run), similar lengths together (less padding)
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), tuple(prompts[i]), len(completions[i])))
        with torch.inference_mode():
            for start in range(0, len(order), self.max_batch_rows):
                batch = order[start : start + self.max_batch_rows]
                for i, result in zip(batch, prefill_batch(self, prompts, completions, batch, replays), strict=True):
                    results[i] = result
        return [r for r in results if r is not None]
