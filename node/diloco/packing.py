"""How the grid's numbers travel inside hivemind's all-reduce: the exact packed wire format.

Why tags instead of one format: the same compression object serializes both directions of
hivemind's all-reduce. Going up, a member's part holds grid integers (``grid.quantize``): with
int8 and int4 grids they fit one signed byte each, exactly. Coming back, a reducer sends each
member ``S/n - q``: times the group size ``n`` that is the integer ``S - n·q``, which fits a
signed 16-bit integer for the int8 and int4 grids; the receiver divides by ``n`` and recovers the
exact sum as before (``grid.recover_sums``). Anything else (the int16 grid's larger integers)
goes as fp32, so exactness never depends on which tag was chosen. specs/diloco.md section 4.

``buffer = tag (1 byte) || payload``: tag 0, int8 values; tag 1, int16 little-endian values of
``v·n``; tag 2, fp32 little-endian values.
"""

from __future__ import annotations

import torch

TAG_INT8, TAG_SCALED16, TAG_FP32 = 0, 1, 2
WIDTH = {TAG_INT8: 1, TAG_SCALED16: 2, TAG_FP32: 4}
_DTYPES = {TAG_INT8: torch.int8, TAG_SCALED16: torch.int16, TAG_FP32: torch.float32}
SCALED_TOLERANCE = 0.01  # v·n must be this close to an integer (deltas are, up to fp32 rounding)


def pack(values: torch.Tensor, group_size: int) -> bytes:
    """The tagged bytes of a flat fp32 part; ``group_size`` 0 when no group is running."""
    v = values.detach().reshape(-1).to(torch.float32)
    if v.numel() and bool((v == v.round()).all()) and float(v.abs().max()) <= 127:
        return bytes([TAG_INT8]) + v.to(torch.int8).numpy().tobytes()
    if v.numel() and group_size > 0:
        scaled = v.to(torch.float64) * group_size
        k = scaled.round()
        if float(k.abs().max()) <= 32767 and float((scaled - k).abs().max()) <= SCALED_TOLERANCE:
            return bytes([TAG_SCALED16]) + k.to(torch.int16).numpy().astype("<i2").tobytes()
    return bytes([TAG_FP32]) + v.numpy().astype("<f4").tobytes()


def unpack(buffer: bytes, numel: int, group_size: int) -> torch.Tensor:
    """The fp32 values of a tagged buffer of ``numel`` elements; ValueError on anything malformed."""
    if not buffer:
        raise ValueError("empty packed part")
    tag = buffer[0]
    if tag not in WIDTH:
        raise ValueError(f"unknown packing tag {tag}")
    if len(buffer) != 1 + numel * WIDTH[tag]:
        raise ValueError(f"packed part of {len(buffer)} bytes, expected {1 + numel * WIDTH[tag]} for {numel} elements")
    raw = torch.frombuffer(bytearray(buffer[1:]), dtype=_DTYPES[tag]) if numel else torch.zeros(0, dtype=_DTYPES[tag])
    if tag == TAG_SCALED16:
        if group_size < 1:
            raise ValueError("a scaled part arrived outside a group")
        return (raw.to(torch.float64) / group_size).to(torch.float32)
    return raw.to(torch.float32)
