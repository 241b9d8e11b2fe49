"""METAGENE-1 data pipeline: parsing against Biopython, the tokenizer, and whether the pipeline
keeps up with training.

1. Parsing: the same gzipped FASTQ (generated: 150 bp reads, Phred+33) through ours
   (``node.metagene.reads.iter_reads``: dnaio plus our checks: line-length guard, ACGTN letters,
   format sniffing) against Biopython 1.88's ``SeqIO.parse(..., "fastq")`` (the peer) and, for
   reference, pyfastx 2.3.1's ``Fastx`` iterator. Reads per second of CPU time of this process,
   best of ``--repeats`` (the CPU clock barely moves when other jobs share the machine).
2. Tokenizer: BPE (vocabulary 1024) trained on reads; bp per token, median token length, and
   encode throughput (``tokenize_reads``, the Rust batch path).
3. Pipeline vs training: gzipped FASTQ -> filter -> tokens -> packed batches (``round_batches``)
   in tokens per second, against the tokens per second that ``train_step`` consumes on the
   ``small`` preset (one torch thread, 512-token rows): the pipeline must never starve training.

    .venv/bin/python bench/metagene.py [--quick]

The last line is ``metagene: ours=<reads/s> peer=<reads/s> ratio=<x> target=5 ok|short``
(parsing, ours over Biopython SeqIO).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = 5.0


def write_fastq(path: Path, reads: int, length: int = 150, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    bases = np.frombuffer(b"ACGT", dtype=np.uint8)[rng.integers(0, 4, size=(reads, length))]
    quals = (rng.integers(20, 41, size=(reads, length)) + 33).astype(np.uint8)
    with gzip.open(path, "wb", compresslevel=1) as out:
        for i in range(reads):
            out.write(b"@r%d\n%s\n+\n%s\n" % (i, bases[i].tobytes(), quals[i].tobytes()))


def cpu_rate(fn: Callable[[], int], repeats: int) -> float:
    """Best items per CPU second over ``repeats`` runs."""
    best = 0.0
    for _ in range(repeats):
        started = time.process_time()
        n = fn()
        best = max(best, n / max(time.process_time() - started, 1e-9))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30k reads, one repeat, tokenizer on 5k reads (under a minute)")
    parser.add_argument("--reads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    n_reads = args.reads or (30_000 if args.quick else 400_000)
    tokenizer_reads = 5_000 if args.quick else 20_000
    repeats = args.repeats or (1 if args.quick else 3)

    import torch
    from Bio import SeqIO
    import pyfastx

    from intellect_node.node.metagene.dataset import tokenize_reads
    from intellect_node.node.metagene.feed import round_batches
    from intellect_node.node.metagene.filtering import FilterConfig, filter_reads
    from intellect_node.node.metagene.presets import PRESETS, build_model
    from intellect_node.node.metagene.pretrain import train_step
    from intellect_node.node.metagene.reads import iter_reads
    from intellect_node.node.metagene.recipe import Recipe, make_optimizer
    from intellect_node.node.metagene.tokenizer import token_stats, train_tokenizer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        fastq = Path(tmp) / "reads.fastq.gz"
        write_fastq(fastq, n_reads)
        print(f"{n_reads} reads x 150 bp, gzipped FASTQ ({fastq.stat().st_size / 1e6:.1f} MB); CPU-time rates, best of {repeats}")

        def ours() -> int:
            return sum(1 for _ in iter_reads(fastq))

        def biopython() -> int:
            with gzip.open(fastq, "rt") as handle:
                return sum(1 for _ in SeqIO.parse(handle, "fastq"))

        def pyfastx_iter() -> int:
            return sum(1 for _ in pyfastx.Fastx(str(fastq)))

        rates = {name: cpu_rate(fn, repeats) for name, fn in
                 (("ours (dnaio + checks)", ours), ("Biopython SeqIO", biopython), ("pyfastx Fastx", pyfastx_iter))}
        for name, rate in rates.items():
            print(f"  parse {name:24} {rate:>12,.0f} reads/s")

        sequences = [r.sequence for r in iter_reads(fastq)]
        started = time.perf_counter()
        tok = train_tokenizer(sequences[:tokenizer_reads])
        train_s = time.perf_counter() - started
        stats = token_stats(tok, sequences[:tokenizer_reads])
        print(f"  tokenizer: trained on {tokenizer_reads:,} reads in {train_s:.1f} s; {stats.bp_per_token:.2f} bp/token, "
              f"median token {stats.median_token_bp} bp (random reads: real genomes compress better)")
        store_box: list = []

        def encode() -> int:
            store_box[:] = [tokenize_reads(iter_reads(fastq), tok)]
            return int(store_box[0].offsets[-1])

        encode_rate = cpu_rate(encode, 1)
        print(f"  parse + encode: {encode_rate:,.0f} tokens/s")
        store = store_box[0]

        def pipeline() -> int:
            kept = filter_reads(iter_reads(fastq), FilterConfig())
            fresh = tokenize_reads(kept, tok)
            tokens = 0
            for batch in round_batches(fresh, 0, 0, 0, 1, len(fresh), 64):
                tokens += batch.target_tokens
            return tokens

        pipe_rate = cpu_rate(pipeline, 1)
        model = build_model(PRESETS["small"])
        recipe = Recipe(warmup_steps=1, total_steps=100)
        optimizer = make_optimizer(model, recipe)
        batches = round_batches(store, 0, 0, 0, 1, 64 * (2 if args.quick else 4), 64, seq_len=512)
        train_step(model, optimizer, batches[0], recipe, 0)  # warm-up

        def consume() -> int:
            return sum(train_step(model, optimizer, b, recipe, 1)["tokens"] for b in batches[1:])

        train_rate = cpu_rate(consume, 1)
        print(f"  pipeline gz FASTQ -> filter -> tokens -> packed batches: {pipe_rate:,.0f} tokens/s; "
              f"training 'small' (3.7 M params, 1 thread) consumes {train_rate:,.0f} tokens/s: "
              f"{pipe_rate / train_rate:.0f}x headroom")

    ours_rate, peer_rate = rates["ours (dnaio + checks)"], rates["Biopython SeqIO"]
    ratio = ours_rate / peer_rate
    verdict = "ok" if ratio >= TARGET and pipe_rate > train_rate else "short"
    print(f"metagene: ours={ours_rate:.0f} peer={peer_rate:.0f} ratio={ratio:.2f}x target={TARGET:g} {verdict}")


if __name__ == "__main__":
    main()
