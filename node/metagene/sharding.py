"""Which reads a DiLoCo peer trains on in a round: a pure function of (seed, round, peer).

Why a keyed permutation rather than a shuffled list: every peer must compute the same assignment
with no communication (node/diloco/permutation.py's Feistel network). Each epoch is one such
permutation of the store. A round takes ``peers * reads_per_peer`` consecutive positions of the
epoch's permutation, peer p the p-th block of them: within a round, peers' reads are disjoint;
within an epoch, no read repeats; a new epoch is a new permutation. The ``n mod (peers *
reads_per_peer)`` positions left over at the end of each epoch are skipped (different reads
each epoch). specs/metagene.md states the function and test vectors.
"""

from __future__ import annotations

import hashlib

from intellect_node.node.diloco.permutation import permute


def shard_indices(seed: int, round_: int, peer: int, peers: int, reads_per_peer: int, n_reads: int) -> list[int]:
    """Indices of the reads that ``peer`` (0-based, of ``peers``) trains on in ``round_``."""
    if peers < 1 or reads_per_peer < 1 or not 0 <= peer < peers or round_ < 0:
        raise ValueError(f"bad shard request: peer {peer} of {peers}, round {round_}, {reads_per_peer} reads per peer")
    per_round = peers * reads_per_peer
    if per_round > n_reads:
        raise ValueError(f"a round needs {per_round} reads ({peers} peers x {reads_per_peer}) "
                         f"but the store has {n_reads}")
    rounds_per_epoch = n_reads // per_round
    epoch, within = divmod(round_, rounds_per_epoch)
    base = within * per_round + peer * reads_per_peer
    return [permute(seed, epoch, n_reads, base + j) for j in range(reads_per_peer)]


_PEER_DOMAIN = b"metagene-peer-block-v1"


def peer_block(seed: int, round_: int, key: int, reads_per_peer: int, n_reads: int) -> int:
    """The block of the round's permutation that the peer with 64-bit ``key`` trains on: a hash of
    (seed, round, key) modulo the ``n_reads // reads_per_peer`` blocks (specs/metagene.md)."""
    if not (0 <= key < 2**64 and 0 <= round_ < 2**64):
        raise ValueError("peer key and round must fit in 64 unsigned bits")
    if not 1 <= reads_per_peer <= n_reads:
        raise ValueError(f"a round needs {reads_per_peer} reads per peer but the store has {n_reads}")
    digest = hashlib.blake2b(_PEER_DOMAIN + seed.to_bytes(8, "little") + round_.to_bytes(8, "little")
                             + key.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (n_reads // reads_per_peer)


def peer_reads(seed: int, round_: int, key: int, reads_per_peer: int, n_reads: int, first: int = 0,
               count: int | None = None) -> list[int]:
    """Reads ``first .. first + count - 1`` (default: all ``reads_per_peer``) of the peer with ``key``
    in ``round_``, for an elastic group (no rank, no member list): every peer takes one block of
    ``reads_per_peer`` consecutive positions of the round's permutation, the block chosen by
    ``peer_block``. Two peers' reads are disjoint unless they hash to the same block (probability
    ``1 / (n_reads // reads_per_peer)`` per pair and round, drawn afresh every round); a peer's
    reads never repeat within a round."""
    count = reads_per_peer - first if count is None else count
    if not (0 <= first and 0 <= count and first + count <= reads_per_peer):
        raise ValueError(f"reads {first}..{first + count - 1} outside a round of {reads_per_peer} reads per peer")
    base = peer_block(seed, round_, key, reads_per_peer, n_reads) * reads_per_peer
    return [permute(seed, round_, n_reads, base + j) for j in range(first, first + count)]
