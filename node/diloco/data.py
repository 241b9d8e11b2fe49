"""A peer's samples for (seed, round, peer id) and their loss: the ``PeerData`` interface every
workload's data meets (``workload``), and the toy LM's generated corpus.

Why not by rank: a rank needs a fixed world size; here the peer's sample i of round r is
position i of a keyed permutation of the corpus (``permutation``'s Feistel network), keyed by the
seed and the peer's id, so any number of peers works, a restarted peer draws the same samples
again, and nobody coordinates (specs/diloco.md section 3).

The corpus: ``generated:sequences=N,seq_len=L,vocab=V,seed=S`` builds N rows of L+1 tokens from a
seeded sparse Markov chain (each token has a few likely successors), so a model has something to
learn and every peer rebuilds the identical corpus from the spec alone, with nothing to download.
(METAGENE's read store, ``metagene:store=DIR``, is node/metagene/workload.py's.)
"""


from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from intellect_node.node.diloco.data_spec import CorpusSpec
from intellect_node.node.diloco.permutation import permute

SUCCESSORS = 4


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


def lm_loss(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of the generated corpus's rows (row[:-1] predicts row[1:])."""
    logits = model(input_ids=rows[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))


class PeerData(Protocol):
    """What a peer trains on: the batch of inner step ``step`` of round ``round_`` for the peer with
    ``key`` (seed, batch size and round length are fixed when the source is opened), and its loss.
    ``digest``: the content the members of a round must share beyond the model (empty: nothing to
    check), folded into the digest they sign and compare (``layout.run_digest``)."""

    digest: bytes

    def draw(self, round_: int, key: int, step: int) -> Any: ...

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """The loss to minimise and the number of target tokens it covers."""
        ...


@dataclass(frozen=True)
class GeneratedData:
    """The generated corpus's rows, drawn by ``round_batch``."""

    rows: torch.Tensor
    seed: int
    batch: int
    digest: bytes = b""  # the rows are a function of the [diloco] data spec: peers agree on it by config

    def draw(self, round_: int, key: int, step: int) -> torch.Tensor:
        return round_batch(self.rows, self.seed, round_, key, step, self.batch)

    def loss(self, model: torch.nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        return lm_loss(model, batch), batch[:, 1:].numel()
