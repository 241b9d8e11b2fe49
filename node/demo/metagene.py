"""``intellect-node demo --workload metagene``: DiLoCo peers pretrain a genomic model on a metagenome.

Offline and self-contained: a metagenome (node/metagene/synthetic.py: reads with Illumina-like
errors cut from generated genomes of distinct composition, or with ``genomes = "pyrodigal"`` from
four real ones an installed package ships, node/metagene/genomes.py) is written as FASTQ, split into training reads and
held-out evaluation reads cut from the same genomes; the BPE tokenizer is trained on the training
reads and the tokenized store is built from them. Then the DiLoCo demo (node/demo/diloco.py, its
loop, watch and death report unchanged) runs N real ``join --role diloco`` nodes with
``data = "metagene:store=..."``. Held-out perplexity and the pathogen-detection probe (MCC of a
linear probe on mean-pooled embeddings, against the 4-mer baseline) are measured on θ0 (every
peer's start) and on the first peer's final global state, and added to ``summary.json``.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from intellect_node.node.demo.diloco import DilocoDemoOptions, run_diloco_demo


@dataclass(frozen=True)
class MetageneDemoOptions:
    peers: int = 4
    rounds: int = 10
    H: int = 20
    batch: int = 8  # reads per inner step
    minutes: float = 5.0
    out: Path | None = None
    preset: str = "tiny"
    organisms: int = 4
    reads_per_organism: int = 2000
    eval_reads_per_organism: int = 100
    genome_length: int = 20_000
    genomes: str = "generated"  # or "pyrodigal": real genomes from that installed package (node/metagene/genomes.py)
    held_out: str = "reads"  # or "region": evaluation reads from a tenth of each genome no training read covers
    vocab: int = 1024
    seq_len: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if self.held_out not in HELD_OUT_SPLITS:
            raise ValueError(f"held_out = {self.held_out!r}: choose one of {', '.join(HELD_OUT_SPLITS)}")


HELD_OUT_SPLITS = ("reads", "region")
HELD_OUT_FRACTION = 0.1  # of each genome, its end, with ``held_out = "region"``


def split_genomes(organisms: list[Any], held_out: str, read_length: int = 150) -> tuple[list[Any], list[Any]]:
    """The genomes training reads and held-out reads are cut from.

    ``reads``: both from the whole genome (METAGENE-1's held-out reads: other reads of the same
    organisms). On a small genome the training reads then cover every base many times, so held-out
    perplexity rewards remembering the genome (bench/HISTORY.md, 2026-11-27: the arm with more
    sequential steps wins on a 20 kbp genome only). ``region``: the last ``HELD_OUT_FRACTION`` of each
    genome is held out, no training read overlaps it, so the figure measures what generalises."""
    from intellect_node.node.metagene.synthetic import Organism

    if held_out == "reads":
        return organisms, organisms
    train, held = [], []
    for organism in organisms:
        cut = int(len(organism.genome) * (1 - HELD_OUT_FRACTION))
        if min(cut, len(organism.genome) - cut) <= read_length:
            raise ValueError(f"{organism.name}: {len(organism.genome)} bp is too short to hold out a region of it")
        train.append(Organism(organism.name, organism.genome[:cut]))
        held.append(Organism(organism.name, organism.genome[cut:]))
    return train, held


def prepare_data(options: MetageneDemoOptions, root: Path) -> tuple[Path, Any, list[Any]]:
    """Training FASTQs, the tokenizer and the store under ``root``; returns (store, tokenizer, eval reads)."""
    from intellect_node.node.metagene.build import TOKENIZER_DIR, ReadOptions, build_store, build_tokenizer
    from intellect_node.node.metagene.filtering import filter_reads
    from intellect_node.node.metagene.genomes import organisms_from
    from intellect_node.node.metagene.reads import iter_reads
    from intellect_node.node.metagene.synthetic import cut_reads, write_fastq, write_metagenome

    for name in ("reads", "eval", "store"):
        shutil.rmtree(root / name, ignore_errors=True)
    organisms = organisms_from(options.genomes, options.seed, options.organisms, options.genome_length)
    training, held_out = split_genomes(organisms, options.held_out)
    write_metagenome(root / "reads", options.seed, reads_per_organism=options.reads_per_organism, genomes=training)
    rng = random.Random(options.seed + 1_000_003)  # the held-out reads' own draws
    for organism in held_out:
        write_fastq(root / "eval" / f"{organism.name}.fastq.gz",
                    cut_reads(organism, rng, options.eval_reads_per_organism))
    reads, filtering = [str(root / "reads")], ReadOptions()
    tokenizer, _ = build_tokenizer(reads, filtering, options.vocab, len(organisms) * options.reads_per_organism,
                                   root / "store" / TOKENIZER_DIR)
    build_store(reads, tokenizer, filtering, root / "store")
    return root / "store", tokenizer, list(filter_reads(iter_reads(root / "eval")))


def final_model(options: MetageneDemoOptions, checkpoint: Path) -> tuple[Any, int, str]:
    """The model at the global state a peer checkpointed: (model, round, state hash)."""
    import torch

    from intellect_node.node.diloco.checkpoint import load_checkpoint
    from intellect_node.node.diloco.layout import Layout
    from intellect_node.node.diloco.state_hash import state_hash
    from intellect_node.node.metagene.presets import build_model, get_preset

    model = build_model(get_preset(options.preset), options.seed)
    named = dict(model.named_parameters())
    layout = Layout.of(named)
    state = load_checkpoint(checkpoint, layout).state
    with torch.no_grad():
        for name, view in layout.views(state.params).items():
            named[name].copy_(view)
    return model, state.round, state_hash(state).hex()


def eval_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The evaluation figures summary.json and the bench report, rounded."""
    return {"perplexity": round(result["perplexity_all"], 4), "bits_per_bp": round(result["bits_per_bp"], 4),
            "probe_mcc": round(result["probe_mcc"], 4), "kmer_mcc": round(result["kmer_mcc"], 4),
            "perplexity_per_organism": {k: round(v, 4) for k, v in result["perplexity"].items()}}


