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

   Knobs of the learning part (defaults: 20 rounds of H 20, ``DilocoSettings``' inner lr 4e-4 and outer
   Nesterov lr 0.7 momentum 0.9, no warm-up; ``--quick``: 4 rounds of H 10 on 600 reads per organism):
   ``--rounds``, ``--H``, ``--inner-lr`` (the one peer's AdamW uses the same lr unless
   ``--baseline-lrs`` names others: then each one-peer arm trains at each of them and the best
   held-out perplexity of each arm is the one compared, so neither baseline loses by a lr tuned
   for DiLoCo), ``--outer-lr``,
   ``--outer-momentum`` (0: plain averaging at ``--outer-lr``), ``--warmup-steps`` (θ0 is first trained
   that many one-peer AdamW steps on warm-up draws, rounds from ``WARMUP_ROUND`` under a key no peer
   has, and both arms start from that model, as DiLoCo starts from a pretrained checkpoint), and
   ``--long`` (the ``LONG`` preset of them, the regime bench/HISTORY.md found; fits 30 minutes on 2
   shared cores); an explicit option overrides the preset. ``--genomes pyrodigal``: the four real
   genomes in pyrodigal's test data (the demo's ``--genomes``) instead of the generated metagenome.
   ``--held-out region``: held-out reads from the last tenth of each genome, which no training read
   covers (default ``reads``: other reads of the whole genomes, which a small genome's training reads
   cover many times over).

    .venv/bin/python bench/metagene.py [--quick] [--part pipeline|learning|all] [--long]
        [--rounds N] [--H N] [--inner-lr X] [--baseline-lrs X,X,..] [--outer-lr X] [--outer-momentum X]
        [--warmup-steps N] [--preset tiny|small] [--genomes generated|genic|pyrodigal] [--held-out reads|region]
        [--reads-per-organism N] [--genome-length BP]

