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
"""

from __future__ import annotations

import torch

TAG_INT8, TAG_SCALED16, TAG_FP32, TAG_INT4, TAG_SCALED8, TAG_FP16 = 0, 1, 2, 3, 4, 5
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


def pack(values: torch.Tensor, group_size: int) -> bytes:
    """The tagged bytes of a flat fp32 part; ``group_size`` 0 when no group is running."""
    v = values.detach().reshape(-1).to(torch.float32)
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


def unpack(buffer: bytes, numel: int, group_size: int) -> torch.Tensor:
    """The fp32 values of a tagged buffer of ``numel`` elements; ValueError on anything malformed."""
    if not buffer:
        raise ValueError("empty packed part")
    tag = buffer[0]
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
