"""A peer's samples for (seed, round, peer id), and the generated corpus they come from.

Why not by rank: a rank needs a fixed world size; here the peer's sample i of round r is
position i of a keyed permutation of the corpus (node/metagene/sharding.py's Feistel network),
keyed by the seed and the peer's id, so any number of peers works, a restarted peer draws the same
samples again, and nobody coordinates (specs/diloco.md section 3).

The corpus: ``generated:sequences=N,seq_len=L,vocab=V,seed=S`` builds N rows of L+1 tokens from a
seeded sparse Markov chain (each token has a few likely successors), so a model has something to
learn and every peer rebuilds the identical corpus from the spec alone, with nothing to download.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from intellect_node.node.metagene.sharding import permute

MAX_SEQUENCES = 1 << 24
SUCCESSORS = 4


@dataclass(frozen=True)
class CorpusSpec:
    sequences: int = 4096
    seq_len: int = 64
    vocab: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if not (1 <= self.sequences <= MAX_SEQUENCES and 2 <= self.seq_len <= 4096 and 8 <= self.vocab <= 65536
                and 0 <= self.seed < 2**32):
            raise ValueError(f"corpus out of bounds: {self}")

    @classmethod
    def parse(cls, spec: str) -> CorpusSpec:
        """``generated:key=value,...`` with keys sequences, seq_len, vocab, seed."""
        kind, _, rest = spec.partition(":")
        if kind != "generated":
            raise ValueError(f"data spec {spec!r}: only 'generated:...' corpora are supported today")
        values: dict[str, int] = {}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            if key not in {"sequences", "seq_len", "vocab", "seed"} or not value.isdigit():
                raise ValueError(f"data spec {spec!r}: bad item {item!r} (keys: sequences, seq_len, vocab, seed)")
            values[key] = int(value)
        return cls(**values)


def generate(spec: CorpusSpec) -> torch.Tensor:
    """(sequences, seq_len + 1) int64 tokens from the spec's Markov chain."""
    g = torch.Generator().manual_seed(spec.seed)
    successors = torch.randint(spec.vocab, (spec.vocab, SUCCESSORS), generator=g)
    rows = torch.empty(spec.sequences, spec.seq_len + 1, dtype=torch.int64)
    rows[:, 0] = torch.randint(spec.vocab, (spec.sequences,), generator=g)
    for t in range(1, spec.seq_len + 1):
        pick = torch.randint(SUCCESSORS, (spec.sequences,), generator=g)
        rows[:, t] = successors[rows[:, t - 1], pick]
    return rows


def peer_key(peer_id: str) -> int:
    """The 64-bit key of a peer's data stream: the first 8 bytes of sha256 of its id."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big")


def round_batch(corpus: torch.Tensor, seed: int, round_: int, key: int, step: int, batch: int) -> torch.Tensor:
    """Rows for inner step ``step`` of ``round_`` of the peer with ``key``."""
    n = corpus.shape[0]
    first = step * batch
    if first + batch > n:
        raise ValueError(f"a round of this length needs {first + batch} samples; the corpus has {n}")
    return corpus[[permute(seed ^ key, round_, n, first + j) for j in range(batch)]]
