"""How the grid's numbers travel inside hivemind's all-reduce: the exact packed wire format.

Why tags instead of one format: the same compression object serializes both directions of
hivemind's all-reduce. Going up, a member's part holds grid integers (``grid.quantize``): with
int8 and int4 grids they fit one signed byte each, exactly. Coming back, a reducer sends each
member ``S/n - q``: times the group size ``n`` that is the integer ``S - n·q``, which fits a
signed 16-bit integer for the int8 and int4 grids; the receiver divides by ``n`` and recovers the
exact sum as before (``grid.recover_sums``). Anything else (the int16 grid's larger integers)
goes as fp32, so exactness never depends on which tag was chosen. specs/diloco.md section 4.

``buffer = tag (1 byte) || payload``, the narrowest that holds the part exactly: tag 3, int4
values in [-7, 7], two per byte (element 2i in the low nibble, two's complement); tag 0, int8
values; tag 5, integers in [-2048, 2048] as IEEE binary16 little-endian (the fp16 grid going up:
OpenDiLoCo's 2 bytes per element, exact); tag 4, int8 values of ``v·n``; tag 1, int16
little-endian values of ``v·n``; tag 2, fp32 little-endian values. The int4 grid thus goes up in
half a byte and, in groups of up to 9, comes back in one; the fp16 grid goes up in 2 bytes and,
in groups of up to 9, comes back in 2.

Sparse runs (``sparse_k`` > 0, compressions.SPARSE) add two tags whose parts list only nonzero values:
tag 8, grid codes -2, -1, 1, 2 in 2 bits each (going up: at most ``k`` per chunk); tag 9, int8
values of ``v·n`` (the reply ``S/n - q``, nonzero over the union of the members' indices). Both
start with one u16 count per block of ``CHUNK`` elements, then the sorted block-local indices,
Elias-Fano coded (``sparse_indices``); every field is checked before a value is used
(specs/diloco.md section 4a). Tags 6 and 7, the same with 12-bit indices, are retired: refused as
unknown, so a peer of the older format fails its attempt with that error instead of misreading.
"""

from __future__ import annotations

import numpy as np
import torch

from intellect_node.node.diloco import sparse_indices
from intellect_node.node.diloco.layout import CHUNK, chunk_lengths

TAG_INT8, TAG_SCALED16, TAG_FP32, TAG_INT4, TAG_SCALED8, TAG_FP16 = 0, 1, 2, 3, 4, 5
TAG_SPARSE2, TAG_SPARSE_SCALED8 = 8, 9
SPARSE_TAGS = (TAG_SPARSE2, TAG_SPARSE_SCALED8)
_DTYPES = {TAG_INT8: torch.int8, TAG_SCALED8: torch.int8, TAG_SCALED16: torch.int16, TAG_FP32: torch.float32,
           TAG_FP16: torch.float16}
FP16_EXACT = 2048  # every integer of at most this magnitude is an IEEE binary16 value
SCALED_TOLERANCE = 0.01  # v·n must be this close to an integer (deltas are, up to fp32 rounding)


def payload_size(tag: int, numel: int) -> int:
    if tag == TAG_INT4:
        return (numel + 1) // 2
    if tag not in _DTYPES:
        raise ValueError(f"unknown packing tag {tag}")
    return numel * _DTYPES[tag].itemsize


def _int4(values: torch.Tensor) -> bytes:
    nibbles = (values.to(torch.int16) & 0xF).to(torch.uint8)
    if nibbles.numel() % 2:
        nibbles = torch.cat([nibbles, torch.zeros(1, dtype=torch.uint8)])
    return (nibbles[0::2] | (nibbles[1::2] << 4)).numpy().tobytes()


def _from_int4(payload: bytes, numel: int) -> torch.Tensor:
    packed = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)[:numel].to(torch.int16)
    return torch.where(nibbles >= 8, nibbles - 16, nibbles).to(torch.float32)


