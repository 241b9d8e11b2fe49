"""`intellect-node metagene`: synth -> tokenizer -> pretrain -> eval on a generated metagenome,
and hostile input reported as an error naming the file, with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intellect_node.cli.main import app


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["metagene", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.slow
def test_commands_end_to_end(tmp_path: Path) -> None:
    meta, tok, model = tmp_path / "meta", tmp_path / "tok", tmp_path / "model"
    assert _run("synth", "--out", str(meta), "--organisms", "3", "--reads", "60")[0] == 0
    code, out, _ = _run("tokenizer", "--reads", str(meta / "*.fastq.gz"), "--out", str(tok), "--vocab", "256")
    assert code == 0, out
    report = json.loads(out)
    assert report["reads"] == 180 and report["bp_per_token"] > 2
    assert (tok / "tokenizer.json").is_file()
    code, out, err = _run("pretrain", "--reads", str(meta), "--tokenizer", str(tok), "--out", str(model),
                          "--steps", "3", "--reads-per-batch", "8", "--seq-len", "128", "--threads", "1")
    assert code == 0, err
    assert (model / "model.safetensors").is_file() and len((model / "metrics.jsonl").read_text().splitlines()) == 3
    code, out, err = _run("eval", "--model", str(model), "--reads", str(meta), "--per-organism", "20")
    assert code == 0, err
    result = json.loads(out)
    assert set(result["perplexity"]) == {"org0", "org1", "org2"} and -1 <= result["probe_mcc"] <= 1


def test_bad_reads_exit_2_naming_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.fq"
    bad.write_text("@a\nACGT\n+\nII\n")
    code, _, err = _run("tokenizer", "--reads", str(bad), "--out", str(tmp_path / "t"))
    assert code == 2 and "bad.fq: line 4: Length of sequence and qualities differ" in err
    code, _, err = _run("eval", "--model", str(tmp_path), "--reads", str(bad))
    assert code == 2 and "no tokenizer.json" in err


@pytest.mark.parametrize("content,match", [
    (b"\xb6" * 64, "not a loadable tokenizer (UnicodeDecodeError"),
    (b"[" * 10_000 + b"]" * 10_000, "not a loadable tokenizer (RecursionError"),
])
def test_a_hostile_tokenizer_exits_2_naming_file(tmp_path: Path, content: bytes, match: str) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_bytes(content)
    (tmp_path / "r.fq").write_text("@a\n" + "ACGT" * 10 + "\n+\n" + "I" * 40 + "\n")
    code, _, err = _run("store", "--reads", str(tmp_path / "r.fq"), "--tokenizer", str(tmp_path / "tok"),
                        "--out", str(tmp_path / "store"))
    assert code == 2 and f"{tmp_path / 'tok' / 'tokenizer.json'}: {match}" in " ".join(err.split()), err
