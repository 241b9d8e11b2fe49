"""Batches for a (seed, round, peer): what the DiLoCo role (``workload``) and local pretraining call.

Why separate from ``sharding``: the assignment is protocol (every peer must agree); turning the
assigned reads into batches is a local choice (rows per step, packing) that a peer may tune to its
memory without disagreeing with anyone about which reads it owns.
"""

from __future__ import annotations

from intellect_node.node.metagene.dataset import TokenizedReads
from intellect_node.node.metagene.sequences import PackedBatch, build_rows
from intellect_node.node.metagene.sharding import peer_reads, shard_indices


def round_batches(store: TokenizedReads, seed: int, round_: int, peer: int, peers: int, reads_per_peer: int,
                  reads_per_batch: int, seq_len: int = 512, pack: bool = True) -> list[PackedBatch]:
    """The peer's reads for the round, in assignment order, cut into batches of
    ``reads_per_batch`` reads, each batch packed into rows of ``seq_len``."""
    if reads_per_batch < 1:
        raise ValueError("reads_per_batch must be at least 1")
    indices = shard_indices(seed, round_, peer, peers, reads_per_peer, len(store))
    reads = [store.read(i)[:seq_len] for i in indices]
    return [build_rows(reads[i:i + reads_per_batch], seq_len, pack) for i in range(0, len(reads), reads_per_batch)]


def peer_step_batch(store: TokenizedReads, seed: int, round_: int, key: int, reads_per_round: int, step: int,
                    reads_per_batch: int, seq_len: int = 512, pack: bool = True) -> PackedBatch:
    """Inner step ``step`` of an elastic DiLoCo peer (64-bit ``key``, no rank): reads
    ``step * reads_per_batch ..`` of its ``reads_per_round`` reads of the round (``sharding.peer_reads``),
    packed into rows of ``seq_len``."""
    indices = peer_reads(seed, round_, key, reads_per_round, len(store), step * reads_per_batch, reads_per_batch)
    return build_rows([store.read(i)[:seq_len] for i in indices], seq_len, pack)
