"""Generated genomes made of genes: shared protein families written in each organism's codon usage.

Why: an order-2 Markov genome (``synthetic.random_genome``) has 16 contexts to learn. A model
reaches its entropy floor on a few hundred thousand bases, so no amount of further data, and no
number of DiLoCo peers, can show in its held-out loss (bench/HISTORY.md measured the floor). Real
bacterial genomes are about 88% genes, and most of what a genomic model learns from more data is
the proteins those genes encode: homologs recur across organisms and as paralogs within one, each
organism spelling them in its own codon usage. These genomes have that structure, so held-out
sequence (even a region of a genome no training read covers) is predictable in proportion to how
many relatives of its genes a model has seen.

The model, all of it a pure function of the seed:

- ``families`` protein families shared by every organism: random sequences of 80 to 400 amino
  acids at natural amino-acid frequencies, each starting with M.
- Per organism: a GC content, an order-2 Markov chain for the sequence between genes (the
  ``synthetic`` one), a codon usage (each amino acid's synonymous codons weighted at random,
  tilted by GC at the third position), and its own variant of every family (a fraction
  ``divergence`` of 10% to 30% of the residues substituted).
- A genome is spacers of 30 to 250 bases alternating with genes on a random strand. A gene is a
  family drawn with weight ``1 / (rank + 1)`` (a few large families, a long tail), its organism
  variant with 2% further substitutions (a paralog), spelt codon by codon, with a stop codon.
"""

from __future__ import annotations

import random

from intellect_node.node.metagene.synthetic import Organism, markov_run, markov_table, reverse_complement

# the standard genetic code: codon i of CODONS (TCAG order in each position) encodes GENETIC_CODE[i]
CODONS = [a + b + c for a in "TCAG" for b in "TCAG" for c in "TCAG"]
GENETIC_CODE = "FFLLSSSSYY**CC*WLLLLPPPPHHQQRRRRIIIMTTTTNNKKSSRRVVVVAAAADDEEGGGG"
STOP = "*"
# natural amino-acid frequencies (percent, UniProtKB/Swiss-Prot)
AMINO_ACID_PERCENT = {
    "A": 8.25, "R": 5.53, "N": 4.06, "D": 5.45, "C": 1.37, "Q": 3.93, "E": 6.75, "G": 7.07, "H": 2.27,
    "I": 5.96, "L": 9.66, "K": 5.84, "M": 2.42, "F": 3.86, "P": 4.70, "S": 6.56, "T": 5.34, "W": 1.08,
    "Y": 2.92, "V": 6.87,
}
RESIDUES, RESIDUE_WEIGHTS = tuple(AMINO_ACID_PERCENT), tuple(AMINO_ACID_PERCENT.values())
PROTEIN_LENGTHS = (80, 400)
SPACER_LENGTHS = (30, 250)
DIVERGENCE = (0.1, 0.3)  # of an organism's variant of a family from the family
PARALOG_DIVERGENCE = 0.02  # of each gene from its organism's variant
BASES_PER_FAMILY = 4000  # the default family count: one per this many bases of genome


def random_protein(rng: random.Random, length: int) -> str:
    return "M" + "".join(rng.choices(RESIDUES, weights=RESIDUE_WEIGHTS, k=length - 1))


def protein_families(rng: random.Random, count: int) -> list[str]:
    return [random_protein(rng, rng.randint(*PROTEIN_LENGTHS)) for _ in range(count)]


def mutate(rng: random.Random, protein: str, rate: float) -> str:
    """``protein`` with a fraction ``rate`` of its residues after the start substituted at random."""
    out = list(protein)
    for i in range(1, len(out)):
        if rng.random() < rate:
            out[i] = rng.choices(RESIDUES, weights=RESIDUE_WEIGHTS)[0]
    return "".join(out)


def codon_usage(rng: random.Random, gc: float) -> dict[str, tuple[list[str], list[float]]]:
    """Each amino acid (and the stop) -> its codons and this organism's weights for them."""
    usage: dict[str, tuple[list[str], list[float]]] = {}
    for codon, residue in zip(CODONS, GENETIC_CODE, strict=True):
        codons, weights = usage.setdefault(residue, ([], []))
        codons.append(codon)
        weights.append(rng.uniform(0.05, 1.0) * (gc if codon[2] in "GC" else 1 - gc))
    return usage


def spell(rng: random.Random, protein: str, usage: dict[str, tuple[list[str], list[float]]]) -> str:
    """A coding sequence of ``protein`` in ``usage``, ending in a stop codon."""
    return "".join(rng.choices(*usage[residue])[0] for residue in protein + STOP)


def genic_genome(rng: random.Random, length: int, families: list[str]) -> str:
    """One organism's genome of ``length`` bases (see the module docstring)."""
    gc = rng.uniform(0.3, 0.7)
    table = markov_table(rng, gc)
    usage = codon_usage(rng, gc)
    divergence = rng.uniform(*DIVERGENCE)
    variants = [mutate(rng, family, divergence) for family in families]
    rank_weights = [1 / (rank + 1) for rank in range(len(families))]
    parts: list[str] = []
    size = 0
    while size < length:
        spacer = markov_run(rng, table, rng.randint(*SPACER_LENGTHS))
        gene = spell(rng, mutate(rng, rng.choices(variants, weights=rank_weights)[0], PARALOG_DIVERGENCE), usage)
        if rng.random() < 0.5:
            gene = reverse_complement(gene)
        parts += [spacer, gene]
        size += len(spacer) + len(gene)
    return "".join(parts)[:length]


def make_genic_organisms(seed: int, count: int = 4, genome_length: int = 20_000,
                         families: int | None = None) -> list[Organism]:
    """``count`` organisms named ``org0..`` sharing ``families`` protein families (default: one
    per BASES_PER_FAMILY bases of a genome, at least 20)."""
    rng = random.Random(seed)
    shared = protein_families(rng, families or max(20, genome_length // BASES_PER_FAMILY))
    return [Organism(f"org{i}", genic_genome(rng, genome_length, shared)) for i in range(count)]
