"""A generated metagenome: seeded random genomes of several "organisms" and reads cut from them.

Why generated: tests, the demo and the benchmark must run offline with no hub, and a model can
only show it learned something if the organisms differ. Each organism's genome comes from its own
order-2 Markov chain (a random GC content and random context preferences), so organisms differ in
k-mer composition the way real genomes do, and a probe has something to find. Reads are cut at
random positions on either strand, with substitution errors at ``error_rate`` (given low quality)
and a rare N, as an Illumina run produces. Everything is a pure function of the seed.
"""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass
from pathlib import Path

BASES = "ACGT"
_COMPLEMENT = str.maketrans("ACGTN", "TGCAN")


@dataclass(frozen=True)
class Organism:
    """A named genome."""

    name: str
    genome: str


def markov_table(rng: random.Random, gc: float) -> dict[str, list[float]]:
    """An order-2 chain's next-base weights per two-base context: ``gc`` content, random tilts."""
    base_weights = [(1 - gc) / 2, gc / 2, gc / 2, (1 - gc) / 2]
    return {a + b: [w * rng.uniform(0.3, 1.7) for w in base_weights] for a in BASES for b in BASES}


def markov_run(rng: random.Random, table: dict[str, list[float]], length: int) -> str:
    """``length`` bases of the chain ``table``."""
    out = [rng.choice(BASES), rng.choice(BASES)]
    for _ in range(length - 2):
        out.append(rng.choices(BASES, weights=table[out[-2] + out[-1]])[0])
    return "".join(out)[:length]


def reverse_complement(sequence: str) -> str:
    return sequence.translate(_COMPLEMENT)[::-1]


def random_genome(rng: random.Random, length: int) -> str:
    """An order-2 Markov genome with a random GC content and random context preferences."""
    gc = rng.uniform(0.3, 0.7)
    return markov_run(rng, markov_table(rng, gc), length)


def make_organisms(seed: int, count: int = 4, genome_length: int = 20_000) -> list[Organism]:
    """``count`` organisms named ``org0..`` with distinct composition."""
    rng = random.Random(seed)
    return [Organism(f"org{i}", random_genome(rng, genome_length)) for i in range(count)]


def cut_reads(organism: Organism, rng: random.Random, count: int, length: int = 150,
              error_rate: float = 0.01, n_rate: float = 0.001) -> list[tuple[str, str, str]]:
    """``count`` reads ``(name, sequence, quality)`` of ``organism``; errors get Phred 5-15,
    correct bases Phred 28-40."""
    reads = []
    genome = organism.genome
    for i in range(count):
        start = rng.randrange(0, len(genome) - length)
        seq = genome[start:start + length]
        if rng.random() < 0.5:
            seq = reverse_complement(seq)
        letters, quals = [], []
        for base in seq:
            roll = rng.random()
            if roll < n_rate:
                letters.append("N"); quals.append(chr(33 + 2))
            elif roll < n_rate + error_rate:
                letters.append(rng.choice([b for b in BASES if b != base])); quals.append(chr(33 + rng.randint(5, 15)))
            else:
                letters.append(base); quals.append(chr(33 + rng.randint(28, 40)))
        reads.append((f"{organism.name}_{i}", "".join(letters), "".join(quals)))
    return reads


def write_fastq(path: Path, reads: list[tuple[str, str, str]]) -> Path:
    """Write reads as FASTQ, gzipped when the name ends in .gz (mtime 0: reproducible bytes)."""
    text = "".join(f"@{name}\n{seq}\n+\n{qual}\n" for name, seq, qual in reads)
    _write(path, text)
    return path


def write_fasta(path: Path, reads: list[tuple[str, str, str]], width: int = 60) -> Path:
    """Write reads as FASTA wrapped at ``width``, gzipped when the name ends in .gz."""
    parts = []
    for name, seq, _ in reads:
        parts.append(f">{name}\n")
        parts.extend(seq[i:i + width] + "\n" for i in range(0, len(seq), width))
    _write(path, "".join(parts))
    return path


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=1) as gz:
            gz.write(text.encode())
    else:
        path.write_text(text)


def write_metagenome(out: Path, seed: int = 0, organisms: int = 4, reads_per_organism: int = 500,
                     genome_length: int = 20_000, read_length: int = 150,
                     genomes: list[Organism] | None = None) -> list[Path]:
    """One gzipped FASTQ per organism under ``out`` (``org0.fastq.gz``...): the file is the
    read's source label, as evaluation expects. ``genomes`` (``genomes.organisms_from``: real
    ones) replaces the ``organisms`` generated ones."""
    rng = random.Random(seed + 1)
    paths = []
    for organism in genomes or make_organisms(seed, organisms, genome_length):
        reads = cut_reads(organism, rng, reads_per_organism, read_length)
        paths.append(write_fastq(out / f"{organism.name}.fastq.gz", reads))
    return paths
