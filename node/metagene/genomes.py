"""Real genomes from installed packages: the organisms of an offline metagenome.

Why from installed packages: nothing may download from a hub at run time, and a model trained on
generated genomes (``synthetic``) never meets real sequence statistics. ``pyrodigal`` (GPL-3.0,
so used as an installed data source and never copied into this repository) ships four real
sequences among its test data: a complete Corynebacterium diphtheriae chromosome (2.46 Mbp), an
E. coli contig (870 kbp), a contig assembled from a metagenomic run (SRR492066, 80 kbp) and a
Kutzneria scaffold (20 kbp). ``synthetic.cut_reads`` then turns them into Illumina-like reads.

The files are read like any other input: decompressed size bounded before it is held, one record
expected, letters outside ACGT become N (soft-masked lowercase is uppercased), and runs of 10 or
more N (a scaffold's gaps: half of the E. coli contig) are cut out, so that reads come from
sequenced bases rather than gaps the read filter would drop.
"""

from __future__ import annotations

import gzip
import re
from importlib import resources

from intellect_node.node.metagene.genic import make_genic_organisms
from intellect_node.node.metagene.synthetic import Organism, make_organisms

GENOME_SOURCES = ("generated", "genic", "pyrodigal")
PYRODIGAL_GENOMES = {  # organism name -> file in pyrodigal/tests/data
    "c_diphtheriae": "GCF_001457455.1_NCTC11397_genomic.fna.gz",
    "e_coli": "MIIJ01000039.fna.gz",
    "srr492066_contig": "SRR492066.fna.gz",
    "kutzneria": "KK037166.fna.gz",
}
MAX_GENOME_BYTES = 16 << 20  # decompressed FASTA text per file
_ACGT = str.maketrans({c: "N" for c in "BDEFHIJKLMOPQRSUVWXYZ"})
_GAP = re.compile("N{10,}")


class GenomeSourceError(ValueError):
    """A genome source that cannot be used; the message says which file or package and why."""


def pyrodigal_genomes() -> list[Organism]:
    """The four real sequences in an installed ``pyrodigal``'s test data, named by organism."""
    try:
        data = resources.files("pyrodigal.tests.data")
    except ModuleNotFoundError:
        raise GenomeSourceError("the pyrodigal genomes need the pyrodigal package: pip install pyrodigal==3.7.1 "
                                "(GPL-3.0-or-later; read where it is installed, never copied)") from None
    organisms = []
    for name, filename in PYRODIGAL_GENOMES.items():
        resource = data.joinpath(filename)
        if not resource.is_file():
            raise GenomeSourceError(f"pyrodigal's test data has no {filename} (another pyrodigal version?)")
        with resource.open("rb") as raw:
            organisms.append(Organism(name, read_genome(raw.read(), filename)))
    return organisms


def read_genome(compressed: bytes, label: str) -> str:
    """The one sequence of a gzipped FASTA file, uppercase, non-ACGT letters as N, gaps cut out."""
    try:
        text = gzip.decompress(compressed)[:MAX_GENOME_BYTES + 1]
    except (OSError, EOFError) as exc:
        raise GenomeSourceError(f"{label}: not a readable gzip file ({exc})") from None
    if len(text) > MAX_GENOME_BYTES:
        raise GenomeSourceError(f"{label}: more than {MAX_GENOME_BYTES} bytes of FASTA")
    lines = text.decode("ascii", errors="replace").splitlines()
    if not lines or not lines[0].startswith(">"):
        raise GenomeSourceError(f"{label}: not FASTA (no '>' header on the first line)")
    if any(line.startswith(">") for line in lines[1:]):
        raise GenomeSourceError(f"{label}: more than one record; a genome source holds one sequence per file")
    sequence = _GAP.sub("", "".join(line.strip() for line in lines[1:]).upper().translate(_ACGT))
    if len(sequence) < 1000 or any(c not in "ACGTN" for c in sequence):
        raise GenomeSourceError(f"{label}: not a nucleotide sequence of at least 1,000 bases")
    return sequence


def organisms_from(source: str, seed: int, count: int, genome_length: int) -> list[Organism]:
    """The organisms of a metagenome: ``generated`` (``count`` seeded order-2 Markov genomes),
    ``genic`` (``count`` seeded genomes of genes, node/metagene/genic.py) or ``pyrodigal`` (its four
    real ones; ``count`` and ``genome_length`` do not apply)."""
    if source == "generated":
        return make_organisms(seed, count, genome_length)
    if source == "genic":
        return make_genic_organisms(seed, count, genome_length)
    if source == "pyrodigal":
        return pyrodigal_genomes()
    raise GenomeSourceError(f"unknown genome source {source!r}; choose one of {GENOME_SOURCES}")
