"""The canonical order of a model's tensors, and the flat fp32 vectors built from it.

Why flat: the grid (``grid``), the outer step (``outer``) and the hash (``state_hash``) are all
elementwise over the whole model, and the averager child takes one vector; one canonical order
(names sorted by Python's string order, specs/diloco.md section 5) lets every peer cut the same
vector into the same chunks without agreeing on anything else.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

CHUNK = 4096  # elements per grid chunk (specs/diloco.md section 4)
MAX_TENSORS = 65536
MAX_ELEMENTS = 2**31


def chunk_lengths(numel: int) -> np.ndarray:
    """The element count of each chunk of a vector of ``numel`` elements (the last one shorter)."""
    return np.minimum(CHUNK, numel - CHUNK * np.arange(-(-numel // CHUNK))).astype(np.int64)


@dataclass(frozen=True)
class Layout:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not 0 < len(self.names) <= MAX_TENSORS or len(self.names) != len(self.shapes):
            raise ValueError(f"a layout needs 1 to {MAX_TENSORS} named tensors, got {len(self.names)}")
        if list(self.names) != sorted(set(self.names)):
            raise ValueError("layout names must be unique and sorted")
        if any(len(s) > 8 or any(not isinstance(d, int) or d < 0 for d in s) for s in self.shapes):
            raise ValueError("every shape must be at most 8 non-negative dimensions")
        if self.elements > MAX_ELEMENTS:
            raise ValueError(f"{self.elements} elements is over the limit of {MAX_ELEMENTS}")

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> Layout:
        names = tuple(sorted(tensors))
        return cls(names, tuple(tuple(tensors[n].shape) for n in names))

    @property
    def sizes(self) -> list[int]:
        return [math.prod(s) for s in self.shapes]

    @property
    def elements(self) -> int:
        return sum(self.sizes)

    @property
    def chunks(self) -> int:
        return -(-self.elements // CHUNK)

    def digest(self) -> bytes:
        """sha256 over names, shapes and the chunk size: peers with different models never average."""
        h = hashlib.sha256(b"intellect-node/diloco-layout/v1\0" + struct.pack(">QQ", CHUNK, len(self.names)))
        for name, shape in zip(self.names, self.shapes, strict=True):
            encoded = name.encode()
            h.update(struct.pack(">I", len(encoded)) + encoded + struct.pack(">B", len(shape)))
            h.update(b"".join(struct.pack(">Q", d) for d in shape))
        return h.digest()

    def run_digest(self, data_digest: bytes) -> bytes:
        """What the members of a round sign and compare: the layout's digest, bound to the data's
        (``PeerData.digest``; empty: the layout's digest itself, as before data had one)."""
        if not data_digest:
            return self.digest()
        return hashlib.sha256(b"intellect-node/diloco-run/v1\0" + self.digest() + data_digest).digest()

    def flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One fp32 vector in canonical order (a copy); the tensors must match the layout."""
        if set(tensors) != set(self.names):
            raise ValueError(f"tensors do not match the layout: {sorted(set(tensors) ^ set(self.names))[:5]}")
        parts = []
        for name, shape in zip(self.names, self.shapes, strict=True):
            t = tensors[name]
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)}, layout says {shape}")
            parts.append(t.detach().to(torch.float32).reshape(-1))
        return torch.cat(parts).clone()

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``flat`` shaped as the layout's tensors (no copy)."""
        if flat.shape != (self.elements,):
            raise ValueError(f"a flat vector of {self.elements} elements was expected, got {tuple(flat.shape)}")
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = flat[offset:offset + size].view(shape)
            offset += size
        return out
