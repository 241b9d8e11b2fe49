"""Reads -> tokenizer and reads -> tokenized store: the work behind ``metagene tokenizer``,
``metagene store`` and ``join --role diloco --workload metagene`` (node/metagene/prepare.py).

Why one module: the three entry points must filter, train and tokenize identically, or two peers
that built their stores through different commands would disagree on the ids; so the commands
only parse flags and print, and this module does the work and returns what to report.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from transformers import PreTrainedTokenizerFast

from intellect_node.node.metagene.filtering import FilterConfig, FilterStats, filter_reads
from intellect_node.node.metagene.reads import ParseStats, Read, iter_reads

TOKENIZER_DIR = "tokenizer"  # a store's tokenizer, beside its ids
TOKENIZER_SAMPLE = 20_000  # reads whose compression a tokenizer report measures


@dataclass(frozen=True)
class ReadOptions:
    """How reads are parsed and filtered: the ``--min-quality``, ``--max-n``, ``--min-length`` and
    ``--on-bad`` flags of every command that reads FASTQ/FASTA."""

    filter: FilterConfig = field(default_factory=FilterConfig)
    on_bad: Literal["error", "skip"] = "error"

    def __post_init__(self) -> None:
        if self.on_bad not in ("error", "skip"):
            raise ValueError(f"on_bad must be 'error' or 'skip', not {self.on_bad!r}")

    def describe(self) -> dict[str, Any]:
        """The options as plain values (for cache keys and reports)."""
        f = self.filter
        return {"min_length": f.min_length, "max_n_fraction": f.max_n_fraction, "min_mean_quality": f.min_mean_quality,
                "dedup": f.dedup, "max_unique": f.max_unique, "on_bad": self.on_bad}


def filtered_reads(reads: list[str], options: ReadOptions) -> tuple[Iterator[Read], ParseStats, FilterStats]:
    """The reads ``reads`` names (files, directories, globs), parsed and filtered, streamed; the
    stats fill in as the stream is consumed."""
    parse, kept = ParseStats(), FilterStats()
    return filter_reads(iter_reads(reads, parse, options.on_bad), options.filter, kept), parse, kept


def build_tokenizer(reads: list[str], options: ReadOptions, vocab: int, max_reads: int,
                    out: Path) -> tuple[PreTrainedTokenizerFast, dict[str, Any]]:
    """Train the BPE tokenizer on the first ``max_reads`` filtered reads, save it in ``out`` (HF
    layout plus ``metagene_tokenizer.json``, the report) and return it with the report.
    ValueError (ReadFormatError included) names what was wrong."""
    from intellect_node.node.metagene.tokenizer import save_tokenizer, token_stats, train_tokenizer

    stream, parse, kept = filtered_reads(reads, options)
    sequences = [r.sequence for r in itertools.islice(stream, max_reads)]
    if not sequences:
        raise ValueError(f"{', '.join(reads)}: no reads left after filtering")
    tokenizer = train_tokenizer(sequences, vocab)
    stats = token_stats(tokenizer, sequences[:TOKENIZER_SAMPLE])
    report = {"out": str(out), "reads": len(sequences), "bp_per_token": round(stats.bp_per_token, 3),
              "median_token_bp": stats.median_token_bp, "skipped_bad_letters": parse.bad_reads,
              "ambiguous_reads": parse.ambiguous_reads,
              "filtered": {"too_short": kept.too_short, "too_many_n": kept.too_many_n,
                           "low_quality": kept.low_quality, "duplicate": kept.duplicate}}
    save_tokenizer(tokenizer, out)
    (out / "metagene_tokenizer.json").write_text(json.dumps(report, indent=2))
    return tokenizer, report


def build_store(reads: list[str], tokenizer: PreTrainedTokenizerFast, options: ReadOptions,
                out: Path) -> dict[str, Any]:
    """Tokenize the filtered reads into the flat store DiLoCo peers draw from, in ``out``, with the
    tokenizer beside the ids (``out/tokenizer``: the ids' meaning travels with them). Returns the
    report; ValueError names what was wrong (no file is written then)."""
    from intellect_node.node.metagene.dataset import tokenize_reads
    from intellect_node.node.metagene.tokenizer import save_tokenizer

    stream, parse, kept = filtered_reads(reads, options)
    built = tokenize_reads(stream, tokenizer)
    if not len(built):
        raise ValueError(f"{', '.join(reads)}: no reads left after filtering")
    built.save(out)
    save_tokenizer(tokenizer, out / TOKENIZER_DIR)
    return {"out": str(out), "reads": len(built), "tokens": int(built.offsets[-1]), "sources": built.source_names,
            "skipped_bad_letters": parse.bad_reads, "ambiguous_reads": parse.ambiguous_reads,
            "dropped": kept.seen - kept.kept}
