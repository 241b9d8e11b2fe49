"""A keyed permutation of ``[0, n)``: how a peer's samples are drawn with no coordination.

Why a keyed permutation rather than a shuffled list: every peer must compute the same assignment
with no communication, bit for bit, in any implementation, for any corpus size, without holding a
permutation of billions of indices. It is a 4-round Feistel network over the smallest even bit
width that covers ``n``, with cycle walking to stay inside ``[0, n)`` (a bijection on ``[0, n)``);
the round function is blake2b, so the assignment does not depend on a library's random number
generator. specs/metagene.md states the function and test vectors (its domain string is the one
METAGENE's read sharding, node/metagene/sharding.py, first used; the generated corpus draws with it too).
"""

from __future__ import annotations

import hashlib

FEISTEL_ROUNDS = 4
_DOMAIN = b"metagene-shard-v1"


def _half_bits(n: int) -> int:
    bits = max(2, (n - 1).bit_length())
    return (bits + 1) // 2


def permute(seed: int, epoch: int, n: int, index: int) -> int:
    """The epoch's permutation of ``[0, n)`` at ``index``."""
    if not 0 <= index < n:
        raise ValueError(f"index {index} outside [0, {n})")
    if not (0 <= seed < 2**64 and 0 <= epoch < 2**64):
        raise ValueError("seed and epoch must fit in 64 unsigned bits")
    half = _half_bits(n)
    mask = (1 << half) - 1
    prefix = _DOMAIN + seed.to_bytes(8, "little") + epoch.to_bytes(8, "little") + n.to_bytes(8, "little")
    value = index
    while True:
        left, right = value >> half, value & mask
        for r in range(FEISTEL_ROUNDS):
            digest = hashlib.blake2b(prefix + bytes([r]) + right.to_bytes(8, "little"), digest_size=8).digest()
            left, right = right, left ^ (int.from_bytes(digest, "little") & mask)
        value = (left << half) | right
        if value < n:
            return value
