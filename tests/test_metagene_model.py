"""Tokenizer, sequences and packing mask, sharding, presets, loss/recipe, pretraining, evaluation."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from intellect_node.node.diloco.permutation import permute
from intellect_node.node.metagene.dataset import TokenizedReads, holdout_split, tokenize_reads
from intellect_node.node.metagene.evaluate import evaluate, kmer_features
from intellect_node.node.metagene.feed import round_batches
from intellect_node.node.metagene.loss import lm_loss
from intellect_node.node.metagene.presets import PRESETS, SPECIAL, build_model, get_preset
from intellect_node.node.metagene.pretrain import pretrain, save_pretrained
from intellect_node.node.metagene.probe import matthews_corrcoef
from intellect_node.node.metagene.reads import iter_reads
from intellect_node.node.metagene.recipe import MetageneRecipe
from intellect_node.node.metagene.sequences import IGNORE, build_rows, plan_rows
from intellect_node.node.metagene.sharding import shard_indices
from intellect_node.node.metagene.synthetic import write_metagenome
from intellect_node.node.metagene.tokenizer import (
    EOS_ID,
    NUCLEOTIDES,
    SPECIALS,
    load_tokenizer,
    save_tokenizer,
    token_stats,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def metagenome(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("meta")
    write_metagenome(out, seed=3, organisms=4, reads_per_organism=300, genome_length=12_000)
    return out


@pytest.fixture(scope="module")
def tokenizer(metagenome: Path, tmp_path_factory: pytest.TempPathFactory):
    tok = train_tokenizer(r.sequence for r in iter_reads(metagenome))
    return load_tokenizer(save_tokenizer(tok, tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def store(metagenome: Path, tokenizer) -> TokenizedReads:
    return tokenize_reads(iter_reads(metagenome), tokenizer)


# ---- tokenizer


def test_tokenizer_layout_round_trip_and_compression(tokenizer, metagenome: Path) -> None:
    assert len(tokenizer) == 1024
    assert tokenizer.convert_ids_to_tokens(list(range(11))) == list(SPECIALS + NUCLEOTIDES)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.mask_token_id) == (0, 4, 5)
    seqs = [r.sequence for r in iter_reads(metagenome)][:200]
    for seq in seqs[:50] + ["NNNNACGTN", "A"]:
        ids = tokenizer(seq, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == seq
    stats = token_stats(tokenizer, seqs)
    assert stats.bp_per_token > 3.0  # merges learned: far above 1 bp per token
    assert stats.base_pairs == 200 * 150


def test_foreign_tokenizer_refused(tmp_path: Path, tokenizer) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    save_tokenizer(tokenizer, tmp_path)
    tokenizer_json = tmp_path / "tokenizer.json"
    tokenizer_json.write_text(tokenizer_json.read_text().replace('"[PAD]"', '"[PAX]"'))
    with pytest.raises(ValueError, match="not a METAGENE tokenizer"):
        load_tokenizer(tmp_path)


# ---- sequences, packing, the document mask


def test_rows_labels_positions() -> None:
    reads = [np.array([11, 12, 13]), np.array([14, 15]), np.array([16, 17, 18, 19])]
    batch = build_rows(reads, seq_len=6)
    assert batch.input_ids.tolist() == [[11, 12, 13, 14, 15, 0], [16, 17, 18, 19, 0, 0]]
    assert batch.labels.tolist() == [[12, 13, EOS_ID, 15, EOS_ID, IGNORE], [17, 18, 19, EOS_ID, IGNORE, IGNORE]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    assert plan_rows([3, 2, 4], 6, pack=False) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="within 1..6"):
        plan_rows([7], 6)


def test_reads_truncated_to_512_tokens(tokenizer) -> None:
    from intellect_node.node.metagene.reads import Read
    rng = random.Random(0)
    long_read = "".join(rng.choice("ACGT") for _ in range(20_000))
    store = tokenize_reads([Read("r", long_read, None, "x"), Read("s", "ACGT", None, "x")], tokenizer)
    assert len(store.read(0)) == 512 and len(store.read(1)) >= 1
    batch = build_rows([store.read(0)], seq_len=512)
    assert batch.labels[0, -1].item() == EOS_ID  # 512 tokens plus EOS fill a context of 512


def test_mask_never_crosses_reads() -> None:
    batch = build_rows([np.array([11, 12]), np.array([13, 14, 15])], seq_len=6)
    allowed = batch.attention_mask()[0, 0] == 0
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding sees only itself
    ], dtype=torch.bool)
    assert torch.equal(allowed, expected)


def test_packed_logits_equal_reads_run_alone(store: TokenizedReads) -> None:
    torch.manual_seed(0)
    model = build_model(PRESETS["tiny"], seed=1).eval()
    reads = [store.read(i)[:40] for i in (0, 5, 9, 17)]
    packed = build_rows(reads, seq_len=160)
    assert packed.input_ids.shape[0] == 1  # all four in one row
    with torch.no_grad():
        together = model(**packed.model_inputs()).logits[0]
        at = 0
        for read in reads:
            alone = model(input_ids=torch.as_tensor(read.astype(np.int64))[None]).logits[0]
            assert torch.allclose(together[at:at + len(read)], alone, atol=1e-5), "a packed read saw its neighbours"
            at += len(read)
        # and the mask matters: without it the second read's logits differ
        leaky = model(input_ids=packed.input_ids).logits[0]
        assert not torch.allclose(leaky[len(reads[0]):len(reads[0]) + len(reads[1])],
                                  together[len(reads[0]):len(reads[0]) + len(reads[1])], atol=1e-3)


# ---- sharding


def test_permutation_is_a_bijection_for_awkward_sizes() -> None:
    for n in (1, 2, 3, 7, 64, 65, 1000):
        assert sorted(permute(5, 2, n, i) for i in range(n)) == list(range(n))
    assert [permute(5, 0, 1000, i) for i in range(20)] != [permute(5, 1, 1000, i) for i in range(20)]


def test_shards_disjoint_per_round_and_cover_each_epoch() -> None:
    n, peers, per = 103, 4, 5  # 20 reads a round, 5 rounds an epoch, 3 reads left over
    for round_ in range(10):
        drawn = [shard_indices(11, round_, p, peers, per, n) for p in range(peers)]
        flat = [i for d in drawn for i in d]
        assert len(set(flat)) == len(flat) == peers * per
    epoch0 = [i for r in range(5) for p in range(peers) for i in shard_indices(11, r, p, peers, per, n)]
    assert len(set(epoch0)) == 100  # no read repeats within an epoch
    assert shard_indices(11, 3, 2, peers, per, n) == shard_indices(11, 3, 2, peers, per, n)
    assert shard_indices(11, 3, 2, peers, per, n) != shard_indices(12, 3, 2, peers, per, n)
    with pytest.raises(ValueError, match="needs 24 reads"):
        shard_indices(0, 0, 0, 4, 6, 20)


def test_shard_test_vectors_match_spec() -> None:
    # specs/metagene.md lists these: any implementation must produce them bit for bit
    assert shard_indices(0, 0, 0, 4, 4, 100) == SPEC_VECTORS[0]
    assert shard_indices(0, 0, 1, 4, 4, 100) == SPEC_VECTORS[1]
    assert shard_indices(1, 0, 0, 4, 4, 100) == SPEC_VECTORS[2]
    assert shard_indices(0, 6, 0, 4, 4, 100) == SPEC_VECTORS[3]
    assert [permute(7, 3, 10**9, i) for i in range(3)] == SPEC_VECTORS[4]


SPEC_VECTORS = [[33, 13, 93, 44], [23, 71, 14, 35], [79, 61, 49, 74], [94, 38, 87, 85],
                [294621534, 305854761, 214787378]]


def test_round_batches_follow_the_assignment(store: TokenizedReads) -> None:
    batches = round_batches(store, seed=2, round_=1, peer=3, peers=4, reads_per_peer=12, reads_per_batch=5, seq_len=256)
    assert len(batches) == 3
    indices = shard_indices(2, 1, 3, 4, 12, len(store))
    first = batches[0]
    starts = (first.position_ids == 0) & (first.document_ids >= 0)
    got = [first.input_ids[starts][k].item() for k in range(int(starts.sum()))]
    assert got == [int(store.read(i)[0]) for i in indices[:5]]


def test_holdout_split_by_content(store: TokenizedReads) -> None:
    train, held = holdout_split(store, 0.2, seed=0)
    assert len(train) + len(held) == len(store)
    assert 0.1 < len(held) / len(store) < 0.3
    train_reads = {train.read(i).tobytes() for i in range(len(train))}
    assert not any(held.read(i).tobytes() in train_reads for i in range(len(held)))


def test_store_save_load_round_trip(store: TokenizedReads, tmp_path: Path) -> None:
    loaded = TokenizedReads.load(store.save(tmp_path / "s"))
    assert len(loaded) == len(store) and loaded.source_names == store.source_names
    assert np.array_equal(loaded.read(7), store.read(7)) and loaded.source(7) == store.source(7)
    np.save(tmp_path / "s" / "offsets.npy", store.offsets[:-1])
    with pytest.raises(ValueError, match="inconsistent"):
        TokenizedReads.load(tmp_path / "s")


# ---- model, loss, recipe


def test_presets_reach_metagene_7b_without_building_it() -> None:
    seven = get_preset("metagene-7b")
    cfg = seven.config(SPECIAL)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.max_position_embeddings, cfg.vocab_size) == (32, 4096, 32, 11008, 512, 1024)
    assert 6.4e9 < seven.parameter_count() < 6.6e9
    for name in ("tiny", "small"):  # the formula counts what is built
        model = build_model(PRESETS[name])
        assert sum(p.numel() for p in model.parameters()) == PRESETS[name].parameter_count()
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("huge")


def test_z_loss_term() -> None:
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    labels = torch.tensor([[0, IGNORE]])
    parts = lm_loss(logits, labels, z_loss_weight=0.5)
    log_z = math.log(math.exp(2) + 2)
    assert parts.cross_entropy.item() == pytest.approx(log_z - 2.0)
    assert parts.z_loss.item() == pytest.approx(log_z**2)
    assert parts.total.item() == pytest.approx(log_z - 2.0 + 0.5 * log_z**2)
    assert parts.tokens == 1


def test_recipe_schedule() -> None:
    recipe = MetageneRecipe(warmup_steps=10, total_steps=110)
    assert recipe.lr_at(0) == pytest.approx(6e-5)
    assert recipe.lr_at(9) == pytest.approx(6e-4)
    assert recipe.lr_at(109) == pytest.approx(4e-5)
    assert 4e-5 < recipe.lr_at(60) < 6e-4
    assert (recipe.betas, recipe.weight_decay, recipe.clip, recipe.z_loss) == ((0.9, 0.95), 0.1, 1.0, 2e-4)


# ---- pretraining and evaluation


def test_tiny_pretraining_lowers_loss_and_saves_hf_layout(store: TokenizedReads, tokenizer, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(PRESETS["tiny"], seed=0)
    recipe = MetageneRecipe(lr=3e-3, min_lr=3e-4, warmup_steps=4, total_steps=36)
    history = pretrain(model, store, recipe, steps=36, reads_per_batch=24, seq_len=256)
    first, last = np.mean([h["ce"] for h in history[:4]]), np.mean([h["ce"] for h in history[-4:]])
    assert last < first - 0.4, (first, last)
    out = save_pretrained(model, tokenizer, tmp_path / "m", PRESETS["tiny"], recipe, {"steps": 36})
    from transformers import AutoModelForCausalLM
    again = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.as_tensor(store.read(0).astype(np.int64))[None]
    with torch.no_grad():
        assert torch.allclose(again(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=1e-5)
    assert load_tokenizer(out).eos_token_id == EOS_ID


def test_evaluation_on_generated_organisms(metagenome: Path, tokenizer) -> None:
    reads = list(iter_reads(metagenome))[::3]  # 100 per organism
    model = build_model(PRESETS["tiny"], seed=0)
    result = evaluate(model, tokenizer, reads)
    assert result["organisms"] == ["org0", "org1", "org2", "org3"]
    assert all(800 < p < 1300 for p in result["perplexity"].values())  # untrained: about the vocabulary size
    assert result["kmer_mcc"] > 0.6  # composition differs by construction
    assert result["probe_mcc"] > 0.1  # beats chance (0) even on random features of the tokens


def test_mcc_and_kmers() -> None:
    truth = torch.tensor([0, 0, 1, 1, 2, 2])
    assert matthews_corrcoef(truth, truth, 3) == pytest.approx(1.0)
    assert matthews_corrcoef(truth, torch.zeros(6, dtype=torch.long), 3) == 0.0
    assert matthews_corrcoef(truth, torch.tensor([0, 1, 1, 2, 2, 0]), 3) == pytest.approx(0.25)
    features = kmer_features(["AAAAA", "ACGTN"], k=2)
    assert features[0, 0] == 1.0 and features[1].sum() == pytest.approx(1.0)
