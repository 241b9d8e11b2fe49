"""``intellect-node metagene ...``: the genomic workload's tokenizer, local pretraining, evaluation
and a generated metagenome to try them on. Thin: parses flags, calls ``node.metagene``, reports.

Heavy imports (torch, transformers) happen inside each command, so ``intellect-node --help``
stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

metagene_app = typer.Typer(no_args_is_help=True, add_completion=False,
                           help="METAGENE-1 workload: metagenomic reads in, a genomic foundation model out.")
err = Console(stderr=True)

ReadsOpt = Annotated[list[str], typer.Option(
    "--reads", help="FASTQ/FASTA file (plain or .gz), directory or glob; repeatable")]
MinQOpt = Annotated[float, typer.Option(
    "--min-quality", help="Drop FASTQ reads with a lower mean Phred score (0: off)", min=0, max=93)]
MaxNOpt = Annotated[float, typer.Option("--max-n", help="Drop reads with a larger fraction of N", min=0, max=1)]
MinLenOpt = Annotated[int, typer.Option("--min-length", help="Drop reads shorter than this (bp)", min=1)]
OnBadOpt = Annotated[str, typer.Option(
    "--on-bad", help="A read with letters other than ACGTN and IUPAC codes: 'error' stops, 'skip' counts and skips")]


def _options(min_quality: float, max_n: float, min_length: int, on_bad: str) -> Any:
    """The read filter the flags describe (node/metagene/build.py ``ReadOptions``); ValueError on a bad value."""
    from intellect_node.node.metagene.build import ReadOptions
    from intellect_node.node.metagene.filtering import FilterConfig

    return ReadOptions(FilterConfig(min_length=min_length, max_n_fraction=max_n, min_mean_quality=min_quality),
                       on_bad)  # type: ignore[arg-type]


def _filtered(reads: list[str], min_quality: float, max_n: float, min_length: int, on_bad: str) -> Iterator[Any]:
    """The filtered reads, streamed."""
    from intellect_node.node.metagene.build import filtered_reads

    return filtered_reads(reads, _options(min_quality, max_n, min_length, on_bad))[0]


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"error: {exc}", soft_wrap=True, markup=False)
    return typer.Exit(2)


@metagene_app.command()
def tokenizer(reads: ReadsOpt, out: Annotated[Path, typer.Option(
                  "--out", help="Directory for the HF-layout tokenizer")],
              vocab: Annotated[int, typer.Option(help="Vocabulary size (METAGENE-1: 1024)", min=16, max=65536)] = 1024,
              max_reads: Annotated[int, typer.Option(
                  "--max-reads", help="Train on at most this many reads", min=1)] = 200_000,
              min_quality: MinQOpt = 20.0, max_n: MaxNOpt = 0.1, min_length: MinLenOpt = 32,
              on_bad: OnBadOpt = "error") -> None:
    """Train the BPE tokenizer on reads and report base pairs per token."""
    from intellect_node.node.metagene.build import build_tokenizer

    try:
        _, report = build_tokenizer(reads, _options(min_quality, max_n, min_length, on_bad), vocab, max_reads, out)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    print(json.dumps(report))


@metagene_app.command()
def store(reads: ReadsOpt, tokenizer_dir: Annotated[Path, typer.Option(
              "--tokenizer", help="Directory written by `metagene tokenizer`")],
          out: Annotated[Path, typer.Option(
              "--out", help="Directory for the tokenized read store (DiLoCo: --data metagene:store=DIR)")],
          min_quality: MinQOpt = 20.0, max_n: MaxNOpt = 0.1, min_length: MinLenOpt = 32,
          on_bad: OnBadOpt = "error") -> None:
    """Tokenize filtered reads into the flat store DiLoCo peers draw from (every peer needs the same one)."""
    from intellect_node.node.metagene.build import build_store
    from intellect_node.node.metagene.tokenizer import load_tokenizer

    try:
        report = build_store(reads, load_tokenizer(tokenizer_dir), _options(min_quality, max_n, min_length, on_bad),
                             out)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    print(json.dumps(report))


@metagene_app.command()
def pretrain(reads: ReadsOpt, tokenizer_dir: Annotated[Path, typer.Option(
                 "--tokenizer", help="Directory written by `metagene tokenizer`")],
             out: Annotated[Path, typer.Option("--out", help="Directory for the HF-layout model and metrics.jsonl")],
             preset: Annotated[str, typer.Option(help="tiny, small, base or metagene-7b")] = "tiny",
             steps: Annotated[int, typer.Option(min=1)] = 200,
             reads_per_batch: Annotated[int, typer.Option("--reads-per-batch", min=1)] = 64,
             seq_len: Annotated[int, typer.Option("--seq-len", min=8, max=512)] = 512,
             lr: Annotated[float, typer.Option(min=0)] = 6e-4,
             warmup: Annotated[int | None, typer.Option(help="Warm-up steps [10% of --steps]", min=0)] = None,
             seed: Annotated[int, typer.Option(min=0)] = 0,
             threads: Annotated[int, typer.Option(help="torch threads (0: torch's default)", min=0)] = 0,
             min_quality: MinQOpt = 20.0, max_n: MaxNOpt = 0.1, min_length: MinLenOpt = 32,
          on_bad: OnBadOpt = "error") -> None:
    """Pretrain on one machine with METAGENE-1's recipe (scaled to --steps); 5% of reads held out."""
    import torch

    from intellect_node.node.metagene.dataset import holdout_split, tokenize_reads
    from intellect_node.node.metagene.evaluate import score_reads
    from intellect_node.node.metagene.presets import build_model, get_preset
    from intellect_node.node.metagene.pretrain import pretrain as run_pretrain
    from intellect_node.node.metagene.pretrain import save_pretrained
    from intellect_node.node.metagene.reads import ReadFormatError
    from intellect_node.node.metagene.recipe import MetageneRecipe
    from intellect_node.node.metagene.tokenizer import load_tokenizer

    if threads:
        torch.set_num_threads(threads)
    try:
        tok = load_tokenizer(tokenizer_dir)
        shape = get_preset(preset)
        stream = _filtered(reads, min_quality, max_n, min_length, on_bad)
        train, held = holdout_split(tokenize_reads(stream, tok), 0.05, seed)
        recipe = MetageneRecipe(lr=lr, min_lr=min(lr, 4e-5 * lr / 6e-4), total_steps=steps,
                                warmup_steps=warmup if warmup is not None else steps // 10)
        model = build_model(shape, seed)
    except (ReadFormatError, ValueError, FileNotFoundError) as exc:
        raise _fail(exc) from None
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "w") as log:
        def on_step(m: dict[str, float]) -> None:
            log.write(json.dumps(m) + "\n")
            if m["step"] % 10 == 0 or m["step"] == steps - 1:
                err.print(f"step {m['step']:>5}  loss {m['loss']:.4f}  ce {m['ce']:.4f}  lr {m['lr']:.2e}")
        try:
            run_pretrain(model, train, recipe, steps, reads_per_batch, seq_len, seed, on_step=on_step)
        except ValueError as exc:
            raise _fail(exc) from None
    nll, count, _ = score_reads(model, [held.read(i) for i in range(len(held))], seq_len)
    held_ce = float(nll.sum() / count.sum()) if len(held) else float("nan")
    save_pretrained(model, tok, out, shape, recipe, {"steps": steps, "seed": seed, "train_reads": len(train),
                                                      "held_out_reads": len(held), "held_out_ce": held_ce})
    print(json.dumps({"out": str(out), "train_reads": len(train), "held_out_ce": round(held_ce, 4)}))


