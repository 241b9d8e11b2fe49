"""Sparse, exact policy deltas (``sparse/v2``): the changed elements of a checkpoint and how their bits moved.

Between two RL steps almost every element of a policy kept in a 16-bit dtype is unchanged, so a
step travels as the positions that changed and the differences of their bit patterns instead of
the whole file. At RL learning rates a changed bf16 element almost always moved by one unit in its
last place, so its difference is +1 or -1 (as an unsigned integer: 1 or 0xffff) where its new bytes
are as random as the weights: deflate takes the differences to a fifth of a byte each, the new
bytes to about 1.6 (bench/HISTORY.md, "Differences, not new bytes"). The
delta is exact on bit patterns: applied to the base's bytes it gives the result's bytes, which the
receiver then checks against the signed manifest's shard hashes. Nothing here trusts the body: it
is decoded under the bounds of specs/deltas.md section 3 (size before inflating, indices ordered
and in range, sums without overflow) and refused whole on the first violation.

Pure: numpy over buffers, no files, no sockets; ``node/shards/deltas.py`` does the I/O.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import numpy as np

from intellect_node.protocol.errors import InvalidValue, MalformedBody, Oversize, Truncated
from intellect_node.protocol.manifest import DTYPE_SIZES, TensorEntry

DELTA_FORMAT = "sparse/v2"
MAGIC = b"INADELTA"
VERSION = 2
RAW, DEFLATE = 0, 1
_HEAD = struct.Struct(">8sBBQ")  # magic, version, codec, raw_len
_RECORD = struct.Struct(">IQB")  # tensor index, count, gap width
HEAD_SIZE = _HEAD.size  # 18: the smallest body
GAP_WIDTHS = (1, 2, 4, 8)
_HASH_DOMAIN = b"intellect-node/delta/v1\x00"
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# deflate's level 2: a fifth to a third of level 6's time on a step's gaps and differences for 1-8% more
# bytes (bench/HISTORY.md, "The publisher's encode"); the encode is on every step's path
DEFLATE_LEVEL = 2
COMPARE_CHUNK = 1 << 18  # elements compared at a time: their mask (256 KiB) stays in the cache


def delta_hash(body: bytes | memoryview) -> bytes:
    """The 32-byte name of a delta body that the manifest signs."""
    return blake3.blake3(_HASH_DOMAIN + bytes(body)).digest()


@dataclass(frozen=True)
class DeltaRecord:
    """The changed elements of one tensor: flat positions (strictly increasing) and, for each, the
    result's bit pattern minus the base's, as the element's unsigned integer type (wrapping)."""

    entry: TensorEntry
    positions: np.ndarray  # int64 or uint64, strictly increasing, < numel
    differences: np.ndarray  # the tensor's unsigned element type, same length


