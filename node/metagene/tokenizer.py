"""The METAGENE-1 tokenizer: byte-pair encoding over nucleotides, trained on reads.

Layout (fixed so that every peer's ids agree, see specs/metagene.md): vocabulary 1024; ids 0-5
are the specials ``[PAD] [UNK] [SEP] [BOS] [EOS] [MASK]``, ids 6-10 the nucleotides ``A C G N
T`` (sorted), the rest BPE merges learned from reads. No pre-tokenizer (a read is one word: merges may
span any position) and a fusing decoder, so ``decode(encode(read)) == read``. Saved in the HF
layout (``tokenizer.json`` plus ``tokenizer_config.json``) that ``AutoTokenizer`` loads.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, trainers

if TYPE_CHECKING:  # transformers takes seconds to import: the ids above are read by configs that need none of it
    from transformers import PreTrainedTokenizerFast

MAX_TOKENIZER_BYTES = 16 << 20  # a 1024-token BPE is about 50 KB

SPECIALS = ("[PAD]", "[UNK]", "[SEP]", "[BOS]", "[EOS]", "[MASK]")
NUCLEOTIDES = ("A", "C", "G", "N", "T")  # in id order: the BPE trainer sorts its alphabet
VOCAB_SIZE = 1024
PAD_ID, UNK_ID, SEP_ID, BOS_ID, EOS_ID, MASK_ID = range(6)


def train_tokenizer(sequences: Iterable[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """BPE trained on ``sequences`` (upper-case ACGTN reads)."""
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(SPECIALS) + len(NUCLEOTIDES) + 1:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges")
    core = Tokenizer(models.BPE(unk_token="[UNK]"))
    core.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=list(NUCLEOTIDES), limit_alphabet=len(NUCLEOTIDES),
                                  show_progress=False)
    core.train_from_iterator(sequences, trainer=trainer)
    for want, token in enumerate(SPECIALS + NUCLEOTIDES):
        if core.token_to_id(token) != want:
            raise RuntimeError(f"tokenizer layout broken: {token} got id {core.token_to_id(token)}, expected {want}")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", sep_token="[SEP]",
                                   bos_token="[BOS]", eos_token="[EOS]", mask_token="[MASK]",
                                   model_max_length=512, clean_up_tokenization_spaces=False)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out: Path) -> Path:
    """Write the HF layout into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    return out


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """Load a saved tokenizer and check it has our special-token layout (a foreign tokenizer would
    silently train on wrong ids)."""
    from transformers import AutoTokenizer

    file = path / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json (expected a directory written by `metagene tokenizer`)")
    if file.stat().st_size > MAX_TOKENIZER_BYTES:  # transformers reads it whole
        raise ValueError(f"{file}: over {MAX_TOKENIZER_BYTES >> 20} MiB, not a METAGENE tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # a hostile file fails as any type transformers or tokenizers raise (even bare)
        raise ValueError(f"{file}: not a loadable tokenizer ({type(exc).__name__}: {exc})") from None
    for want, token in enumerate(SPECIALS + NUCLEOTIDES):
        if tokenizer.convert_tokens_to_ids(token) != want:
            raise ValueError(f"{path}: not a METAGENE tokenizer ({token} is not id {want})")
    return tokenizer


@dataclass(frozen=True)
class TokenStats:
    """Compression on a set of reads: base pairs per token (total bp / total tokens) and the
    median token length in bp (METAGENE-1 reports a median of about 6 bp)."""

    reads: int
    base_pairs: int
    tokens: int
    bp_per_token: float
    median_token_bp: float


def token_stats(tokenizer: PreTrainedTokenizerFast, sequences: list[str]) -> TokenStats:
    """Encode ``sequences`` (no specials) and measure compression."""
    encoded = tokenizer(sequences, add_special_tokens=False)["input_ids"]
    lengths_of = {i: len(t) for t, i in tokenizer.get_vocab().items()}
    token_lengths = [lengths_of[i] for ids in encoded for i in ids]
    bp = sum(len(s) for s in sequences)
    n = len(token_lengths)
    return TokenStats(len(sequences), bp, n, bp / n if n else 0.0, statistics.median(token_lengths) if n else 0.0)
