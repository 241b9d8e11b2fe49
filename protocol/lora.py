"""LoRA adapters on the wire (``lora/v1``) and the exact merge every node computes alike.

With LoRA the trainer trains only small matrices ``A`` (rank x in) and ``B`` (out x rank) per
targeted weight; the policy a worker runs is ``W = W_base + scaling * B @ A`` rounded to the
checkpoint's dtype. For the trainer's signed manifest to name that policy byte for byte, every
node must compute the same bytes from the same base and adapter, on any CPU or GPU. A matrix
product does not promise that (BLAS reduction order, FMA contraction and thread count all change
the last bits), so the merge here is defined step by step in float64 numpy elementwise operations,
which IEEE 754 rounds the same everywhere:

1. ``acc = 0``; for ``k`` in ``0 .. rank - 1``: ``acc = acc + B[:, k] (outer) A[k, :]`` (each
   product of two float32 values is exact in float64);
2. ``merged = W_base + scaling * acc``, float64;
3. rounded to float32 (round to nearest even), then to the weight's dtype: float32 as is,
   bfloat16 and float16 by round to nearest even of the float32 value.

The result is checked against the signed manifest's shard hashes like any delta's (specs/deltas.md).
Pure: numpy over buffers; no files.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from intellect_node.protocol.errors import InvalidValue, MalformedBody, Truncated
from intellect_node.protocol.manifest import TensorEntry

LORA_FORMAT = "lora/v1"
MAGIC = b"INALORA1"
MAX_RANK = 256
MAX_SCALING = float(1 << 16)
_HEAD = struct.Struct(">8sIdI")  # magic, rank, scaling, module count
_MODULE = struct.Struct(">I")  # the targeted weight's index in the manifest's tensors
MERGEABLE = frozenset({"F32", "BF16", "F16"})


@dataclass(frozen=True)
class Adapter:
    """A decoded ``lora/v1`` body: per targeted weight (manifest index), its A and B (float32)."""

    rank: int
    scaling: float
    modules: Mapping[int, tuple[np.ndarray, np.ndarray]]


def encode_adapter(tensors: Sequence[TensorEntry], rank: int, scaling: float,
                   matrices: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> bytes:
    """The body for ``matrices``: weight name -> (A rank x in, B out x rank), as float32."""
    index = {entry.name: i for i, entry in enumerate(tensors)}
    parts = [_HEAD.pack(MAGIC, rank, float(scaling), len(matrices))]
    for name in sorted(matrices, key=lambda n: index[n]):
        a, b = matrices[name]
        parts.append(_MODULE.pack(index[name]))
        parts.append(np.ascontiguousarray(a, dtype="<f4").tobytes())
        parts.append(np.ascontiguousarray(b, dtype="<f4").tobytes())
    return b"".join(parts)


def decode_adapter(body: bytes | memoryview, tensors: Sequence[TensorEntry]) -> Adapter:
    """The adapter in ``body``, checked against the result's tensor index: rank and scaling in
    bounds, each module a 2-D float weight named once in ascending order, its A and B exactly the
    shapes that weight implies, every value finite, no byte left over. ``Rejected`` otherwise."""
    view = memoryview(body).cast("B")
    if len(view) < _HEAD.size:
        raise MalformedBody(f"adapter body of {len(view)} bytes, shorter than its {_HEAD.size}-byte head")
    magic, rank, scaling, count = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise MalformedBody("not a lora/v1 adapter body (magic)")
    if not 1 <= rank <= MAX_RANK:
        raise InvalidValue(f"adapter rank {rank}, outside 1-{MAX_RANK}")
    if not (math.isfinite(scaling) and 0 < abs(scaling) <= MAX_SCALING):
        raise InvalidValue(f"adapter scaling {scaling!r}")
    if not 1 <= count <= len(tensors):
        raise InvalidValue(f"adapter for {count} modules, the checkpoint has {len(tensors)} tensors")
    at, previous = _HEAD.size, -1
    modules: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for _ in range(count):
        if at + _MODULE.size > len(view):
            raise Truncated("adapter body ends before its last module")
        (index,) = _MODULE.unpack_from(view, at)
        at += _MODULE.size
        if not previous < index < len(tensors):
            raise InvalidValue(f"adapter module {index}: out of range or not after module {previous}")
        previous = index
        entry = tensors[index]
        if entry.dtype not in MERGEABLE or len(entry.shape) != 2:
            raise InvalidValue(f"adapter targets {entry.name!r}: a {entry.dtype} tensor of shape {list(entry.shape)}, "
                               "not a 2-D float weight")
        out_features, in_features = entry.shape
        a_len, b_len = 4 * rank * in_features, 4 * out_features * rank
        if at + a_len + b_len > len(view):
            raise Truncated(f"adapter module {entry.name!r} runs past the body's end")
        a = np.frombuffer(view, dtype="<f4", count=rank * in_features, offset=at).reshape(rank, in_features)
        b = np.frombuffer(view, dtype="<f4", count=out_features * rank, offset=at + a_len).reshape(out_features, rank)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise InvalidValue(f"adapter module {entry.name!r} holds a value that is not finite")
        modules[index] = (a, b)
        at += a_len + b_len
    if at != len(view):
        raise MalformedBody(f"{len(view) - at} bytes after the adapter's last module")
    return Adapter(rank, scaling, modules)


_BLOCK = 1 << 14  # elements merged at a time: their float64 scratch stays in a core's cache


def merged_weight(base: np.ndarray, a: np.ndarray, b: np.ndarray, scaling: float, dtype: str) -> np.ndarray:
    """``base`` (the weight's elements as stored: float32, or uint16 bit patterns of bf16/f16)
    plus ``scaling * b @ a``, computed as the module docstring defines; returns the new elements
    in the storage form of ``base``. ``InvalidValue`` if a merged value is not finite."""
    merged = np.array(base, order="C")
    merge_into(merged.reshape(-1), a, b, scaling, dtype)
    return merged


def merge_into(elements: np.ndarray, a: np.ndarray, b: np.ndarray, scaling: float, dtype: str) -> None:
    """Replace ``elements`` (a weight's stored elements, flat) by their merge with the adapter, in place.

    Every element is computed on its own, from its own row and column. The positions
    go through the module docstring's steps in pieces of at most ``_BLOCK`` (whole rows, or a run
    of one row), each with the same float64 operations in the same order, in scratch that stays in
    cache: one pass over the weight instead of ``rank`` passes over a float64 copy of it in memory.
    ``InvalidValue`` if a merged value is not finite (``elements`` is then partly merged: the
    caller discards it)."""
    cols = a.shape[1]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    done = 0
    while done < len(elements):
        row, col = divmod(done, cols)
        left = len(elements) - done
        if col or cols > _BLOCK or left < cols:  # a run within one row
            rows, width = 1, min(cols - col, _BLOCK, left)
        else:  # whole rows
            rows, width = min(left // cols, _BLOCK // cols), cols
        acc = np.zeros((rows, width), dtype=np.float64)
        for k in range(a.shape[0]):
            acc += np.multiply.outer(b64[row:row + rows, k], a64[k, col:col + width])
        piece = elements[done:done + rows * width]
        merged = _to_float64(piece, dtype) + np.float64(scaling) * acc.reshape(-1)
        with np.errstate(over="ignore"):  # an overflow is refused below, by value
            piece[...] = _narrowed(merged, dtype)
        done += rows * width


def _narrowed(merged: np.ndarray, dtype: str) -> np.ndarray:
    as_f32 = merged.astype(np.float32)
    if not np.isfinite(as_f32).all():
        raise InvalidValue("the merged weight overflows")
    if dtype == "F32":
        return as_f32
    if dtype == "F16":
        narrow = as_f32.astype(np.float16)
        if not np.isfinite(narrow).all():
            raise InvalidValue("the merged weight overflows float16")
        return narrow.view(np.uint16)
    bits = as_f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # nearest even bf16
    if ((rounded & 0x7F80) == 0x7F80).any():
        raise InvalidValue("the merged weight overflows bfloat16")
    return rounded


def _to_float64(stored: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return stored.astype(np.float64)
    if dtype == "F16":
        return stored.view(np.float16).astype(np.float64)
    return (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # bf16 widens exactly
