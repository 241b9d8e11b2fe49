"""A small tiny model shared by the engine, tinymodel and bench tests, built once per session.

The real recipe trains for about two minutes; tests only need the right shapes, a real trained
tokenizer and weights that are not random noise, so this recipe is narrower and much shorter.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from intellect_node.node.demo.tinymodel import TinyRecipe, ensure_tiny_model

QUICK_RECIPE = TinyRecipe(
    hidden_size=64,
    intermediate_size=192,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    train_steps=25,
    batch_size=32,
)


@functools.cache
def quick_tiny_model() -> Path:
    """Path of a session-wide quick tiny model (removed at interpreter exit)."""
    root = Path(tempfile.mkdtemp(prefix="ina-tiny-test-"))
    atexit.register(shutil.rmtree, root, True)
    return ensure_tiny_model(root / "tiny", QUICK_RECIPE)


@functools.cache
def demo_tiny_model() -> Path:
    """The default-recipe tiny model the demo uses (1-2 min to build, once per session): trained
    enough that toy reversal starts near 0.25 greedy accuracy, so GRPO groups have mixed rewards."""
    root = Path(tempfile.mkdtemp(prefix="ina-tiny-demo-"))
    atexit.register(shutil.rmtree, root, True)
    return ensure_tiny_model(root / "tiny")
