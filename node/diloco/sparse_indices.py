"""The indices of a sparse part, Elias-Fano coded: about 7 bits an index at top-128 of 4,096, not 12.

Why: in a ``topk<k>`` run each value sent is a 2-bit code, so with plain 12-bit block-local
indices six sevenths of the bytes going up are indices. Elias-Fano codes ``n`` sorted indices
below ``U`` in ``n * (2 + log2(U / n))`` bits at most, and its layout follows from ``n`` and ``U``
alone: both sides compute every field's place from the block counts that precede it, so coding
and decoding are whole-array numpy operations, with no bit-by-bit loop over a part.

One block (``n`` > 0 indices, ascending, all below the block length ``U``):

- ``l = floor(log2(U / n))`` low bits per index (0 when ``U < 2n``);
- high bitmap, ``n + ((U - 1) >> l) + 1`` bits: index ``j`` (0-based rank) sets bit
  ``(index >> l) + j``;
- low bits: ``index & (2^l - 1)`` in ``l`` bits, least significant first.

A part's index section is every block's high bitmap in block order, then every block's low bits in
block order, as one stream of bits (bit ``i`` is bit ``i mod 8`` of byte ``i div 8``), zero-padded
to a whole byte. specs/diloco.md section 4a. The decoder refuses: a block whose bitmap does not
hold exactly its count of set bits, an index at or past its block's length, indices not strictly
ascending, and pad bits that are set.
"""

from __future__ import annotations

import numpy as np

MAX_LOW_BITS = 12  # U <= 4096 = CHUNK: no block needs more


def low_bits(counts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``floor(log2(U / n))`` per block (0 for an empty block)."""
    ratio = np.where(counts > 0, lengths // np.maximum(counts, 1), 1)
    return (np.frexp(ratio.astype(np.float64))[1] - 1).astype(np.int64)  # exact: frexp(x) = m * 2^e, m in [0.5, 1)


def _layout(counts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Per block: low bits, high-bitmap start, low-bits start (in the stream); then where the
    high bitmaps end and the stream's bits."""
    low = low_bits(counts, lengths)
    high = np.where(counts > 0, counts + ((lengths - 1) >> low) + 1, 0)
    high_start = np.concatenate([[0], np.cumsum(high)[:-1]]).astype(np.int64)
    high_end, low_sizes = int(high.sum()), counts * low
    low_start = high_end + np.concatenate([[0], np.cumsum(low_sizes)[:-1]]).astype(np.int64)
    return low, high_start, low_start, high_end, high_end + int(low_sizes.sum())


def coded_size(counts: np.ndarray, lengths: np.ndarray) -> int:
    """Bytes of the index section for blocks of ``lengths`` holding ``counts`` indices."""
    return (_layout(counts, lengths)[4] + 7) // 8


def _ranks(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each index's block and its rank within the block."""
    block = np.repeat(np.arange(counts.size), counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return block, np.arange(int(counts.sum())) - first[block]


def encode(local: np.ndarray, counts: np.ndarray, lengths: np.ndarray) -> bytes:
    """The index section of block-local indices ``local`` (ascending within each block, blocks in
    order, ``counts[b]`` of them in block ``b``)."""
    local = local.astype(np.int64)
    low, high_start, low_start, _, total = _layout(counts, lengths)
    bits = np.zeros(total + (-total) % 8, dtype=np.uint8)
    block, rank = _ranks(counts)
    width = low[block]
    bits[high_start[block] + (local >> width) + rank] = 1
    field = low_start[block] + rank * width
    for t in range(MAX_LOW_BITS):
        has = width > t
        bits[field[has] + t] = (local[has] >> t) & 1
    return np.packbits(bits, bitorder="little").tobytes()


def decode(section: bytes, counts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The block-local indices of an index section (``coded_size`` bytes); ValueError naming the
    first thing wrong."""
    low, high_start, low_start, high_end, total = _layout(counts, lengths)
    bits = np.unpackbits(np.frombuffer(section, dtype=np.uint8), bitorder="little")
    if bits.size != total + (-total) % 8:
        raise ValueError(f"index section of {len(section)} bytes, expected {(total + 7) // 8}")
    if bits[total:].any():
        raise ValueError("the padding bits after the indices are not zero")
    ones = np.flatnonzero(bits[:high_end])
    owner = np.searchsorted(high_start, ones, side="right") - 1
    found = np.bincount(owner, minlength=counts.size) if ones.size else np.zeros(counts.size, np.int64)
    if not np.array_equal(found, counts):
        wrong = int(np.flatnonzero(found != counts)[0])
        raise ValueError(f"the high bits of chunk {wrong} mark {int(found[wrong])} indices, its count is "
                         f"{int(counts[wrong])}")
    block, rank = _ranks(counts)
    width = low[block]
    local = (ones - high_start[block] - rank) << width
    field = low_start[block] + rank * width
    for t in range(MAX_LOW_BITS):
        has = width > t
        local[has] |= bits[field[has] + t].astype(np.int64) << t
    if (local >= lengths[block]).any():
        bad = np.flatnonzero(local >= lengths[block])[0]
        raise ValueError(f"index out of range: {int(local[bad])} in a chunk of {int(lengths[block[bad]])}")
    if ((np.diff(local) <= 0) & (np.diff(block) == 0)).any():
        raise ValueError("duplicate or unsorted index within a chunk")
    return local
