"""The METAGENE workload as DiLoCo runs it (node/diloco/workload.py): its presets, its data spec
``metagene:store=DIR[,seq_len=L]``, a peer's reads of a round and the METAGENE-1 loss.

A peer trains on one block of ``H * batch`` reads of the round's permutation (``sharding``
``peer_reads``), ``batch`` reads per inner step packed into rows of ``L`` (default 512, at most the
model's context) with the document mask, under the METAGENE-1 loss (cross entropy plus z-loss 2e-4).
Every peer must hold the same store (same reads, same tokenizer): its digest (``digest``) is part of
what round members compare, so a peer with another store is refused. The store's ids must fit the
model's vocabulary, so the model is one of ``presets`` (vocabulary 1024).

Registered on import: the node's assembly imports this module (node/app/join.py), so a
``[diloco]`` section may name these presets and this data. Torch-free until a store is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from intellect_node.node.diloco.data_spec import spec_items
from intellect_node.node.diloco.workload import Workload, register
from intellect_node.node.metagene.presets import PRESETS, build_model

if TYPE_CHECKING:
    import torch

    from intellect_node.node.metagene.dataset import TokenizedReads
    from intellect_node.node.metagene.sequences import PackedBatch

SYNTAX = "'metagene:store=DIR[,seq_len=L]'"


@dataclass(frozen=True)
class MetageneSpec:
    store: Path
    seq_len: int = 512

    @classmethod
    def parse(cls, spec: str) -> MetageneSpec:
        values = spec_items(spec, "metagene", {"seq_len"}, {"store"}, SYNTAX)
        if "store" not in values:
            raise ValueError(f"data spec {spec!r}: needs store=DIR "
                             f"(a directory written by `intellect-node metagene store`)")
        seq_len = int(values.get("seq_len", 512))
        if not 2 <= seq_len <= 4096:
            raise ValueError(f"data spec {spec!r}: seq_len {seq_len} outside 2..4096")
        return cls(Path(values["store"]).expanduser(), seq_len)


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

    def draw(self, round_: int, key: int, step: int) -> PackedBatch:
        from intellect_node.node.metagene.feed import peer_step_batch

        batch = peer_step_batch(self.store, self.seed, round_, key, self.reads_per_round, step, self.batch,
                                self.seq_len)
        if int(batch.input_ids.max()) >= self.vocab:
            raise ValueError(f"a read of the store has token id {int(batch.input_ids.max())}, outside the "
                             f"model's vocabulary of {self.vocab}: store and model do not fit")
        return batch

    def loss(self, model: torch.nn.Module, batch: PackedBatch) -> tuple[torch.Tensor, int]:
        from intellect_node.node.metagene.loss import lm_loss

        parts = lm_loss(model(**batch.model_inputs()).logits, batch.labels, self.z_loss)
        return parts.total, parts.tokens


METAGENE = Workload("metagene", SYNTAX, PRESETS, MetageneSpec.parse, MetageneData.open, build_model,
                    preset_rule="a preset whose vocabulary fits its tokenizer (1024)")
register(METAGENE)
