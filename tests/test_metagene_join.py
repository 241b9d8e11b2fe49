"""``join --role diloco --workload metagene --reads``: the store is built once per content and
reused, its digest covers the tokenizer and the ids, a changed store is rebuilt, round members
with another digest are refused, and bad input is an exit-2 error naming the file, before any
node starts. (Two real nodes refusing each other: tests/test_metagene_join_swarm.py.)"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from intellect_node.cli.main import app
from intellect_node.node.config.loader import load_section
from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.membership import disagreement
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.metagene.build import ReadOptions
from intellect_node.node.metagene.digest import store_digest
from intellect_node.node.metagene.job import MetageneJob
from intellect_node.node.metagene.prepare import prepare_store
from intellect_node.node.metagene.synthetic import write_metagenome
from intellect_node.node.metagene.workload import MetageneData

OPTIONS = ReadOptions()


@pytest.fixture(scope="module")
def reads(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reads")
    write_metagenome(root / "a", seed=1, organisms=2, reads_per_organism=80, genome_length=3000)
    write_metagenome(root / "b", seed=2, organisms=2, reads_per_organism=80, genome_length=3000)
    return root


def _prepare(reads: list[str], root: Path, tokenizer: Path | None = None, lines: list[str] | None = None):
    return prepare_store(reads, tokenizer, root, OPTIONS, 128, 1000, (lines if lines is not None else []).append)


def test_store_is_built_once_reused_and_rebuilt_when_changed(tmp_path, reads) -> None:
    lines: list[str] = []
    first = _prepare([str(reads / "a")], tmp_path, lines=lines)
    assert not first.reused and first.reads == 160 and any("training the BPE tokenizer" in l for l in lines)
    again = _prepare([str(reads / "a" / "*.fastq.gz")], tmp_path)  # the same files, named by a glob
    assert again.reused and again.path == first.path and again.digest == first.digest
    other = _prepare([str(reads / "b")], tmp_path)
    assert not other.reused and other.path != first.path and other.digest != first.digest
    # the same reads through a given tokenizer: another store, and the digest follows the tokenizer
    given = _prepare([str(reads / "a")], tmp_path / "given", tokenizer=other.path / "tokenizer")
    assert not given.reused and given.digest not in (first.digest, other.digest)
    # a store altered after it was built is not trusted: rebuilt, back to the recorded content
    tokens = np.load(first.path / "tokens.npy")
    tokens[0] ^= 1
    np.save(first.path / "tokens.npy", tokens)
    assert store_digest(first.path) != first.digest
    lines.clear()
    rebuilt = _prepare([str(reads / "a")], tmp_path, lines=lines)
    assert not rebuilt.reused and rebuilt.digest == first.digest and any("changed since it was built" in l
                                                                         for l in lines)


def test_peers_compare_a_run_digest_of_model_and_store(tmp_path, reads) -> None:
    a, b = _prepare([str(reads / "a")], tmp_path), _prepare([str(reads / "b")], tmp_path)
    layout = Layout.of({"w": torch.zeros(3)})
    assert layout.run_digest(b"") == layout.digest()  # data without a digest: the layout hash, as before
    ours, theirs = layout.run_digest(a.digest), layout.run_digest(b.digest)
    assert ours != theirs != layout.digest()
    payload = {"member": "12D3KooWtheirs", "layout": theirs}
    assert disagreement(payload | {"layout": ours}, ours) is None
    why = disagreement(payload, ours)
    assert why is not None and "12D3KooWtheirs" in why and "other data" in why
    # the data the DiLoCo role opens carries the store's digest, recomputed from its files
    opened = DilocoSettings(data=f"metagene:store={a.path},seq_len=64", model="tiny", H=2, batch=2).open_data()
    assert isinstance(opened, MetageneData) and opened.digest == a.digest


def _join(home: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["join", "--role", "diloco", "--new-swarm", "--home", str(home),
                                      "--listen", "/ip4/127.0.0.1/tcp/0", *args])
    return result.exit_code, result.output


def test_bad_reads_and_flags_are_clear_errors_before_the_node_starts(tmp_path, reads) -> None:
    fasta = tmp_path / "genome.fastq"
    fasta.write_text(">chr1\nACGTACGT\n")
    empty = tmp_path / "empty.fq.gz"
    with gzip.open(empty, "wb"):
        pass
    truncated = tmp_path / "cut.fastq.gz"
    truncated.write_bytes((reads / "a" / "org0.fastq.gz").read_bytes()[:300])
    cases = {("--workload", "metagene", "--reads", str(tmp_path / "missing")): "missing: no such file or directory",
             ("--workload", "metagene", "--reads", str(fasta)):
                 "genome.fastq: line 1: content is FASTA but the name says FASTQ",
             ("--workload", "metagene", "--reads", str(empty)): "empty.fq.gz: empty file",
             ("--workload", "metagene", "--reads", str(truncated)): "cut.fastq.gz",
             ("--workload", "metagene", "--reads", str(reads / "a"), "--tokenizer", str(tmp_path)): "no tokenizer.json",
             ("--workload", "metagene"): "needs reads",
             ("--reads", str(reads / "a")): "--reads and --tokenizer go with --workload metagene",
             ("--workload", "rl", "--reads", str(reads / "a")): "unknown workload 'rl'",
             ("--workload", "metagene", "--reads", str(reads / "a"), "--data", "generated:"): "drop --data"}
    for args, message in cases.items():
        code, output = _join(tmp_path / "home", *args)
        assert code == 2 and message in output.replace("\n", ""), (args, output)
        assert "Traceback" not in output
    assert not list((tmp_path / "home" / "metagene" / "stores").glob("*"))  # nothing half-built was left
    result = CliRunner().invoke(app, ["join", "--role", "inference", "--home", str(tmp_path / "home"), "--new-swarm",
                                      "--workload", "metagene", "--reads", str(reads / "a")])
    assert result.exit_code == 2 and "are for --role diloco" in result.output


def test_metagene_section_names_bad_keys_and_flags_win() -> None:
    def job_of(table, flags=None):
        return load_section(MetageneJob, "metagene", table, "cfg.toml", flags, {})

    with pytest.raises(ValueError, match=r"cfg.toml \[metagene\]: unknown keys \['read'\]"):
        job_of({"read": ["x"]})
    with pytest.raises(ValueError, match=r"\[metagene\] min_length: 'long' is not a int"):
        job_of({"reads": ["x"], "min_length": "long"})
    with pytest.raises(ValueError, match=r"\[metagene\] seq_len = 1 is out of bounds"):
        job_of({"reads": ["x"], "seq_len": 1})
    job = job_of({"reads": ["x"], "seq_len": 64, "on_bad": "skip"}, {"reads": ("y",), "tokenizer": "tok"})
    assert (job.reads, job.tokenizer_dir, job.seq_len, job.read_options().on_bad) == (("y",), Path("tok"), 64, "skip")
    assert job.data_spec(Path("/h/s")) == "metagene:store=/h/s,seq_len=64"
    with pytest.raises(ValueError, match="cannot be named in a data spec"):
        job.data_spec(Path("/h,x/s"))
