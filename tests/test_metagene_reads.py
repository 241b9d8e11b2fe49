"""Reads in: FASTQ/FASTA parsing (plain and gzip, file/dir/glob), hostile input, filtering, dedup."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from intellect_node.node.metagene.filtering import FilterConfig, FilterStats, filter_reads, mean_quality
from intellect_node.node.metagene.reads import ParseStats, ReadFormatError, expand_inputs, iter_reads
from intellect_node.node.metagene.synthetic import cut_reads, make_organisms, write_fasta, write_fastq


@pytest.fixture(scope="module")
def reads() -> list[tuple[str, str, str]]:
    org = make_organisms(7, count=1, genome_length=3000)[0]
    return cut_reads(org, random.Random(1), 40, length=90)


@pytest.mark.parametrize("name", ["a.fastq", "a.fq.gz", "a.fasta", "a.fa.gz"])
def test_parses_plain_and_gzip_fastq_and_fasta(tmp_path: Path, reads, name: str) -> None:
    writer = write_fastq if ".fq" in name or ".fastq" in name else write_fasta
    path = writer(tmp_path / name, reads)
    got = list(iter_reads(path))
    assert [r.sequence for r in got] == [s for _, s, _ in reads]
    assert [r.name for r in got] == [n for n, _, _ in reads]
    assert {r.source for r in got} == {"a"}
    if writer is write_fastq:
        assert [r.quality for r in got] == [q for _, _, q in reads]
    else:
        assert all(r.quality is None for r in got)


def test_directory_and_glob_sorted_with_sources(tmp_path: Path, reads) -> None:
    write_fastq(tmp_path / "b.fq", reads[:5])
    write_fasta(tmp_path / "a.fa.gz", reads[5:8])
    (tmp_path / "notes.txt").write_text("not reads")
    from_dir = [(r.source, r.name) for r in iter_reads(tmp_path)]
    assert from_dir == [("a", n) for n, _, _ in reads[5:8]] + [("b", n) for n, _, _ in reads[:5]]
    assert [p.name for p in expand_inputs(str(tmp_path / "*.fq"))] == ["b.fq"]
    with pytest.raises(ReadFormatError, match="no FASTQ/FASTA files"):
        expand_inputs(str(tmp_path / "*.fastq"))
    with pytest.raises(ReadFormatError, match="no such file"):
        expand_inputs(tmp_path / "missing.fq")


def test_lower_case_is_upper_cased(tmp_path: Path) -> None:
    path = tmp_path / "soft.fa"
    path.write_text(">r\nacgtnACGT\n")
    assert [r.sequence for r in iter_reads(path)] == ["ACGTNACGT"]


BAD_FASTQ = {
    "truncated.fq": ("@r1\nACGT\n+\nIIII\n@r2\nACG\n", r"truncated.fq: line 7: Premature end"),
    "mismatch.fq": ("@r1\nACGT\n+\nIIII\n@r2\nACG\n+\nIIII\n",
                    r"mismatch.fq: line 8: Length of sequence and qualities differ"),
    "letters.fq": ("@r1\nACGT\n+\nIIII\n@r2\nACXT\n+\nIIII\n", r"letters.fq: line 6: letter 'X' at column 3"),
    "empty.fq": ("", r"empty.fq: empty file"),
    "fasta_named.fastq": (">r1\nACGT\n", r"fasta_named.fastq: line 1: content is FASTA but the name says FASTQ"),
    "garbage.fq": ("hello\n", r"garbage.fq: line 1: expected '@'"),
}


@pytest.mark.parametrize("name", sorted(BAD_FASTQ))
def test_malformed_input_names_file_and_line(tmp_path: Path, name: str) -> None:
    text, pattern = BAD_FASTQ[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ReadFormatError, match=pattern):
        list(iter_reads(path))


def test_bad_fasta_letter_names_record(tmp_path: Path) -> None:
    path = tmp_path / "x.fa"
    path.write_text(">ok\nACGT\n>bad one\nAC\nGUT\n")  # U: RNA, not a base of a DNA read
    with pytest.raises(ReadFormatError, match=r"x.fa: record 2 \(bad one\): letter 'U' at column 4 is not one of "
                                              r"ACGTN nor an IUPAC ambiguity code"):
        list(iter_reads(path))


def test_iupac_ambiguity_codes_are_read_as_n_and_counted(tmp_path: Path) -> None:
    """Real assemblies carry a few ambiguity codes (an R where a sample had A and G): each names
    several bases, so it reads as N (and the N filter sees it); a read with none is untouched."""
    path = tmp_path / "assembly.fna"
    path.write_text(">contig1\nACGTRYKM\nswbdhvACGT\n>contig2\nACGTN\n>contig3\nAC*T\n")
    stats = ParseStats()
    got = [(r.name, r.sequence) for r in iter_reads(path, stats, on_bad="skip")]
    assert got == [("contig1", "ACGT" + "N" * 10 + "ACGT"), ("contig2", "ACGTN")]
    assert (stats.reads, stats.ambiguous_reads, stats.bad_reads) == (2, 1, 1)
    assert "letter '*'" in stats.bad_examples[0]


def test_bad_letters_skipped_and_counted_when_configured(tmp_path: Path) -> None:
    path = tmp_path / "x.fq"
    path.write_text("@a\nACGT\n+\nIIII\n@b\nAC-T\n+\nIIII\n@c\nGGGG\n+\nIIII\n")
    stats = ParseStats()
    assert [r.name for r in iter_reads(path, stats, on_bad="skip")] == ["a", "c"]
    assert (stats.reads, stats.bad_reads) == (2, 1)
    assert "x.fq: line 6" in stats.bad_examples[0]


def test_truncated_gzip_is_an_error_not_a_short_read(tmp_path: Path, reads) -> None:
    whole = write_fastq(tmp_path / "w.fq.gz", reads * 20)
    cut = tmp_path / "cut.fq.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ReadFormatError, match=r"cut.fq.gz: .*(compressed|Premature)"):
        list(iter_reads(cut))


def test_endless_line_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.fa.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b">x\n")
        for _ in range(64):
            f.write(b"A" * (1 << 20))  # 64 MiB on one line, 64 KiB on disk
    with pytest.raises(ReadFormatError, match=r"huge.fa.gz: line 2: longer than 4096 bytes"):
        list(iter_reads(path, max_line_bytes=4096))


def test_filter_drops_short_n_rich_low_quality_and_duplicates(tmp_path: Path) -> None:
    good, hi = "ACGT" * 10, "I" * 40  # Phred 40
    records = [
        ("keep", good, hi),
        ("short", "ACGT", "IIII"),
        ("n_rich", "N" * 5 + good[5:], hi),
        ("lowq", "GATC" * 10, "#" * 40),  # Phred 2
        ("dup", good, hi),
        ("keep2", "TTGA" * 10, hi),
    ]
    write_fastq(tmp_path / "s.fq", records)
    stats = FilterStats()
    kept = list(filter_reads(iter_reads(tmp_path / "s.fq"), FilterConfig(min_length=32, max_n_fraction=0.1), stats))
    assert [r.name for r in kept] == ["keep", "keep2"]
    assert (stats.too_short, stats.too_many_n, stats.low_quality, stats.duplicate) == (1, 1, 1, 1)
    assert stats.kept_per_source == {"s": 2}
    assert mean_quality("+5") == pytest.approx((10 + 20) / 2)


def test_dedup_memory_bound_counts_saturation(tmp_path: Path) -> None:
    records = [(f"r{i}", seq, "I" * 40)
               for i, seq in enumerate(["ACGT" * 10, "TTGA" * 10, "CCGA" * 10, "ACGT" * 10, "CCGA" * 10])]
    write_fastq(tmp_path / "d.fq", records)
    stats = FilterStats()
    kept = list(filter_reads(iter_reads(tmp_path / "d.fq"), FilterConfig(max_unique=2), stats))
    # the first two are remembered; the third is kept but not remembered, so its repeat passes
    assert [r.name for r in kept] == ["r0", "r1", "r2", "r4"]
    assert (stats.duplicate, stats.dedup_saturated) == (1, 2)
