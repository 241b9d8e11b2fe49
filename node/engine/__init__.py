"""Inference engines: generation with final-hidden-state capture, and verification prefill.

- ``intellect_node.node.engine.base``: the ``Engine`` interface, ``SamplingParams``, ``Completion``,
  ``PrefillResult``, and the conventions every engine shares (which hidden state belongs to which
  token, which log-probability is reported, how per-completion seeds are derived).
- ``intellect_node.node.engine.torch_engine``: ``TorchEngine``, the GPU when torch sees one, else the CPU; \
HF-layout Llama and Qwen2.
- ``intellect_node.node.engine.torch_prefill``: the torch engine's verification prefill of one batch
  (each distinct prompt once, ``completion[:-1]`` per row, the head over a bounded span).
- ``intellect_node.node.engine.static_decode``: the torch engine's per-token step over a KV cache
  allocated once (exact shapes on a CPU; padded shapes replayed as CUDA graphs on a GPU).
- ``intellect_node.node.engine.vllm_engine``: ``VllmEngine``, GPU only; ``vllm`` is imported when it is built.
- ``intellect_node.node.engine.proofs``: TOPLOC proofs for a batch of completions in a few batched calls.
- ``intellect_node.node.engine.calibration``: an engine pair's tolerances measured from honest work
  (``intellect-node calibrate``, specs/sampling.md section 4).
- ``intellect_node.node.engine.chunked_head``: log-probabilities of chosen tokens with the LM head run
  over a few rows at a time (the full vocabulary's logits never held at once).

``select_engine`` maps the ``--engine auto|torch|vllm`` choice to a class, and ``build_engine`` builds
one from a choice with its precision (``torch:bfloat16``); nothing heavy is imported until then, so
``import node.engine`` stays cheap. The precision is this node's business: batches name the engine
only, and the run spec's calibrated pairs cover every precision they were measured on.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # base imports torch: `import node.engine` must not (the CLI's config errors and --help)
    from intellect_node.node.engine.base import Engine

ENGINE_NAMES = ("auto", "torch", "vllm")
PRECISIONS = ("float32", "bfloat16", "float16")
DEFAULT_PRECISION = {"torch": "float32", "vllm": "bfloat16"}  # each engine's own default
TESTED_VLLM = "0.26.0"  # the vLLM the engine ran on (bench/HISTORY.md, "GPU engines"); the gpu extra pins it


class EngineUnavailable(RuntimeError):
    """The requested engine cannot run on this machine (says what is missing)."""


def _vllm_missing() -> str | None:
    """Why vLLM cannot run here, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed (pip install 'intellect-node[gpu]')"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return None


def select_engine(name: str) -> type[Engine]:
    """The engine class for ``name``: ``auto`` takes vLLM when it can run, else torch."""
    if name not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {name!r}; choose one of {ENGINE_NAMES}")
    missing = None if name == "torch" else _vllm_missing()
    if name == "vllm" and missing is not None:
        raise EngineUnavailable(f"engine 'vllm' requested but {missing}; use --engine torch")
    if missing is None and name != "torch":
        from intellect_node.node.engine.vllm_engine import VllmEngine

        return VllmEngine
    from intellect_node.node.engine.torch_engine import TorchEngine

    return TorchEngine


@dataclass(frozen=True)
class EngineChoice:
    """``name[:precision]`` as a user writes it (``--engine torch:bfloat16``); precision None: the
    engine's default (torch float32, vLLM bfloat16)."""

    name: str
    precision: str | None = None

    @classmethod
    def parse(cls, text: str) -> EngineChoice:
        """``auto``, ``torch``, ``vllm:bfloat16`` ...; ValueError naming what is wrong."""
        name, colon, precision = text.partition(":")
        if name not in ENGINE_NAMES:
            raise ValueError(f"engine {text!r}: unknown engine {name!r}; choose one of {ENGINE_NAMES}")
        if colon and precision not in PRECISIONS:
            raise ValueError(f"engine {text!r}: unknown precision {precision!r}; choose one of {PRECISIONS}")
        return cls(name, precision or None)


def build_engine(choice: str, model_dir: str | Path, *, device: str | None = None, **options: Any) -> Engine:
    """The engine ``choice`` names, loaded from ``model_dir`` in its precision. ``device`` is the
    torch engine's (None: the GPU when there is one); vLLM takes its one GPU itself. ``options``
    go to the engine's ``from_checkpoint`` (``max_batch_rows`` ...)."""
    parsed = EngineChoice.parse(choice)
    engine_class = select_engine(parsed.name)
    precision = parsed.precision or DEFAULT_PRECISION[engine_class.name]
    if engine_class.name == "vllm":
        return engine_class.from_checkpoint(model_dir, dtype=precision, **options)
    import torch

    return engine_class.from_checkpoint(model_dir, device=device, dtype=getattr(torch, precision), **options)