@metagene_app.command("eval")
def evaluate(model_dir: Annotated[Path, typer.Option("--model", help="HF-layout model directory (with its tokenizer)")],
             reads: ReadsOpt,
             per_organism: Annotated[int, typer.Option(
                 "--per-organism", help="Use at most this many reads per source file", min=2)] = 500,
             min_quality: MinQOpt = 20.0, max_n: MaxNOpt = 0.1, min_length: MinLenOpt = 32,
          on_bad: OnBadOpt = "error") -> None:
    """Held-out perplexity per organism (one source file = one organism) and the probe's MCC against
    a 4-mer baseline."""
    from transformers import AutoModelForCausalLM

    from intellect_node.node.metagene.evaluate import evaluate as run_evaluate
    from intellect_node.node.metagene.reads import ReadFormatError
    from intellect_node.node.metagene.tokenizer import load_tokenizer
    from intellect_node.node.models.check import check_model_dir

    try:
        tok = load_tokenizer(model_dir)
        check_model_dir(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        stream = _filtered(reads, min_quality, max_n, min_length, on_bad)
        taken: dict[str, int] = {}
        chosen = []
        for read in stream:
            if taken.get(read.source, 0) < per_organism:
                taken[read.source] = taken.get(read.source, 0) + 1
                chosen.append(read)
        result = run_evaluate(model, tok, chosen, min(512, model.config.max_position_embeddings))
    except (ReadFormatError, ValueError, FileNotFoundError, OSError) as exc:
        raise _fail(exc) from None
    print(json.dumps(result))


@metagene_app.command()
def synth(out: Annotated[Path, typer.Option("--out", help="Directory for one .fastq.gz per organism")],
          organisms: Annotated[int, typer.Option(min=2, max=64)] = 4,
          reads: Annotated[int, typer.Option("--reads", help="Reads per organism", min=2)] = 500,
          seed: Annotated[int, typer.Option(min=0)] = 0,
          genomes: Annotated[str, typer.Option(
              help="generated: seeded genomes of distinct composition; genic: seeded genomes of genes "
                   "(shared protein families); pyrodigal: the four real genomes in an installed pyrodigal's "
                   "test data")] = "generated") -> None:
    """Write a metagenome: reads with Illumina-like errors cut from generated or real genomes."""
    from intellect_node.node.metagene.genomes import GenomeSourceError, organisms_from
    from intellect_node.node.metagene.synthetic import write_metagenome

    try:
        chosen = organisms_from(genomes, seed, organisms, 20_000)
    except GenomeSourceError as exc:
        raise _fail(exc) from None
    paths = write_metagenome(out, seed, reads_per_organism=reads, genomes=chosen)
    print(json.dumps({"files": [str(p) for p in paths]}))