def _elements(buffer: memoryview, entry: TensorEntry) -> np.ndarray:
    itemsize = DTYPE_SIZES[entry.dtype]
    return np.frombuffer(buffer, dtype=_UINT[itemsize], count=entry.nbytes // itemsize, offset=entry.offset)


def _gap_width(largest: int) -> int:
    return next(width for width in GAP_WIDTHS if largest < 1 << (8 * width))


def _changes(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions where ``new`` differs from ``old`` (increasing) and the differences there
    (``new - old``, wrapping), compared ``COMPARE_CHUNK`` elements at a time into one reused mask.
    Comparing a whole tensor at once writes a mask as large as the tensor (a fresh allocation the
    size of the policy's element count, faulted in page by page) and reads it back from memory:
    two to three times slower on a 269 MB policy (bench/HISTORY.md, "The publisher's encode")."""
    mask = np.empty(min(COMPARE_CHUNK, len(old)), dtype=bool)
    positions: list[np.ndarray] = []
    differences: list[np.ndarray] = []
    for start in range(0, len(old), COMPARE_CHUNK):
        before, after = old[start:start + COMPARE_CHUNK], new[start:start + COMPARE_CHUNK]
        changed = np.flatnonzero(np.not_equal(before, after, out=mask[:len(before)]))
        if len(changed):
            positions.append(changed + start)
            differences.append(after[changed] - before[changed])
    if not positions:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=old.dtype)
    return np.concatenate(positions), np.concatenate(differences)


def encode_delta(tensors: Sequence[TensorEntry], base: bytes | memoryview, result: bytes | memoryview,
                 *, max_raw: int | None = None, max_body: int | None = None) -> bytes | None:
    """The ``sparse/v2`` body that turns ``base`` into ``result`` (two files of one layout), or None
    once the payload passes ``max_raw`` bytes (at most the file's size, which is what a receiver
    accepts): a dense change (an fp32 policy, a high learning rate) is then published in full
    without paying for compressing hundreds of megabytes first.

    With ``max_body``, also None as soon as the body can no longer be at most that long: the
    payload is then deflated record by record as it is made, and both its raw and its deflated
    length only grow. A publisher holding a smaller adapter for the step stops there instead of
    comparing and deflating the rest (a LoRA step's merged policy differs in most elements of every
    adapted weight: 27 MB of payload against a 1.8 MB adapter in bench/delta_broadcast.py). The
    stream is the one ``zlib.compress`` gives for the whole payload: deflate's output does not
    depend on how its input is split.

    Only tensor data is compared: the caller guarantees the header and any padding are identical
    (same tensor index, same total size), and the receiver's hash check catches it if they are not.
    """
    base_view, result_view = memoryview(base).cast("B"), memoryview(result).cast("B")
    if len(base_view) != len(result_view):
        raise ValueError("a delta needs two files of the same size")
    max_raw = len(result_view) if max_raw is None else min(max_raw, len(result_view))
    parts: list[bytes] = []
    packer = zlib.compressobj(DEFLATE_LEVEL)
    packed: list[bytes] = []
    raw_len = packed_len = fed = 0
    for index, entry in enumerate(tensors):
        if not entry.nbytes:
            continue
        positions, differences = _changes(_elements(base_view, entry), _elements(result_view, entry))
        if not len(positions):
            continue
        gaps = np.diff(positions, prepend=-1) - 1
        width = _gap_width(int(gaps.max()))
        parts.append(_RECORD.pack(index, len(positions), width))
        parts.append(gaps.astype(f"<u{width}").tobytes())
        parts.append(differences.astype(differences.dtype.newbyteorder("<")).tobytes())
        raw_len += sum(len(part) for part in parts[-3:])
        if raw_len > max_raw:
            return None
        if max_body is not None:
            chunks = [packer.compress(part) for part in parts[fed:]]
            packed, packed_len, fed = packed + chunks, packed_len + sum(map(len, chunks)), len(parts)
            if HEAD_SIZE + min(raw_len, packed_len) > max_body:
                return None
    packed.extend(packer.compress(part) for part in parts[fed:])
    packed.append(packer.flush())
    raw, deflated = b"".join(parts), b"".join(packed)
    if len(deflated) < len(raw):
        body = _HEAD.pack(MAGIC, VERSION, DEFLATE, len(raw)) + deflated
    else:
        body = _HEAD.pack(MAGIC, VERSION, RAW, len(raw)) + raw
    return body if max_body is None or len(body) <= max_body else None


def _payload(body: bytes | memoryview, total_size: int) -> memoryview:
    """The decoded payload, inflated no further than its declared (and bounded) length."""
    view = memoryview(body).cast("B")
    if len(view) < HEAD_SIZE:
        raise MalformedBody(f"delta body of {len(view)} bytes, shorter than its {HEAD_SIZE}-byte head")
    magic, version, codec, raw_len = _HEAD.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise MalformedBody(f"not a {DELTA_FORMAT} delta body (magic, or version {version} where {VERSION} is read)")
    if codec not in (RAW, DEFLATE):
        raise MalformedBody(f"delta codec {codec}; 0 (raw) and 1 (deflate) exist")
    if raw_len > total_size:
        raise Oversize(f"delta payload of {raw_len} bytes for a {total_size}-byte checkpoint")
    rest = view[HEAD_SIZE:]
    if codec == RAW:
        if len(rest) != raw_len:
            raise MalformedBody(f"raw delta payload of {len(rest)} bytes, its head says {raw_len}")
        return rest
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(rest, raw_len + 1)
    except zlib.error as exc:
        raise MalformedBody(f"delta payload does not inflate: {exc}") from None
    if len(raw) != raw_len or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise MalformedBody(f"delta payload inflates to {len(raw)}+ bytes (head: {raw_len}) or has bytes past its end")
    return memoryview(raw)


def decode_delta(body: bytes | memoryview, tensors: Sequence[TensorEntry], total_size: int) -> list[DeltaRecord]:
    """Every record of ``body``, checked against the result's tensor index; ``Rejected`` on the first fault."""
    payload = _payload(body, total_size)
    records: list[DeltaRecord] = []
    at, previous = 0, -1
    while at < len(payload):
        if at + _RECORD.size > len(payload):
            raise Truncated(f"delta record head at byte {at} runs past the payload's end")
        index, count, width = _RECORD.unpack_from(payload, at)
        at += _RECORD.size
        if not previous < index < len(tensors):
            raise InvalidValue(f"delta record for tensor {index}: out of range or not after tensor {previous}")
        previous = index
        entry = tensors[index]
        itemsize = DTYPE_SIZES[entry.dtype]
        numel = entry.nbytes // itemsize
        if not 1 <= count <= numel:
            raise InvalidValue(f"delta record for {entry.name!r}: {count} changes in {numel} elements")
        if width not in GAP_WIDTHS:
            raise InvalidValue(f"delta record for {entry.name!r}: gap width {width}")
        end = at + count * (width + itemsize)
        if end > len(payload):
            raise Truncated(f"delta record for {entry.name!r} runs past the payload's end")
        gaps = np.frombuffer(payload, dtype=f"<u{width}", count=count, offset=at)
        differences = np.frombuffer(payload, dtype=np.dtype(_UINT[itemsize]).newbyteorder("<"), count=count,
                                    offset=at + count * width)
        records.append(DeltaRecord(entry, _positions(gaps, numel, entry.name), differences))
        at = end
    return records


def _positions(gaps: np.ndarray, numel: int, name: str) -> np.ndarray:
    """Flat positions from gaps, refused unless all lie below ``numel``.

    Every gap is first bounded by ``numel`` (a position is at least its gap), so each step of the
    running sum is below 2^44 and a wrap past 2^64 would show as a sum that fails to increase.
    """
    if int(gaps.max()) >= numel:
        raise InvalidValue(f"delta record for {name!r}: a position at or past its {numel} elements")
    positions = np.cumsum(gaps.astype(np.uint64) + np.uint64(1)) - np.uint64(1)
    wrapped = len(gaps) * numel >= 1 << 63 and bool(np.any(positions[1:] <= positions[:-1]))
    if wrapped or int(positions[-1]) >= numel:
        raise InvalidValue(f"delta record for {name!r}: a position at or past its {numel} elements")
    return positions


def apply_delta(records: Sequence[DeltaRecord], target: memoryview) -> int:
    """Add the records' differences to the elements of ``target``, a writable buffer holding the
    base's whole file, wrapping as unsigned integers do (so the base's bit patterns become the
    result's exactly). Returns the number of elements written. Records come from ``decode_delta``:
    positions already checked against the file's size, each at most once."""
    view = memoryview(target).cast("B")
    changed = 0
    for record in records:
        entry = record.entry
        itemsize = DTYPE_SIZES[entry.dtype]
        elements = np.frombuffer(view, dtype=np.dtype(_UINT[itemsize]).newbyteorder("<"),
                                 count=entry.nbytes // itemsize, offset=entry.offset)
        elements[record.positions] += record.differences
        changed += len(record.positions)
    return changed


def same_layout(base: Sequence[TensorEntry], result: Sequence[TensorEntry]) -> bool:
    """Whether a delta can turn a file of ``base``'s index into one of ``result``'s."""
    return tuple(base) == tuple(result)
