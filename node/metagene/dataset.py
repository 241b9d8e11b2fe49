"""Tokenized reads: every read's token ids in one flat array, with offsets and a source per read.

Why a flat store: DiLoCo peers draw reads by index (``sharding``), so the reads must be
addressable by position without re-parsing FASTQ; ``uint16`` ids (vocabulary 1024) and ``int64``
offsets cost 2 bytes per token, and ``load`` memory-maps them, so a store larger than memory
still works. Each read is truncated to ``max_read_tokens`` (512, as METAGENE-1) here; EOS is
added when sequences are built. Peers that tokenize the same files with the same tokenizer and
filter get identical stores (order is file order, then read order).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from intellect_node.node.config.loader import read_json_bounded
from intellect_node.node.metagene.reads import Read

MAX_READ_TOKENS = 512
MAX_META_BYTES = 16 << 20  # reads.json: counts and one name per source file (at most 65,536, uint16 ids)
_FILES = ("tokens.npy", "offsets.npy", "sources.npy")


@dataclass
class TokenizedReads:
    """Reads as token ids. ``offsets[i]:offsets[i+1]`` slices read ``i`` out of ``tokens``;
    ``sources[i]`` indexes ``source_names`` (the read's file label)."""

    tokens: np.ndarray
    offsets: np.ndarray
    sources: np.ndarray
    source_names: list[str]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def read(self, index: int) -> np.ndarray:
        """Token ids of read ``index`` (no EOS)."""
        return self.tokens[self.offsets[index]:self.offsets[index + 1]]

    def source(self, index: int) -> str:
        return self.source_names[int(self.sources[index])]

    def subset(self, indices: Iterable[int]) -> "TokenizedReads":
        """A new store holding the given reads, in the given order."""
        indices = list(indices)
        parts = [self.read(i) for i in indices]
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.concatenate(parts).astype(np.uint16) if parts else np.zeros(0, np.uint16)
        return TokenizedReads(tokens, offsets, self.sources[indices].astype(np.uint16), list(self.source_names))

    def save(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        for name, array in zip(_FILES, (self.tokens, self.offsets, self.sources), strict=True):
            np.save(out / name, array)
        (out / "reads.json").write_text(json.dumps({"reads": len(self), "tokens": int(self.offsets[-1]),
                                                    "source_names": self.source_names}))
        return out

    @classmethod
    def load(cls, path: Path) -> "TokenizedReads":
        """The store at ``path``; its ``reads.json`` may be anyone's file (``--data metagene:store=DIR``),
        so it is read bounded and every way it can be wrong is a ValueError naming it."""
        meta_path = path / "reads.json"
        try:
            meta = read_json_bounded(meta_path, MAX_META_BYTES)
            reads, names = meta["reads"], list(meta["source_names"])
            if isinstance(reads, bool) or not isinstance(reads, int):
                raise TypeError(f"reads is {reads!r}")
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{meta_path}: not a store's reads.json ({type(exc).__name__}: {exc})") from None
        tokens, offsets, sources = (np.load(path / name, mmap_mode="r") for name in _FILES)
        if len(offsets) != reads + 1 or len(sources) != reads or int(offsets[-1]) != len(tokens):
            raise ValueError(f"{path}: inconsistent tokenized reads (arrays disagree with reads.json)")
        return cls(tokens, offsets, sources, names)


def tokenize_reads(reads: Iterable[Read], tokenizer: PreTrainedTokenizerFast,
                   max_read_tokens: int = MAX_READ_TOKENS, batch: int = 4096) -> TokenizedReads:
    """Encode reads in batches (the Rust tokenizer's batch path) into a ``TokenizedReads``."""
    if len(tokenizer) > 1 << 16:
        raise ValueError("vocabulary too large for uint16 token ids")
    chunks: list[np.ndarray] = []
    lengths: list[int] = []
    sources: list[int] = []
    names: dict[str, int] = {}
    pending: list[Read] = []

    def flush() -> None:
        encoded = tokenizer([r.sequence for r in pending], add_special_tokens=False)["input_ids"]
        for read, ids in zip(pending, encoded, strict=True):
            ids = ids[:max_read_tokens]
            chunks.append(np.asarray(ids, dtype=np.uint16))
            lengths.append(len(ids))
            sources.append(names.setdefault(read.source, len(names)))
        pending.clear()

    for read in reads:
        pending.append(read)
        if len(pending) >= batch:
            flush()
    if pending:
        flush()
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, np.uint16)
    offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int64)
    return TokenizedReads(tokens, offsets, np.asarray(sources, dtype=np.uint16), list(names))


def holdout_split(store: TokenizedReads, fraction: float, seed: int = 0) -> tuple[TokenizedReads, TokenizedReads]:
    """``(train, held_out)``: a read is held out when blake2b(seed, its tokens) falls under
    ``fraction``. By content, not position, so the same read lands on the same side for every peer
    and every file order."""
    if not 0.0 < fraction < 1.0:
        raise ValueError("fraction must be within (0, 1)")
    threshold = int(fraction * 2**64)
    key = seed.to_bytes(8, "little")
    held = [int.from_bytes(hashlib.blake2b(key + store.read(i).tobytes(), digest_size=8).digest(), "little") < threshold
            for i in range(len(store))]
    return (store.subset(i for i, h in enumerate(held) if not h), store.subset(i for i, h in enumerate(held) if h))
