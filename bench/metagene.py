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
4. Learning (``--part learning``): on the demo's generated metagenome, tokenizer and store
   (node/demo/metagene.py ``prepare_data``), 4 DiLoCo peers (``DilocoPeer``, the node's own round:
   inner AdamW, int8 grid, error feedback, outer Nesterov) against one peer that trains on exactly
   the same batches one after another with the inner AdamW (same tokens, 4x the sequential
   steps; and, for scale, one peer on a quarter of them: as many sequential steps as a DiLoCo
   peer). Held-out perplexity and the probe's MCC (node/metagene/evaluate.py), with the 4-mer
   baseline. The group's all-reduce is done in this process (``LoopbackGroup``: the same grid
   arithmetic the averager child applies, without hivemind): learning is measured here,
   transport in bench/diloco.py.

    .venv/bin/python bench/metagene.py [--quick] [--part pipeline|learning|all]

Headlines: ``metagene: ours=<reads/s> peer=<reads/s> ratio=<x> target=5 ok|short`` (parsing, ours
over Biopython SeqIO) and ``metagene_learning: ours=<ppl> peer=<ppl> ratio=<x> target=1.1 ok|short``
(held-out perplexity of 4-peer DiLoCo over the one peer's; ok when within the target). The last
line is the headline of the last part run (``all``: learning).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = 5.0
LEARNING_TARGET = 1.1  # DiLoCo's held-out perplexity at most 10% above the one peer's, same tokens


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


def pipeline(args: argparse.Namespace) -> str:
    """Parts 1-3; returns the headline."""
    n_reads = args.reads or (30_000 if args.quick else 400_000)
    tokenizer_reads = 5_000 if args.quick else 20_000
    repeats = args.repeats or (1 if args.quick else 3)

    import pyfastx
    import torch
    from Bio import SeqIO

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
        print(f"{n_reads} reads x 150 bp, gzipped FASTQ ({fastq.stat().st_size / 1e6:.1f} MB); "
              f"CPU-time rates, best of {repeats}")

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
        print(f"  tokenizer: trained on {tokenizer_reads:,} reads in {train_s:.1f} s; "
              f"{stats.bp_per_token:.2f} bp/token, "
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
    return f"metagene: ours={ours_rate:.0f} peer={peer_rate:.0f} ratio={ratio:.2f}x target={TARGET:g} {verdict}"


class LoopbackGroup:
    """A DiLoCo group of ``size`` members in this process: each member's ``average`` waits for all,
    then every member gets the averager child's exact result (node/diloco/averager_child.py): the
    elementwise-largest exponents, each x quantized on that shared grid, the integer sums."""

    def __init__(self, size: int, levels: int) -> None:
        self.size, self.levels = size, levels
        self.values: dict[str, Any] = {}
        self.hashes: dict[str, bytes] = {}
        self.result: Any = None
        self.barrier = threading.Barrier(size, action=self._reduce)

    def _reduce(self) -> None:
        import torch

        from intellect_node.node.diloco import grid

        xs = [self.values[name] for name in sorted(self.values)]
        shared = grid.shared_exponents([grid.exponents(x, self.levels) for x in xs])
        sums = torch.stack([grid.quantize(x, shared, self.levels) for x in xs]).sum(dim=0).to(torch.int32)
        self.result = (shared, sums, dict(self.hashes))
        self.values.clear()

    def member(self, name: str) -> "LoopbackMember":
        return LoopbackMember(self, name)


class LoopbackMember:
    """What ``DilocoPeer`` asks of its averager client in a round: ``average``."""

    def __init__(self, group: LoopbackGroup, name: str) -> None:
        self.group, self.name = group, name

    def average(self, round_: int, values: Any, state_hash: bytes, timeout_s: float, identity: Any) -> Any:
        from intellect_node.node.diloco.client import Averaged

        self.group.values[self.name], self.group.hashes[self.name] = values, state_hash
        self.group.barrier.wait(timeout=600)
        shared, sums, hashes = self.group.result
        return Averaged(round_, self.group.size, shared, sums, hashes, 0.0, 0)


def learning(args: argparse.Namespace) -> str:
    """Part 4; returns the headline."""
    import torch

    from intellect_node.crypto.identity import Identity
    from intellect_node.node.demo.metagene import MetageneDemoOptions, eval_metrics, prepare_data
    from intellect_node.node.diloco.peer import DilocoPeer
    from intellect_node.node.diloco.settings import DilocoSettings
    from intellect_node.node.metagene.evaluate import evaluate
    from intellect_node.node.metagene.presets import build_model, get_preset
    from intellect_node.node.metagene.pretrain import train_step
    from intellect_node.node.metagene.recipe import Recipe, make_optimizer

    torch.set_num_threads(1)
    peers, seq_len = 4, 128
    rounds, H = (4, 10) if args.quick else (20, 20)
    options = MetageneDemoOptions(reads_per_organism=600 if args.quick else 2000,
                                  eval_reads_per_organism=60 if args.quick else 100)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        store, tokenizer, eval_reads = prepare_data(options, Path(tmp))
        settings = DilocoSettings(H=H, batch=options.batch, model=options.preset, seed=options.seed,
                                  data=f"metagene:store={store},seq_len={seq_len}")
        data = settings.open_data()
        print(f"learning: {options.organisms} organisms, {len(data.store):,} training reads, "
              f"{len(eval_reads)} held-out reads, "
              f"preset {options.preset}, {seq_len}-token rows; {peers} DiLoCo peers x {rounds} rounds x H {H} x "
              f"{options.batch} reads vs one peer on the same batches "
              f"(data ready in {time.perf_counter() - started:.0f} s)")

        def scored(model: torch.nn.Module) -> dict[str, Any]:
            model.eval()
            return eval_metrics(evaluate(model, tokenizer, eval_reads, seq_len))

        before = scored(build_model(get_preset(options.preset), options.seed))
        identities = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(peers)]
        group = LoopbackGroup(peers, settings.levels)
        members = [DilocoPeer(build_model(settings.preset, options.seed), settings, group.member(str(i)), data,
                              identity)
                   for i, identity in enumerate(identities)]
        started = time.perf_counter()
        for _ in range(rounds):
            threads = [threading.Thread(target=m.run_round) for m in members]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        diloco_s = time.perf_counter() - started
        assert len({m.state.params.sum().item() for m in members}) == 1, "the peers' global states differ"
        diloco_tokens = sum(m.tokens for m in members)
        ours = scored(members[0].model)

        recipe = Recipe(lr=settings.inner_lr, min_lr=settings.inner_lr, warmup_steps=0, total_steps=1,
                        weight_decay=settings.weight_decay, betas=settings.betas)  # DilocoPeer's inner optimizer

        def one_peer(keys: list[int]) -> tuple[dict[str, Any], int, float]:
            """Plain AdamW from theta0 on the batches the peers of ``keys`` drew, step by step in turn."""
            model = build_model(settings.preset, options.seed)
            optimizer = make_optimizer(model, recipe)
            model.train()
            started, tokens, step = time.perf_counter(), 0, 0
            for round_ in range(rounds):
                for inner in range(H):
                    for key in keys:
                        tokens += train_step(model, optimizer, data.draw(round_, key, inner), recipe, step)["tokens"]
                        step += 1
            seconds = time.perf_counter() - started
            return scored(model), tokens, seconds

        peer, single_tokens, single_s = one_peer([m.key for m in members])
        alone, alone_tokens, alone_s = one_peer([members[0].key])

    print(f"  {'':28} {'perplexity':>10} {'bits/bp':>8} {'probe MCC':>9} {'4-mer MCC':>9} {'tokens':>9} {'train s':>7}")
    for name, m, tokens, seconds in (("before training (theta0)", before, 0, 0.0),
                                     (f"DiLoCo, {peers} peers", ours, diloco_tokens, diloco_s),
                                     ("one peer, same batches", peer, single_tokens, single_s),
                                     ("one peer, a quarter of them", alone, alone_tokens, alone_s)):
        print(f"  {name:28} {m['perplexity']:>10.3f} {m['bits_per_bp']:>8.4f} {m['probe_mcc']:>9.3f} "
              f"{m['kmer_mcc']:>9.3f} "
              f"{tokens:>9,} {seconds:>7.1f}")
    print("  per organism (DiLoCo / one peer): " + ", ".join(
        f"{k} {v:.3f}/{peer['perplexity_per_organism'][k]:.3f}" for k, v in ours["perplexity_per_organism"].items()))
    ratio = ours["perplexity"] / peer["perplexity"]
    verdict = "ok" if ratio <= LEARNING_TARGET else "short"
    return (f"metagene_learning: ours={ours['perplexity']:.3f} peer={peer['perplexity']:.3f} ratio={ratio:.3f} "
            f"target={LEARNING_TARGET:g} {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (each part under a minute)")
    parser.add_argument("--part", choices=("pipeline", "learning", "all"), default="all")
    parser.add_argument("--reads", type=int, default=None, help="pipeline: reads in the FASTQ")
    parser.add_argument("--repeats", type=int, default=None, help="pipeline: best of this many runs")
    args = parser.parse_args()
    if args.part in ("pipeline", "all"):
        print(pipeline(args), flush=True)
    if args.part in ("learning", "all"):
        print(learning(args))


if __name__ == "__main__":
    main()