def run_metagene_demo(options: MetageneDemoOptions, log: Callable[[str], None]) -> dict[str, Any]:
    from intellect_node.node.metagene.evaluate import evaluate
    from intellect_node.node.metagene.presets import build_model, get_preset

    root = options.out or Path(tempfile.mkdtemp(prefix="intellect-metagene-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    log(f"writing a {options.genomes} metagenome, training the tokenizer, building the store in {root}")
    store, tokenizer, eval_reads = prepare_data(options, root)
    seq_len = min(options.seq_len, get_preset(options.preset).context)
    before = eval_metrics(evaluate(build_model(get_preset(options.preset), options.seed), tokenizer, eval_reads,
                                   seq_len))
    log(f"before training: held-out perplexity {before['perplexity']}, probe MCC {before['probe_mcc']} "
        f"(4-mer baseline {before['kmer_mcc']})")
    diloco = DilocoDemoOptions(peers=options.peers, rounds=options.rounds, H=options.H, minutes=options.minutes,
                               out=root, batch=options.batch, model=options.preset,
                               data=f"metagene:store={store.resolve()},seq_len={seq_len}",
                               title="intellect-node demo: METAGENE pretraining through DiLoCo")
    summary = run_diloco_demo(diloco, log)
    checkpoint = root / "nodes" / "peer0" / "diloco" / "state.safetensors"
    summary |= {"workload": "metagene", "preset": options.preset,
                "train_reads": json.loads((store / "reads.json").read_text())["reads"], "eval_reads": len(eval_reads),
                "before": before}
    if checkpoint.exists():
        model, round_, digest = final_model(options, checkpoint)
        after = eval_metrics(evaluate(model, tokenizer, eval_reads, seq_len))
        summary |= {"after": after, "evaluated": {"node": "peer0", "round": round_, "state_hash": digest}}
        log(f"after {round_} rounds: held-out perplexity {after['perplexity']}, probe MCC {after['probe_mcc']} "
            f"(4-mer baseline {after['kmer_mcc']})")
    summary |= {"probe_mcc_before": before["probe_mcc"], "probe_mcc_after": summary.get("after", {}).get("probe_mcc"),
                "kmer_mcc": before["kmer_mcc"]}
    out = summary.pop("out")
    (root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    summary["out"] = out
    return summary
