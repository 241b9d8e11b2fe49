"""sha256 of the global state (specs/diloco.md section 5): equal on every honest peer after each
outer step, so one 32-byte value says whether two peers (or a checkpoint) hold the same state."""

from __future__ import annotations

import hashlib
import struct

import torch

from intellect_node.node.diloco.outer import GlobalState

DOMAIN = b"intellect-node/diloco-state/v1\0"


def _tensor_bytes(t: torch.Tensor) -> bytes:
    array = t.detach().contiguous().numpy()
    return array.astype("<f4", copy=False).tobytes()


def state_hash(state: GlobalState) -> bytes:
    h = hashlib.sha256(DOMAIN + struct.pack(">Q", state.round))
    for flat in (state.params, state.momentum):
        for (name, view), shape in zip(state.layout.views(flat).items(), state.layout.shapes, strict=True):
            encoded = name.encode()
            h.update(struct.pack(">I", len(encoded)) + encoded + struct.pack(">B", len(shape)))
            h.update(b"".join(struct.pack(">Q", d) for d in shape) + struct.pack(">Q", view.numel()))
            h.update(_tensor_bytes(view))
    return h.digest()
