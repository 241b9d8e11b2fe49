"""A peer's samples for (seed, round, peer id), from the generated corpus or a METAGENE read store.

Why not by rank: a rank needs a fixed world size; here the peer's sample i of round r is
position i of a keyed permutation of the corpus (node/metagene/sharding.py's Feistel network),
keyed by the seed and the peer's id, so any number of peers works, a restarted peer draws the same
samples again, and nobody coordinates (specs/diloco.md section 3).

The corpus: ``generated:sequences=N,seq_len=L,vocab=V,seed=S`` builds N rows of L+1 tokens from a
seeded sparse Markov chain (each token has a few likely successors), so a model has something to
learn and every peer rebuilds the identical corpus from the spec alone, with nothing to download.

``metagene:store=DIR[,seq_len=L]``: the tokenized read store that ``intellect-node metagene
store`` writes (node/metagene/dataset.py); a peer trains on one block of ``H * batch`` reads of the
round's permutation (node/metagene/sharding.py ``peer_reads``), ``batch`` reads per inner step packed
into rows of ``L`` (default 512, at most the model's context) with the document mask, under the
METAGENE-1 loss (cross entropy plus z-loss 2e-4). Every peer must hold the same store (same reads,
same tokenizer): its digest (node/metagene/digest.py) is part of what round members compare, so a
peer with another store is refused. The store's ids must fit the model's vocabulary (a metagene
preset: 1024).
"""


from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from intellect_node.node.diloco.data_spec import CorpusSpec, MetageneSpec, parse_data
from intellect_node.node.metagene.sharding import permute

if TYPE_CHECKING:
    from intellect_node.node.metagene.dataset import TokenizedReads

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


@dataclass(frozen=True)
class MetageneData:
    """A peer's reads of a round from a tokenized read store, with the METAGENE-1 loss."""

    store: TokenizedReads
    seed: int
    batch: int  # reads per inner step
    reads_per_round: int  # H * batch
    seq_len: int
    vocab: int
    z_loss: float
    digest: bytes  # the store's tokenizer and ids (node/metagene/digest.py): peers with another store are refused

    @classmethod
    def open(cls, spec: MetageneSpec, seed: int, batch: int, H: int, context: int, vocab: int) -> MetageneData:
        from intellect_node.node.metagene.dataset import TokenizedReads
        from intellect_node.node.metagene.digest import store_digest
        from intellect_node.node.metagene.loss import Z_LOSS_WEIGHT

        if not (spec.store / "reads.json").is_file():
            raise ValueError(f"metagene store {spec.store}: no reads.json there (write one with "
                             "`intellect-node metagene store --reads ... --tokenizer ... --out DIR`)")
        try:
            store = TokenizedReads.load(spec.store)
            digest = store_digest(spec.store, store)
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"metagene store {spec.store}: unreadable ({exc})") from None
        if len(store) < H * batch:
            raise ValueError(f"metagene store {spec.store}: a round needs {H * batch} reads per peer "
                             f"(H {H} x batch {batch}); the store has {len(store)}")
        return cls(store, seed, batch, H * batch, min(spec.seq_len, context), vocab, Z_LOSS_WEIGHT, digest)

    def draw(self, round_: int, key: int, step: int) -> Any:
        from intellect_node.node.metagene.feed import peer_step_batch

        batch = peer_step_batch(self.store, self.seed, round_, key, self.reads_per_round, step, self.batch,
                                self.seq_len)
        if int(batch.input_ids.max()) >= self.vocab:
            raise ValueError(f"a read of the store has token id {int(batch.input_ids.max())}, outside the "
                             f"model's vocabulary of {self.vocab}: store and model do not fit")
        return batch

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        from intellect_node.node.metagene.loss import lm_loss as metagene_loss

        parts = metagene_loss(model(**batch.model_inputs()).logits, batch.labels, self.z_loss)
        return parts.total, parts.tokens


def open_data(spec: str, seed: int, batch: int, H: int, context: int, vocab: int) -> PeerData:
    """The data source a spec names; errors name the spec or the store."""
    parsed = parse_data(spec)
    if isinstance(parsed, MetageneSpec):
        return MetageneData.open(parsed, seed, batch, H, context, vocab)
    return GeneratedData(generate(parsed), seed, batch)
