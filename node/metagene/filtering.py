"""Quality-aware filtering and exact-duplicate removal of reads, with counts of what was dropped.

Why these rules: METAGENE-1's reads are short Illumina reads in which a run of N or a low mean
Phred score marks a failed read, and exact duplicates (PCR and optical duplicates) would be
over-weighted in training and leak between train and held-out sets.

Duplicates are found by a 64-bit blake2b digest of the sequence, held in a set of at most
``max_unique`` digests (about 100 bytes each; the default bounds it near 1 GB). Past that bound
new sequences are no longer remembered (counted in ``dedup_saturated``): memory stays bounded on
any input, at the price of missing duplicates of reads first seen after the bound.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from intellect_node.node.metagene.reads import Read


@dataclass(frozen=True)
class FilterConfig:
    """Thresholds; a read is kept when every one passes. ``min_mean_quality`` applies to FASTQ only
    (FASTA has no qualities). 0 disables a threshold."""

    min_length: int = 32
    max_n_fraction: float = 0.1
    min_mean_quality: float = 20.0
    dedup: bool = True
    max_unique: int = 10_000_000

    def __post_init__(self) -> None:
        if self.min_length < 1:
            raise ValueError("min_length must be at least 1")
        if not 0.0 <= self.max_n_fraction <= 1.0:
            raise ValueError("max_n_fraction must be within [0, 1]")
        if not 0.0 <= self.min_mean_quality <= 93.0:
            raise ValueError("min_mean_quality must be a Phred score within [0, 93]")
        if self.max_unique < 0:
            raise ValueError("max_unique must be non-negative")


@dataclass
class FilterStats:
    """Reads seen, kept and dropped by reason."""

    seen: int = 0
    kept: int = 0
    too_short: int = 0
    too_many_n: int = 0
    low_quality: int = 0
    duplicate: int = 0
    dedup_saturated: int = 0
    kept_per_source: dict[str, int] = field(default_factory=dict)


def mean_quality(quality: str) -> float:
    """Mean Phred score of a Phred+33 quality string (the arithmetic mean, as fastp reports)."""
    return sum(quality.encode()) / len(quality) - 33.0


def filter_reads(reads: Iterable[Read], config: FilterConfig = FilterConfig(),
                 stats: FilterStats | None = None) -> Iterator[Read]:
    """Yield the reads that pass ``config``, in input order, counting the rest in ``stats``."""
    stats = stats if stats is not None else FilterStats()
    seen_digests: set[bytes] = set()
    for read in reads:
        stats.seen += 1
        length = len(read.sequence)
        if length < config.min_length:
            stats.too_short += 1
            continue
        if read.sequence.count("N") > config.max_n_fraction * length:
            stats.too_many_n += 1
            continue
        if read.quality is not None and config.min_mean_quality > 0 \
                and mean_quality(read.quality) < config.min_mean_quality:
            stats.low_quality += 1
            continue
        if config.dedup:
            digest = hashlib.blake2b(read.sequence.encode(), digest_size=8).digest()
            if digest in seen_digests:
                stats.duplicate += 1
                continue
            if len(seen_digests) < config.max_unique:
                seen_digests.add(digest)
            else:
                stats.dedup_saturated += 1
        stats.kept += 1
        stats.kept_per_source[read.source] = stats.kept_per_source.get(read.source, 0) + 1
        yield read
