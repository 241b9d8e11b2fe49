"""The engine interface every inference backend implements (torch on CPU, vLLM on GPU).

Roles talk to engines in token ids only; text and chat templates are the caller's business.

Which hidden state belongs to which token. For a completion ``c_0 .. c_{k-1}`` after a prompt of
``P`` tokens, ``hidden_states[i]`` is the final hidden state (after the model's final norm) at
sequence position ``P - 1 + i``: the state whose logits the token ``c_i`` was sampled from.
Generation has every one of these without an extra forward pass (the last one comes from the
step that sampled the last token), and a verifier's prefill over ``prompt + completion[:-1]``
produces exactly the same positions. TOPLOC proofs are built on these rows.

Which log-probability is reported. ``logprobs[i]`` is ``log softmax(logits)[c_i]`` of the raw
model distribution at that position: no temperature, no top-p. That is what a validator can
recompute with one prefill, whatever sampling parameters the worker used.
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from safetensors.torch import load_file

from intellect_node.protocol.sampling import Replay

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample, for one engine call. ``temperature == 0`` is greedy (seed unused).

    Not the run's rollout shape (``protocol.rollout_shape.RolloutShape``), which the rollout builder
    turns into one of these per batch: an engine call also serves greedy evaluation and the tiny
    model's checks (temperature 0, which no run may sample with), and carries what only a call has:
    its seeds and its stop ids.

    ``stop_token_ids``: None means the model's end-of-sequence ids; an empty tuple means never
    stop early (benchmarks use that to generate a fixed length). The stop token that ends a
    completion is part of it (validators must see the termination).
    ``seed``: completion ``j`` of prompt ``p`` samples with seed ``derive_seed(seed, p * n + j)``
    through ``intellect_node.protocol.sampling`` (specs/sampling.md), so its tokens do not depend
    on how the engine batches and any verifier can replay them.
    ``prompt_seeds``: one seed per prompt instead, completion ``j`` of prompt ``p`` then samples
    with ``derive_seed(prompt_seeds[p], j)``: several rollout groups (each with the seed of its
    own counter) share one engine call, and each gets the tokens it would get alone.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] | None = None
    seed: int = 0
    prompt_seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError("temperature must be finite and >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 <= self.seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")
        if self.prompt_seeds is not None and not all(0 <= seed < 2**64 for seed in self.prompt_seeds):
            raise ValueError("prompt_seeds must be in [0, 2**64)")

    def completion_seed(self, prompt: int, n: int, j: int) -> int:
        """The seed of completion ``j`` (of ``n``) of prompt number ``prompt`` in a call."""
        if self.prompt_seeds is not None:
            return derive_seed(self.prompt_seeds[prompt], j)
        return derive_seed(self.seed, prompt * n + j)

    def stops(self, eos_token_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids that end a completion: ``stop_token_ids``, or the model's ``eos_token_ids`` when None."""
        return tuple(eos_token_ids if self.stop_token_ids is None else self.stop_token_ids)

    def check_prompt_count(self, count: int) -> None:
        """ValueError unless ``prompt_seeds`` (if given) has one seed per prompt of the call."""
        if self.prompt_seeds is not None and len(self.prompt_seeds) != count:
            raise ValueError(f"{len(self.prompt_seeds)} prompt_seeds for {count} prompts")


@dataclass(frozen=True)
class Completion:
    """One sampled completion; ``hidden_states`` is None when capture was switched off. Tensors
    come back on the CPU whatever the engine's device (proofs, the wire and every comparison a
    verifier makes run there), as from every engine."""

    prompt_index: int
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    hidden_states: torch.Tensor | None  # [len(token_ids), hidden_size], see module docstring


@dataclass(frozen=True)
class PrefillResult:
    """What a verifier recomputes for one (prompt, completion) pair, on the CPU (as ``Completion``)."""

    hidden_states: torch.Tensor  # [len(completion), hidden_size]
    logprobs: torch.Tensor  # [len(completion)], float32
    # per token, when a replay was asked (protocol.sampling.TokenReplay): the claimed tokens'
    # margins, and the gaps of the verifier's own race (how near each position was to a tie)
    sampling_margins: np.ndarray | None = None
    sampling_gaps: np.ndarray | None = None


def derive_seed(seed: int, index: int) -> int:
    """The 63-bit seed of completion ``index`` of a request made with ``seed``."""
    digest = hashlib.sha256(f"intellect-node/sample/{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (``model.safetensors`` or the sharded layout)."""
    directory = Path(path)
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {directory}")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(directory / name))
    return tensors


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Token ids of a user prompt as the model expects it: through its chat template if it has
    one (ending with the generation prompt), else BOS + the text."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        return list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    return ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + ids


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> None:
    """Refuse empty prompts and out-of-vocabulary ids before they reach an embedding lookup."""
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")


class Engine(ABC):
    """An inference backend: generation with hidden-state capture, and verification prefill."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_checkpoint(cls, path: str | Path, **options: Any) -> Engine:
        """Build the engine from an HF-layout directory (config.json, safetensors, tokenizer)."""

    @property
    @abstractmethod
    def hidden_size(self) -> int:
        """Width of the captured hidden states."""

    @property
    @abstractmethod
    def eos_token_ids(self) -> tuple[int, ...]:
        """The ids that end a completion when ``SamplingParams.stop_token_ids`` is None."""

    @abstractmethod
    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Replace the weights in place (HF parameter names), e.g. from verified shards.

        Every weight of the model must be present (a tied output head may be omitted) with the
        right shape; nothing is changed when the check fails.
        """

    def load_checkpoint(self, path: str | Path) -> None:
        """Replace the weights with those of another checkpoint directory of the same model."""
        self.load_state_dict(read_safetensors_dir(path))

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        capture_hidden: bool = True,
    ) -> list[list[Completion]]:
        """``n`` completions per prompt: result[p][j] is sample j of prompt p."""

    @abstractmethod
    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        replays: Sequence[Replay] | None = None,
    ) -> list[PrefillResult]:
        """Hidden states and log-probabilities of each completion given its prompt, batched;
        with ``replays`` (one per completion) also the sampling margins of every token, computed
        from the full logits where they exist (a verifier never holds a whole batch's logits)."""