Headlines: ``metagene: ours=<reads/s> peer=<reads/s> ratio=<x> target=5 ok|short`` (parsing, ours
over Biopython SeqIO), ``metagene_learning_quarter: ours=<ppl> peer=<ppl> ratio=<x> target=0.85 ok|short``
(4-peer DiLoCo over one peer on a quarter of the tokens, as many sequential steps; printed first)
and ``metagene_learning: ours=<ppl> peer=<ppl> ratio=<x> target=1.1 ok|short`` (held-out perplexity
of 4-peer DiLoCo over the one peer's on the same tokens; ok when within the target). The last line
is the headline of the last part run (``all``: learning, against all the tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.metagene.genomes import GENOME_SOURCES  # noqa: E402

TARGET = 5.0
LEARNING_TARGET = 1.1  # DiLoCo's held-out perplexity at most 10% above the one peer's, same tokens
QUARTER_TARGET = 0.85  # ... and at most 0.85x one peer's on a quarter of them (as many sequential steps)


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

    from intellect_node.node.diloco.recipe import make_optimizer
    from intellect_node.node.metagene.dataset import tokenize_reads
    from intellect_node.node.metagene.feed import round_batches
    from intellect_node.node.metagene.filtering import FilterConfig, filter_reads
    from intellect_node.node.metagene.presets import PRESETS, build_model
    from intellect_node.node.metagene.pretrain import train_step
    from intellect_node.node.metagene.reads import iter_reads
    from intellect_node.node.metagene.recipe import MetageneRecipe
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
        recipe = MetageneRecipe(warmup_steps=1, total_steps=100)
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
        return Averaged(round_, self.group.size, shared, sums, hashes, 0.0, 0, 1)


@dataclass(frozen=True)
class LearningConfig:
    """The knobs of part 4: rounds of H inner steps, the inner and outer optimizers, the warm-up."""

    rounds: int
    H: int
    inner_lr: float
    outer_lr: float
    outer_momentum: float
    warmup_steps: int  # one-peer AdamW steps from the seed's model before both arms start (0: none)
    baseline_lrs: tuple[float, ...]  # the one-peer arms' lrs, each arm at its best of them (empty: the inner lr)
    reads_per_organism: int
    eval_reads_per_organism: int


# --long: fits in 30 minutes on 2 shared cores (bench/HISTORY.md, "DiLoCo's regime on METAGENE" and "Against
# each baseline at its best lr", 2026-11-27): 120 rounds, and the baselines at the three lrs that bracket their best
LONG = {"rounds": 120, "H": 20, "inner_lr": 2e-3, "outer_lr": 1.0, "outer_momentum": 0.0, "warmup_steps": 0,
        "baseline_lrs": (5e-4, 1e-3, 2e-3)}
WARMUP_ROUND = 1_000_000  # warm-up draws use rounds from here on, under a key no peer has: not the arms' batches
WARMUP_KEY = 0


def learning_config(args: argparse.Namespace) -> LearningConfig:
    """Defaults (``--quick``: 4 rounds of H 10 on 600 reads per organism; ``--long``: ``LONG``), then the options."""
    from intellect_node.node.diloco.settings import DilocoSettings

    d = DilocoSettings()
    base: dict[str, Any] = {"rounds": 20, "H": 20, "inner_lr": d.inner_lr, "outer_lr": d.outer_lr,
                            "outer_momentum": d.outer_momentum, "warmup_steps": 0, "baseline_lrs": ()}
    if args.quick:
        base |= {"rounds": 4, "H": 10}
    if args.long:
        base |= LONG
    for name in base:
        if getattr(args, name, None) is not None:
            base[name] = getattr(args, name)
    return LearningConfig(**base, reads_per_organism=args.reads_per_organism or (600 if args.quick else 2000),
                          eval_reads_per_organism=60 if args.quick else 100)


def theta0(settings: Any, data: Any, steps: int) -> dict[str, Any]:
    """The seed's model, trained ``steps`` AdamW steps at the inner lr on warm-up draws (``WARMUP_ROUND``,
    ``WARMUP_KEY``): both arms start from these weights, as DiLoCo starts from a pretrained checkpoint."""
    from intellect_node.node.diloco.recipe import make_optimizer
    from intellect_node.node.metagene.pretrain import train_step

    model = build_preset_model(settings)
    recipe = inner_recipe(settings)
    optimizer = make_optimizer(model, recipe)
    model.train()
    for step in range(steps):
        train_step(model, optimizer, data.draw(WARMUP_ROUND + step // settings.H, WARMUP_KEY, step % settings.H),
                   recipe, step)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build_preset_model(settings: Any, weights: dict[str, Any] | None = None) -> Any:
    """The run's preset model at the seed's initialisation, or with ``weights``."""
    from intellect_node.node.metagene.presets import build_model

    model = build_model(settings.preset, settings.seed)
    if weights is not None:
        model.load_state_dict(weights)
    return model


def inner_recipe(settings: Any) -> Any:
    """DilocoPeer's inner optimizer: constant-lr AdamW (node/diloco/peer.py)."""
    from intellect_node.node.metagene.recipe import MetageneRecipe

    return MetageneRecipe(lr=settings.inner_lr, min_lr=settings.inner_lr, warmup_steps=0, total_steps=1,
                          weight_decay=settings.weight_decay, betas=settings.betas)


def run_diloco(settings: Any, data: Any, weights: dict[str, Any], peers: int,
               rounds: int) -> tuple[Any, list[int], int, float]:
    """``peers`` DilocoPeers from ``weights`` for ``rounds`` rounds; (model, the peers' keys, tokens, seconds)."""
    from intellect_node.crypto.identity import Identity
    from intellect_node.node.diloco.peer import DilocoPeer

    group = LoopbackGroup(peers, settings.levels)
    members = [DilocoPeer(build_preset_model(settings, weights), settings, group.member(str(i)), data,
                          Identity.from_seed(bytes([i + 1]) * 32)) for i in range(peers)]
    started = time.perf_counter()
    for _ in range(rounds):
        threads = [threading.Thread(target=m.run_round) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    seconds = time.perf_counter() - started
    assert len({m.state.params.sum().item() for m in members}) == 1, "the peers' global states differ"
    return members[0].model, [m.key for m in members], sum(m.tokens for m in members), seconds


def one_peer(settings: Any, data: Any, weights: dict[str, Any], keys: list[int], rounds: int) -> tuple[Any, int, float]:
    """Plain AdamW (the inner optimizer) from ``weights`` on the batches the peers of ``keys`` drew, step by step
    in turn; (model, tokens, seconds)."""
    from intellect_node.node.diloco.recipe import make_optimizer
    from intellect_node.node.metagene.pretrain import train_step

    model = build_preset_model(settings, weights)
    recipe = inner_recipe(settings)
    optimizer = make_optimizer(model, recipe)
    model.train()
    started, tokens, step = time.perf_counter(), 0, 0
    for round_ in range(rounds):
        for inner in range(settings.H):
            for key in keys:
                tokens += train_step(model, optimizer, data.draw(round_, key, inner), recipe, step)["tokens"]
                step += 1
    return model, tokens, time.perf_counter() - started


def best_one_peer(settings: Any, data: Any, weights: dict[str, Any], keys: list[int], rounds: int,
                  lrs: tuple[float, ...],
                  scored: Callable[[Any], dict[str, Any]]) -> tuple[dict[str, Any], int, float, float]:
    """``one_peer`` at each lr of ``lrs``; the metrics, tokens and seconds of the lowest held-out perplexity,
    and its lr. Each lr's perplexity is printed: the reader sees how flat the best is."""
    best: tuple[dict[str, Any], int, float, float] | None = None
    for lr in lrs:
        model, tokens, seconds = one_peer(dataclasses.replace(settings, inner_lr=lr), data, weights, keys, rounds)
        metrics = scored(model)
        if len(lrs) > 1:
            print(f"  one peer on {len(keys)} peer(s)' batches at lr {lr:g}: held-out perplexity "
                  f"{metrics['perplexity']:.3f}", flush=True)
        if best is None or metrics["perplexity"] < best[0]["perplexity"]:
            best = (metrics, tokens, seconds, lr)
    assert best is not None, "no baseline lr"
    return best


def headline(name: str, ours: float, peer: float, target: float) -> str:
    """The project's headline: ok when ours is at most ``target`` times the peer's perplexity."""
    ratio = ours / peer
    return (f"{name}: ours={ours:.3f} peer={peer:.3f} ratio={ratio:.3f} target={target:g} "
            f"{'ok' if ratio <= target else 'short'}")


def learning(args: argparse.Namespace) -> str:
    """Part 4; prints the table and the headline against one peer on a quarter of the tokens; returns the
    headline against one peer on all of them."""
    import torch

    import intellect_node.node.metagene.workload  # noqa: F401 (registers its presets and data with diloco)
    from intellect_node.node.demo.metagene import MetageneDemoOptions, eval_metrics, prepare_data
    from intellect_node.node.diloco.settings import DilocoSettings
    from intellect_node.node.metagene.evaluate import evaluate

    torch.set_num_threads(1)
    cfg = learning_config(args)
    peers, seq_len = 4, 128
    options = MetageneDemoOptions(reads_per_organism=cfg.reads_per_organism,
                                  eval_reads_per_organism=cfg.eval_reads_per_organism, genomes=args.genomes,
                                  held_out=args.held_out, genome_length=args.genome_length, preset=args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        store, tokenizer, eval_reads = prepare_data(options, Path(tmp))
        settings = DilocoSettings(H=cfg.H, batch=options.batch, model=options.preset, seed=options.seed,
                                  inner_lr=cfg.inner_lr, outer_lr=cfg.outer_lr, outer_momentum=cfg.outer_momentum,
                                  data=f"metagene:store={store},seq_len={seq_len}")
        data = settings.open_data()
        print(f"learning: {options.organisms} organisms, {len(data.store):,} training reads, "
              f"{len(eval_reads)} held-out reads, preset {options.preset}, {seq_len}-token rows; {peers} DiLoCo "
              f"peers x {cfg.rounds} rounds x H {cfg.H} x {options.batch} reads vs one peer on the same batches "
              f"(data ready in {time.perf_counter() - started:.0f} s); inner AdamW lr {cfg.inner_lr:g} (the one "
              f"peer's too), outer Nesterov lr {cfg.outer_lr:g} momentum {cfg.outer_momentum:g}, "
              f"{cfg.warmup_steps} warm-up steps", flush=True)

        def scored(model: torch.nn.Module) -> dict[str, Any]:
            model.eval()
            return eval_metrics(evaluate(model, tokenizer, eval_reads, seq_len))

        started = time.perf_counter()
        weights = theta0(settings, data, cfg.warmup_steps)
        warm_s = time.perf_counter() - started
        before = scored(build_preset_model(settings, weights))
        model, keys, diloco_tokens, diloco_s = run_diloco(settings, data, weights, peers, cfg.rounds)
        ours = scored(model)
        lrs = cfg.baseline_lrs or (cfg.inner_lr,)
        peer, single_tokens, single_s, single_lr = best_one_peer(settings, data, weights, keys, cfg.rounds, lrs, scored)
        alone, alone_tokens, alone_s, alone_lr = best_one_peer(settings, data, weights, keys[:1], cfg.rounds, lrs,
                                                               scored)

    def at(lr: float) -> str:  # a baseline's lr, named where it is not the inner lr
        return "" if lr == cfg.inner_lr else f" (lr {lr:g})"

    print(f"  {'':34} {'perplexity':>10} {'bits/bp':>8} {'probe MCC':>9} {'4-mer MCC':>9} {'tokens':>9} {'train s':>7}")
    start_name = f"theta0 ({cfg.warmup_steps} warm-up steps)" if cfg.warmup_steps else "before training (theta0)"
    for name, m, tokens, seconds in ((start_name, before, 0, warm_s),
                                     (f"DiLoCo, {peers} peers", ours, diloco_tokens, diloco_s),
                                     (f"one peer, same batches{at(single_lr)}", peer, single_tokens, single_s),
                                     (f"one peer, a quarter{at(alone_lr)}", alone, alone_tokens, alone_s)):
        print(f"  {name:34} {m['perplexity']:>10.3f} {m['bits_per_bp']:>8.4f} {m['probe_mcc']:>9.3f} "
              f"{m['kmer_mcc']:>9.3f} {tokens:>9,} {seconds:>7.1f}")
    print("  per organism (DiLoCo / one peer): " + ", ".join(
        f"{k} {v:.3f}/{peer['perplexity_per_organism'][k]:.3f}" for k, v in ours["perplexity_per_organism"].items()))
    print(headline("metagene_learning_quarter", ours["perplexity"], alone["perplexity"], QUARTER_TARGET))
    return headline("metagene_learning", ours["perplexity"], peer["perplexity"], LEARNING_TARGET)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (each part under a minute)")
    parser.add_argument("--part", choices=("pipeline", "learning", "all"), default="all")
    parser.add_argument("--reads", type=int, default=None, help="pipeline: reads in the FASTQ")
    parser.add_argument("--repeats", type=int, default=None, help="pipeline: best of this many runs")
    parser.add_argument("--long", action="store_true", help="learning: the LONG preset (fits 30 minutes here)")
    parser.add_argument("--rounds", type=int, default=None, help="learning: outer rounds")
    parser.add_argument("--H", type=int, default=None, help="learning: inner steps per round")
    parser.add_argument("--inner-lr", type=float, default=None, help="learning: inner AdamW lr (the one peer's too)")
    parser.add_argument("--baseline-lrs", type=lambda s: tuple(float(x) for x in s.split(",")), default=None,
                        help="learning: the one-peer arms' AdamW lrs, each arm at its best (default: --inner-lr)")
    parser.add_argument("--outer-lr", type=float, default=None, help="learning: outer Nesterov lr")
    parser.add_argument("--outer-momentum", type=float, default=None, help="learning: outer momentum (0: averaging)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="learning: one-peer AdamW steps on warm-up draws before both arms start from them")
    parser.add_argument("--preset", choices=("tiny", "small"), default="tiny",
                        help="learning: the model preset (node/metagene/presets.py; small is ~18x tiny's compute)")
    parser.add_argument("--genomes", choices=GENOME_SOURCES, default="generated",
                        help="learning: the generated metagenome (order-2 Markov genomes), genic (generated genomes of "
                             "genes, node/metagene/genic.py), or the four real genomes in pyrodigal's test data")
    parser.add_argument("--reads-per-organism", type=int, default=None,
                        help="learning: training reads per organism (default 2000; quick 600)")
    parser.add_argument("--genome-length", type=int, default=20_000,
                        help="learning: bp per generated genome (more than reads x 150 bp: no base seen twice)")
    parser.add_argument("--held-out", choices=("reads", "region"), default="reads",
                        help="learning: held-out reads from the whole genomes, or from a tenth of each that no "
                             "training read covers (node/demo/metagene.py split_genomes)")
    args = parser.parse_args()
    if args.part in ("pipeline", "all"):
        print(pipeline(args), flush=True)
    if args.part in ("learning", "all"):
        print(learning(args))


if __name__ == "__main__":
    main()
