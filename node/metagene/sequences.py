"""Training sequences from tokenized reads: truncation, EOS, packing and the document mask.

A read with tokens ``t0..t(n-1)`` (n <= 512) becomes one item of n positions: inputs
``t0..t(n-1)``, labels ``t1..t(n-1) EOS``, positions ``0..n-1``. So a read of 512 tokens plus EOS
fills a context of 512 exactly, and no label ever crosses from one read into the next.

Packing (context stuffing, as METAGENE-1) puts items one after another into rows of ``seq_len``
positions, greedily in the given order: an item that does not fit in the current row closes it
(padded) and starts the next. Attention stays inside each read (document masking): query ``q``
may attend key ``k`` iff both belong to the same read and ``k <= q``; a padding position attends
only to itself (so no row of the mask is empty) and carries label -100. Positions restart at 0
for each read, so a packed read computes exactly what it computes alone. The mask is passed to
the model as a 4D additive float mask (transformers uses a 4D mask as given), which eager and
SDPA attention both honour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from intellect_node.node.metagene.tokenizer import EOS_ID, PAD_ID

IGNORE = -100


@dataclass
class PackedBatch:
    """Rows of ``seq_len`` positions; ``document_ids`` is the read's index within its row (-1 pad)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor

    def attention_mask(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The 4D additive mask ``[rows, 1, seq_len, seq_len]``: 0 where attention is allowed."""
        docs = self.document_ids
        length = docs.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        same = (docs[:, :, None] == docs[:, None, :]) & (docs[:, :, None] >= 0)
        allowed = (same & causal) | torch.eye(length, dtype=torch.bool)
        mask = torch.zeros(allowed.shape, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[:, None]

    def model_inputs(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Keyword arguments for a transformers causal LM forward."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids,
                "attention_mask": self.attention_mask(dtype)}

    @property
    def target_tokens(self) -> int:
        return int((self.labels != IGNORE).sum())


def plan_rows(lengths: Sequence[int], seq_len: int, pack: bool = True) -> list[list[int]]:
    """Indices into ``lengths`` grouped into rows, greedily in order (one per row unpacked)."""
    rows: list[list[int]] = []
    used = seq_len
    for i, n in enumerate(lengths):
        if not 0 < n <= seq_len:
            raise ValueError(f"item {i} has {n} positions; each must be within 1..{seq_len}")
        if not pack or used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    return rows


def build_rows(reads: Sequence[np.ndarray], seq_len: int, pack: bool = True) -> PackedBatch:
    """Reads (token ids, already truncated) into one batch of rows, as the module docstring says."""
    rows = plan_rows([len(r) for r in reads], seq_len, pack)
    shape = (len(rows), seq_len)
    input_ids = torch.full(shape, PAD_ID, dtype=torch.long)
    labels = torch.full(shape, IGNORE, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    docs = torch.full(shape, -1, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for d, index in enumerate(row):
            ids = torch.as_tensor(np.asarray(reads[index], dtype=np.int64))
            n = len(ids)
            input_ids[r, at:at + n] = ids
            labels[r, at:at + n - 1] = ids[1:]
            labels[r, at + n - 1] = EOS_ID
            positions[r, at:at + n] = torch.arange(n)
            docs[r, at:at + n] = d
            at += n
    return PackedBatch(input_ids, labels, positions, docs)
