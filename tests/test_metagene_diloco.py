"""The METAGENE read store as DiLoCo data (specs/diloco.md section 3, specs/metagene.md): a peer's
reads are a function of (seed, round, peer id), peers of one round draw disjoint reads unless they
hash to the same block, the METAGENE-1 loss trains, and a bad store is a clear error."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from intellect_node.cli.main import app
from intellect_node.crypto.identity import Identity
from intellect_node.node.config.base import build
from intellect_node.node.diloco.data import peer_key
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.metagene.dataset import tokenize_reads
from intellect_node.node.metagene.presets import PRESETS, build_model
from intellect_node.node.metagene.reads import iter_reads
from intellect_node.node.metagene.sharding import peer_block, peer_reads
from intellect_node.node.metagene.synthetic import write_metagenome
from intellect_node.node.metagene.tokenizer import save_tokenizer, train_tokenizer
from intellect_node.node.metagene.workload import MetageneData


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mg")
    write_metagenome(root / "reads", seed=1, organisms=2, reads_per_organism=120, genome_length=3000)
    reads = list(iter_reads(root / "reads"))
    tok = train_tokenizer([r.sequence for r in reads], 128)
    tokenize_reads(reads, tok).save(root / "store")
    save_tokenizer(tok, root / "store" / "tokenizer")  # as `metagene store` does: the ids' meaning travels with them
    return root / "store"


def keys(*names: str) -> list[int]:
    return [peer_key(Identity.from_seed(n.encode() * 32).peer_id) for n in names]


def test_peer_reads_vectors_and_elastic_disjointness() -> None:
    # the spec's test vectors (specs/metagene.md, "Reads of an elastic DiLoCo peer")
    assert peer_reads(0, 0, 1, 4, 100) == [33, 13, 93, 44]
    assert peer_reads(0, 0, 2, 4, 100) == [61, 84, 18, 64]
    assert peer_reads(0, 5, 1, 4, 100) == [69, 0, 79, 48]
    assert peer_block(7, 3, 2**64 - 1, 1000, 10**9) == 539999
    assert peer_reads(0, 0, 1, 4, 100, first=2, count=2) == [93, 44]
    # a round's reads of one peer never repeat; two peers share reads only when their blocks coincide
    n, k = 10_000, 40
    for round_ in range(5):
        blocks = {}
        for key in keys(*"abcdefgh"):
            got = peer_reads(3, round_, key, k, n)
            assert len(set(got)) == k
            blocks.setdefault(peer_block(3, round_, key, k, n), []).append(set(got))
        for same in blocks.values():
            assert all(s == same[0] for s in same)
        distinct = [s[0] for s in blocks.values()]
        assert sum(map(len, distinct)) == len(set().union(*distinct))
    with pytest.raises(ValueError, match="needs 101 reads"):
        peer_reads(0, 0, 1, 101, 100)


def test_metagene_data_is_deterministic_per_seed_round_peer(store_dir) -> None:
    s = DilocoSettings(data=f"metagene:store={store_dir},seq_len=64", model="tiny", H=3, batch=4, seed=5)
    data = s.open_data()
    assert isinstance(data, MetageneData) and data.seq_len == 64 and data.reads_per_round == 12
    a, b = keys("a", "b")
    first = data.draw(2, a, 1)
    assert torch.equal(first.input_ids, s.open_data().draw(2, a, 1).input_ids)
    assert not torch.equal(first.input_ids, data.draw(2, b, 1).input_ids)
    assert not torch.equal(first.input_ids, data.draw(3, a, 1).input_ids)
    assert first.target_tokens == sum(len(data.store.read(i)[:64])
                                      for i in peer_reads(5, 2, a, 12, len(data.store), 4, 4))
    model = build_model(PRESETS["tiny"], seed=0)
    loss, tokens = data.loss(model, first)
    # about ln(vocab 1024) = 6.93, plus a small z-loss
    assert tokens == first.target_tokens and 6.5 < float(loss.detach()) < 7.5
    loss.backward()


def test_the_diloco_section_checks_metagene_data_and_its_model() -> None:
    """The workload registers its spec and presets with diloco's settings (node/metagene/workload.py)."""
    for bad, message in (({"data": "metagene:seq_len=64"}, "needs store=DIR"),
                         ({"data": "metagene:store=/x", "model": "diloco-tiny"}, "vocabulary fits"),
                         ({"data": "file:/etc/passwd"}, "expected 'generated:...' or 'metagene:store=DIR")):
        with pytest.raises(ValueError, match=message):
            build(DilocoSettings, bad, "cfg.toml", "[diloco]")


def test_bad_store_is_a_clear_error(tmp_path, store_dir) -> None:
    with pytest.raises(ValueError, match="no reads.json there"):
        DilocoSettings(data=f"metagene:store={tmp_path / 'nope'}", model="tiny").open_data()
    with pytest.raises(ValueError, match="a round needs 400 reads per peer"):
        DilocoSettings(data=f"metagene:store={store_dir}", model="tiny", H=50).open_data()
    (tmp_path / "reads.json").write_text("{}")
    with pytest.raises(ValueError, match="unreadable"):
        DilocoSettings(data=f"metagene:store={tmp_path}", model="tiny").open_data()
    result = CliRunner().invoke(app, ["join", "--role", "diloco", "--home", str(tmp_path / "home"), "--new-swarm",
                                      "--model", "tiny", "--data", f"metagene:store={tmp_path / 'nope'}"])
    assert result.exit_code == 2 and "no reads.json" in result.output


def test_metagene_store_command_writes_a_store_diloco_opens(tmp_path) -> None:
    write_metagenome(tmp_path / "reads", seed=2, organisms=2, reads_per_organism=60, genome_length=2000)
    runner = CliRunner()
    assert runner.invoke(app, ["metagene", "tokenizer", "--reads", str(tmp_path / "reads"),
                               "--out", str(tmp_path / "tok"), "--vocab", "64"]).exit_code == 0
    result = runner.invoke(app, ["metagene", "store", "--reads", str(tmp_path / "reads"),
                                 "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["reads"] == 120 and report["sources"] == ["org0", "org1"]
    assert (tmp_path / "store" / "tokenizer" / "tokenizer.json").is_file()
    data = DilocoSettings(data=f"metagene:store={tmp_path / 'store'}", model="tiny", H=2, batch=3).open_data()
    assert len(data.store) == 120