def _blocks(numel: int) -> int:
    return -(-numel // CHUNK)


def _sparse_size(tag: int, counts: np.ndarray, index_bytes: int) -> int:
    nonzeros = int(counts.sum())
    values = (nonzeros + 3) // 4 if tag == TAG_SPARSE2 else nonzeros
    return 1 + 2 * counts.size + index_bytes + values


def _pack_sparse(tag: int, v: torch.Tensor) -> bytes:
    """``tag || counts (u16 LE per block) || indices (Elias-Fano) || values``."""
    where = torch.nonzero(v).flatten()
    counts = torch.bincount(where // CHUNK, minlength=_blocks(v.numel())).numpy().astype(np.int64)
    indices = sparse_indices.encode((where % CHUNK).numpy(), counts, chunk_lengths(v.numel()))
    nonzero = v[where]
    if tag == TAG_SPARSE2:
        codes = torch.where(nonzero < 0, nonzero + 2, nonzero + 1).to(torch.uint8).numpy()
        codes = np.append(codes, np.zeros((-codes.size) % 4, np.uint8)).reshape(-1, 4)
        values = (codes[:, 0] | codes[:, 1] << 2 | codes[:, 2] << 4 | codes[:, 3] << 6).astype(np.uint8).tobytes()
    else:
        values = nonzero.to(torch.int8).numpy().tobytes()
    return bytes([tag]) + counts.astype("<u2").tobytes() + indices + values


def _unpack_sparse(buffer: bytes, numel: int, group_size: int, sparse_k: int) -> torch.Tensor:
    """The dense fp32 values of a tag-8 or tag-9 part; ValueError naming the first thing wrong."""
    tag, blocks = buffer[0], _blocks(numel)
    if not sparse_k:
        raise ValueError(f"a sparse part (tag {tag}) in a dense run")
    if tag == TAG_SPARSE_SCALED8 and group_size < 1:
        raise ValueError("a scaled part arrived outside a group")
    if len(buffer) < 1 + 2 * blocks:
        raise ValueError(f"sparse part of {len(buffer)} bytes cannot hold the counts of its {blocks} chunks")
    counts = np.frombuffer(buffer, dtype="<u2", count=blocks, offset=1).astype(np.int64)
    lengths = chunk_lengths(numel)
    if (counts > lengths).any():
        raise ValueError(f"a chunk lists {int(counts.max())} values, more than its {int(lengths[counts > lengths][0])}")
    if tag == TAG_SPARSE2 and (counts > sparse_k).any():
        raise ValueError(f"k too large: a chunk lists {int(counts.max())} values, over k = {sparse_k}")
    m, index_bytes = int(counts.sum()), sparse_indices.coded_size(counts, lengths)
    expected = _sparse_size(tag, counts, index_bytes)
    if len(buffer) != expected:
        raise ValueError(f"sparse part of {len(buffer)} bytes, expected {expected} for {blocks} chunks and {m} values")
    start = 1 + 2 * blocks
    end = start + index_bytes
    local = sparse_indices.decode(buffer[start:end], counts, lengths)
    where = np.repeat(np.arange(blocks), counts) * CHUNK + local
    raw = np.frombuffer(buffer, dtype=np.uint8, offset=end)
    if tag == TAG_SPARSE2:
        codes = np.stack([raw & 3, raw >> 2 & 3, raw >> 4 & 3, raw >> 6], axis=1).reshape(-1)
        if codes[m:].any():
            raise ValueError("bad code: the padding bits after the last code are not zero")
        values = torch.from_numpy(np.array([-2.0, -1.0, 1.0, 2.0], dtype=np.float32)[codes[:m]])
    else:
        scaled = raw.view(np.int8)
        if not scaled.all():
            raise ValueError("a sparse part lists a value of zero")
        values = (torch.from_numpy(scaled.astype(np.float64)) / group_size).to(torch.float32)
    out = torch.zeros(numel, dtype=torch.float32)
    out[torch.from_numpy(where)] = values
    return out


def _pack_sparse_run(v: torch.Tensor, group_size: int, sparse_k: int) -> bytes | None:
    """A sparse run's part as tag 8 or 9 when that holds it exactly and is the smaller; else None."""
    counts = torch.bincount(torch.nonzero(v).flatten() // CHUNK, minlength=_blocks(v.numel())).numpy().astype(np.int64)
    if bool((v == v.round()).all()) and float(v.abs().max()) <= 2 and int(counts.max()) <= sparse_k:
        return _pack_sparse(TAG_SPARSE2, v)
    if group_size > 0:
        scaled = v.to(torch.float64) * group_size
        k = scaled.round()
        if float((scaled - k).abs().max()) <= SCALED_TOLERANCE and float(k.abs().max()) <= 127:
            size = _sparse_size(TAG_SPARSE_SCALED8, counts, sparse_indices.coded_size(counts, chunk_lengths(v.numel())))
            if size < 1 + v.numel():  # else the dense tag 4 is smaller
                return _pack_sparse(TAG_SPARSE_SCALED8, k.to(torch.float32))
    return None


def pack(values: torch.Tensor, group_size: int, sparse_k: int = 0) -> bytes:
    """The tagged bytes of a flat fp32 part; ``group_size`` 0 when no group is running; ``sparse_k``
    > 0 in a sparse run (the sparse tags are tried first)."""
    v = values.detach().reshape(-1).to(torch.float32)
    if sparse_k and v.numel():
        packed = _pack_sparse_run(v, group_size, sparse_k)
        if packed is not None:
            return packed
    if v.numel() and bool((v == v.round()).all()):
        peak = float(v.abs().max())
        if peak <= 7:
            return bytes([TAG_INT4]) + _int4(v)
        if peak <= 127:
            return bytes([TAG_INT8]) + v.to(torch.int8).numpy().tobytes()
        if peak <= FP16_EXACT:
            return bytes([TAG_FP16]) + v.to(torch.float16).numpy().astype("<f2").tobytes()
    if v.numel() and group_size > 0:
        scaled = v.to(torch.float64) * group_size
        k = scaled.round()
        if float((scaled - k).abs().max()) <= SCALED_TOLERANCE:
            peak = float(k.abs().max())
            if peak <= 127:
                return bytes([TAG_SCALED8]) + k.to(torch.int8).numpy().tobytes()
            if peak <= 32767:
                return bytes([TAG_SCALED16]) + k.to(torch.int16).numpy().astype("<i2").tobytes()
    return bytes([TAG_FP32]) + v.numpy().astype("<f4").tobytes()


def unpack(buffer: bytes, numel: int, group_size: int, sparse_k: int = 0) -> torch.Tensor:
    """The fp32 values of a tagged buffer of ``numel`` elements; ValueError on anything malformed."""
    if not buffer:
        raise ValueError("empty packed part")
    tag = buffer[0]
    if tag in SPARSE_TAGS:
        return _unpack_sparse(buffer, numel, group_size, sparse_k)
    expected = 1 + payload_size(tag, numel)
    if len(buffer) != expected:
        raise ValueError(f"packed part of {len(buffer)} bytes, expected {expected} for {numel} elements")
    if numel == 0:
        return torch.zeros(0)
    if tag == TAG_INT4:
        return _from_int4(buffer[1:], numel)
    raw = torch.frombuffer(bytearray(buffer[1:]), dtype=_DTYPES[tag])
    if tag == TAG_FP16:  # any other half value (a fraction, infinity, NaN) would break the exact sums
        values = raw.to(torch.float32)
        if not bool(((values == values.round()) & (values.abs() <= FP16_EXACT)).all()):
            raise ValueError(f"a half-precision part holds a value that is not an integer in "
                             f"[-{FP16_EXACT}, {FP16_EXACT}]")
        return values
    if tag in (TAG_SCALED8, TAG_SCALED16):
        if group_size < 1:
            raise ValueError("a scaled part arrived outside a group")
        return (raw.to(torch.float64) / group_size).to(torch.float32)
    return raw.to(torch.float32)
