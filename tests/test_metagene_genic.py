"""Generated genomes of genes (node/metagene/genic.py): mostly coding, proteins shared across organisms."""

from __future__ import annotations

import random

from intellect_node.node.metagene.genic import CODONS, GENETIC_CODE, make_genic_organisms
from intellect_node.node.metagene.genomes import organisms_from
from intellect_node.node.metagene.synthetic import make_organisms, reverse_complement

CODE = dict(zip(CODONS, GENETIC_CODE, strict=True))
MIN_CODONS = 80  # an open reading frame this long is rare by chance (about 0.95^80 of frames)


def long_orfs(genome: str) -> list[tuple[str, range]]:
    """Open reading frames (ATG to a stop) of at least MIN_CODONS codons in six frames: each one's
    protein and the genome positions it spans."""
    found = []
    for reverse, strand in ((False, genome), (True, reverse_complement(genome))):
        for frame in range(3):
            residues = "".join(CODE.get(strand[i:i + 3], "X") for i in range(frame, len(strand) - 2, 3))
            offset = 0
            for stretch in residues.split("*"):
                start = stretch.find("M")
                if start >= 0 and len(stretch) - start >= MIN_CODONS:
                    first, last = frame + 3 * (offset + start), frame + 3 * (offset + len(stretch))
                    span = range(len(genome) - last, len(genome) - first) if reverse else range(first, last)
                    found.append((stretch[start:], span))
                offset += len(stretch) + 1
    return found


def coding_fraction(genome: str) -> float:
    covered = bytearray(len(genome))
    for _, span in long_orfs(genome):
        covered[span.start:span.stop] = b"\x01" * len(span)
    return sum(covered) / len(genome)


def kmers(proteins: list[str], k: int = 6) -> set[str]:
    return {p[i:i + k] for p in proteins for i in range(len(p) - k + 1)}


def protein_kmers(genome: str) -> set[str]:
    return kmers([protein for protein, _ in long_orfs(genome)])


def test_genic_genomes_are_seeded_exact_in_length_and_mostly_coding() -> None:
    organisms = make_genic_organisms(seed=3, count=3, genome_length=60_000)
    assert organisms == make_genic_organisms(seed=3, count=3, genome_length=60_000)
    assert organisms != make_genic_organisms(seed=4, count=3, genome_length=60_000)
    assert [o.name for o in organisms] == ["org0", "org1", "org2"]
    for organism in organisms:
        assert len(organism.genome) == 60_000 and set(organism.genome) <= set("ACGT")
        assert coding_fraction(organism.genome) > 0.6
    # an order-2 Markov genome of the same size has almost no long open reading frame
    markov = make_organisms(seed=3, count=1, genome_length=60_000)[0].genome
    assert coding_fraction(markov) < 0.1


def test_organisms_share_protein_families_so_more_data_has_more_to_teach() -> None:
    """Homologs recur across organisms: one organism's protein 6-mers occur in another's ten times
    as often (or more) as in as many unrelated proteins."""
    org0, org1 = organisms_from("genic", seed=1, count=2, genome_length=120_000)
    own = protein_kmers(org0.genome)
    shared = len(own & protein_kmers(org1.genome)) / len(own)
    rng = random.Random(0)
    unrelated = ["".join(rng.choices("ACDEFGHIKLMNPQRSTVWY", k=len(protein)))
                 for protein, _ in long_orfs(org1.genome)]
    by_chance = len(own & kmers(unrelated)) / len(own)
    assert shared > 10 * by_chance and shared > 0.01
