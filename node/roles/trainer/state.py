"""The trainer's durable state: weights, optimizer, step, recently consumed groups, counters.

Saved after every step, before that step's checkpoint is published, with one atomic replace: a
crash leaves either the previous step's state or this one, and a checkpoint is never published
for a step that a restart could recompute differently.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from intellect_node.node.home.durable import write_durably

STATE_FILE = "state.pt"


def save_state(directory: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_durably(directory / STATE_FILE, buffer.getvalue())


def load_state(directory: Path) -> dict[str, Any] | None:
    """The saved state, or None on a first start."""
    path = directory / STATE_FILE
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
