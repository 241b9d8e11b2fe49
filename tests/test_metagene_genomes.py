"""Real genomes from an installed package (pyrodigal's test data) as a metagenome's organisms."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from intellect_node.cli.main import app
from intellect_node.node.metagene import genomes
from intellect_node.node.metagene.genomes import GenomeSourceError, organisms_from, pyrodigal_genomes, read_genome
from intellect_node.node.metagene.reads import iter_reads
from intellect_node.node.metagene.synthetic import write_metagenome

pytest.importorskip("pyrodigal",
                    reason="the real genomes come from an installed pyrodigal (setup.sh --dev installs it)")


def test_the_four_pyrodigal_genomes_are_real_sequences_of_distinct_composition() -> None:
    organisms = {o.name: o.genome for o in pyrodigal_genomes()}
    assert set(organisms) == set(genomes.PYRODIGAL_GENOMES)
    assert len(organisms["c_diphtheriae"]) == 2_463_666 and 400_000 < len(organisms["e_coli"]) < 869_782  # gaps cut
    assert all(set(seq) <= set("ACGTN") for seq in organisms.values())
    gc = {name: (seq.count("G") + seq.count("C")) / len(seq) for name, seq in organisms.items()}
    assert 0.52 < gc["c_diphtheriae"] < 0.55 and 0.49 < gc["e_coli"] < 0.52  # the species' known GC content
    assert organisms_from("pyrodigal", 0, 99, 1) == pyrodigal_genomes()  # count and length do not apply


def test_reads_cut_from_real_genomes_parse_with_their_organism_as_source(tmp_path) -> None:
    paths = write_metagenome(tmp_path, seed=3, reads_per_organism=40, genomes=pyrodigal_genomes())
    reads = list(iter_reads(tmp_path))
    assert len(paths) == 4 and Counter(r.source for r in reads) == {name: 40 for name in genomes.PYRODIGAL_GENOMES}
    assert all(len(r.sequence) == 150 for r in reads)
    # a read is a piece of its genome (either strand) up to the simulated errors
    genome = next(o.genome for o in pyrodigal_genomes() if o.name == "kutzneria")
    read = next(r for r in reads if r.source == "kutzneria").sequence
    reverse = read.translate(str.maketrans("ACGTN", "TGCAN"))[::-1]
    assert any(piece[:20] in genome for piece in (read, reverse) if "N" not in piece[:20]) or "N" in read[:20]


def _gzip(data: bytes) -> bytes:
    """A gzip file whose bytes do not depend on the clock (test ids and parallel runs agree)."""
    return gzip.compress(data, mtime=0)


@pytest.mark.parametrize("data, why", [
    (b"not gzip at all", "not a readable gzip"),
    (_gzip(b"ACGT\n" * 400), "no '>' header"),
    (_gzip(b">a\n" + b"ACGT" * 400 + b"\n>b\nACGT\n"), "more than one record"),
    (_gzip(b">a\nACGT\n"), "at least 1,000 bases"),
    (_gzip(b">a\n" + b"AC~T" * 400 + b"\n"), "at least 1,000 bases"),
], ids=["not gzip", "no header", "two records", "too short", "not bases"])
def test_bad_genome_files_are_refused_naming_the_file(data: bytes, why: str) -> None:
    with pytest.raises(GenomeSourceError, match=why) as caught:
        read_genome(data, "broken.fna.gz")
    assert "broken.fna.gz" in str(caught.value)


def test_an_oversized_genome_file_is_refused_before_it_is_held(monkeypatch) -> None:
    monkeypatch.setattr(genomes, "MAX_GENOME_BYTES", 2_000)
    with pytest.raises(GenomeSourceError, match="more than 2000 bytes"):
        read_genome(gzip.compress(b">a\n" + b"ACGT" * 1000 + b"\n"), "big.fna.gz")
    assert read_genome(gzip.compress(b">a\n" + b"acgtRY" * 200 + b"\n"), "ok.fna.gz").startswith("ACGTNN")
    gapped = read_genome(gzip.compress(b">a\n" + b"ACGT" * 200 + b"N" * 50 + b"TTGA" * 200 + b"\n"), "gap.fna.gz")
    assert gapped == "ACGT" * 200 + "TTGA" * 200  # a scaffold's gap is cut out


def test_synth_command_writes_a_real_metagenome_and_refuses_an_unknown_source(tmp_path) -> None:
    result = CliRunner().invoke(app, ["metagene", "synth", "--out", str(tmp_path / "m"), "--reads", "5",
                                      "--genomes", "pyrodigal"])
    assert result.exit_code == 0, result.output
    assert sorted(p.rsplit("/", 1)[1] for p in json.loads(result.stdout)["files"]) == sorted(
        f"{name}.fastq.gz" for name in genomes.PYRODIGAL_GENOMES)
    result = CliRunner().invoke(app, ["metagene", "synth", "--out", str(tmp_path / "n"), "--genomes", "hub"])
    assert result.exit_code == 2 and "unknown genome source 'hub'" in result.output
    result = CliRunner().invoke(app, ["demo", "--workload", "metagene", "--genomes", "hub"])
    assert result.exit_code == 2 and "--genomes 'hub'" in result.output


def test_a_held_out_region_is_never_covered_by_training_reads(tmp_path) -> None:
    """``held_out = "region"``: the training genomes are the first nine tenths, the held-out ones the
    rest, for the real genomes too; every training read (errors aside) lies inside the training part.
    ``reads`` keeps one genome for both; an unknown split or a genome too short to split is refused."""
    from intellect_node.node.demo.metagene import MetageneDemoOptions, split_genomes

    organisms = pyrodigal_genomes()
    training, held = split_genomes(organisms, "region")
    for whole, train, rest in zip(organisms, training, held, strict=True):
        assert train.name == rest.name == whole.name
        assert train.genome + rest.genome == whole.genome
        assert len(rest.genome) == len(whole.genome) - int(len(whole.genome) * 0.9)
    assert split_genomes(organisms, "reads") == (organisms, organisms)
    write_metagenome(tmp_path, seed=3, reads_per_organism=40, genomes=training[:1])
    rest = held[0].genome
    complement = str.maketrans("ACGT", "TGCA")
    for read in iter_reads(tmp_path):
        kmers = {read.sequence[i:i + 24] for i in range(0, len(read.sequence) - 24, 24)}
        kmers |= {k.translate(complement)[::-1] for k in kmers}
        assert not any(k in rest for k in kmers if "N" not in k and len(set(k)) > 2)
    with pytest.raises(ValueError, match="held_out"):
        MetageneDemoOptions(held_out="genome")
    short = type(organisms[0])("tiny", organisms[0].genome[:1000])
    with pytest.raises(ValueError, match="too short"):
        split_genomes([short], "region")
