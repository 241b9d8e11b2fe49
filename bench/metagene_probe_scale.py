"""METAGENE probe against 4-mers: how the probe's MCC moves with training tokens and model size, and
where it would meet the 4-mer baseline (issue 35's third target).

One peer (plain constant-lr AdamW, bench/metagene.py's inner recipe: no DiLoCo; the probe question is
about the model) trains each preset (``tiny`` 0.2 M parameters, ``small`` 3.7 M) on reads of the four
real genomes in pyrodigal's test data (``--genomes pyrodigal``, node/demo/metagene.py ``prepare_data``;
8 reads per step, 128-token rows, as bench/metagene.py). The lr is constant, so the model after the
first B tokens of a long run is exactly the model a run of B tokens gives: each preset trains once,
through its budgets, and is evaluated at each. Per point: tokens, parameters, training FLOPs
(6 x parameters x tokens, embeddings included), held-out perplexity and bits/bp, the probe MCC as the
bench defines it (node/metagene/evaluate.py: mean-pooled last hidden state, multinomial logistic
regression, reads alternating train/test within each organism) on the bench's held-out reads (100 per
organism), and, as diagnostics, the probe on each layer's mean-pooled hidden state and the last-layer
probe and the 4-mer baseline on larger held-out sets (the first N reads per organism; reads beyond
the bench's 100 are cut from the same genomes as ``prepare_data`` cuts them, under another seed).
Then MCC is fitted against log10(FLOPs) per preset and against bits/bp, and the crossing with the
4-mer baseline is extrapolated.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/metagene_probe_scale.py [--quick]
        [--genomes pyrodigal|generated] [--inner-lr X] [--reads-per-organism N]
        [--tiny-budgets M,M,..] [--small-budgets M,M,..] [--probe-sizes N,N,..]

Budgets are in millions of training tokens. Headline (last line):
``metagene_probe_scale: ours=<best last-layer probe MCC> peer=<4-mer MCC> ratio=<ours/peer> target=1.0 ok|short``
on the bench's held-out reads.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.metagene import build_preset_model, inner_recipe  # noqa: E402

TARGET = 1.0  # the model's probe MCC at least the 4-mer baseline's
SEQ_LEN = 128  # bench/metagene.py's rows
EXTRA_EVAL_SEED = 2_000_003  # prepare_data cuts its held-out reads under seed + 1_000_003


@dataclass(frozen=True)
class Point:
    """One preset evaluated after ``tokens`` training tokens."""

    preset: str
    params: int
    steps: int
    tokens: int
    train_s: float
    perplexity: float
    bits_per_bp: float
    probe_mcc: float  # the bench's definition: last layer, the bench's held-out reads
    layer_mcc: list[float]  # per hidden state (embeddings, blocks, last after the final norm), same reads
    size_mcc: dict[int, float]  # last layer, on the first N held-out reads per organism

    @property
    def flops(self) -> float:
        return 6.0 * self.params * self.tokens


def eval_reads_by_size(options: Any, root: Path, bench_reads: list[Any], sizes: Sequence[int]) -> dict[int, list[Any]]:
    """Held-out reads, the first N per organism for each N of ``sizes``: the bench's reads first, then
    more cut from the same genomes as ``prepare_data`` cuts them, under another seed."""
    from intellect_node.node.metagene.filtering import filter_reads
    from intellect_node.node.metagene.genomes import organisms_from
    from intellect_node.node.metagene.reads import iter_reads
    from intellect_node.node.metagene.synthetic import cut_reads, write_fastq

    extra = max(sizes) - options.eval_reads_per_organism
    rng = random.Random(options.seed + EXTRA_EVAL_SEED)
    for organism in organisms_from(options.genomes, options.seed, options.organisms, options.genome_length):
        write_fastq(root / "eval_extra" / f"{organism.name}.fastq.gz", cut_reads(organism, rng, extra))
    by_source: dict[str, list[Any]] = {}
    for read in [*bench_reads, *filter_reads(iter_reads(root / "eval_extra"))]:
        by_source.setdefault(read.source, []).append(read)
    return {n: [r for reads in by_source.values() for r in reads[:n]] for n in sizes}


def layer_features(model: Any, tokenizer: Any, reads: Sequence[Any], batch: int = 64) -> tuple[list[Any], list[int]]:
    """Mean-pooled hidden state of every layer over each read's positions (as ``evaluate.score_reads`` pools
    the last one), and the reads' organism labels."""
    import torch

    from intellect_node.node.metagene.dataset import tokenize_reads
    from intellect_node.node.metagene.sequences import build_rows

    store = tokenize_reads(reads, tokenizer, max_read_tokens=SEQ_LEN)
    ids = [store.read(i) for i in range(len(store))]
    model.eval()
    pooled: list[list[Any]] = []
    with torch.no_grad():
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            rows = build_rows(chunk, max(len(r) for r in chunk), pack=False)
            hidden = model(**rows.model_inputs(), output_hidden_states=True).hidden_states
            inside = (rows.document_ids >= 0).unsqueeze(-1).float()
            pooled.append([(h.float() * inside).sum(1) / inside.sum(1) for h in hidden])
    return [torch.cat(layer) for layer in zip(*pooled, strict=True)], [int(s) for s in store.sources]


def probe_point(model: Any, tokenizer: Any, reads_by_size: dict[int, list[Any]], base: int) -> dict[str, Any]:
    """The bench's metrics on the ``base`` set, the probe per layer there, the last-layer probe per set."""
    from intellect_node.node.demo.metagene import eval_metrics
    from intellect_node.node.metagene.evaluate import evaluate, probe_mcc

    metrics = eval_metrics(evaluate(model, tokenizer, reads_by_size[base], SEQ_LEN))
    size_mcc, layer_mcc = {}, []
    for n, reads in reads_by_size.items():
        layers, labels = layer_features(model, tokenizer, reads)
        size_mcc[n] = probe_mcc(layers[-1], labels, len(set(labels)))
        if n == base:
            layer_mcc = [probe_mcc(f, labels, len(set(labels))) for f in layers]
    return metrics | {"layer_mcc": layer_mcc, "size_mcc": size_mcc}


def train_through(preset: str, settings: Any, data: Any, budgets: Sequence[int], tokenizer: Any,
                  reads_by_size: dict[int, list[Any]], base: int) -> list[Point]:
    """One peer from the seed's model (``one_peer``'s AdamW, one key: round s // H, step s % H), evaluated
    each time the tokens reach the next budget."""
    from intellect_node.node.diloco.recipe import make_optimizer
    from intellect_node.node.metagene.presets import get_preset
    from intellect_node.node.metagene.pretrain import train_step

    model = build_preset_model(settings)
    recipe = inner_recipe(settings)
    optimizer = make_optimizer(model, recipe)
    params = get_preset(preset).parameter_count()
    points, tokens, step, train_s = [], 0, 0, 0.0
    for budget in sorted(budgets):
        started = time.perf_counter()
        while tokens < budget:
            batch = data.draw(step // settings.H, 0, step % settings.H)
            tokens += train_step(model, optimizer, batch, recipe, step)["tokens"]
            step += 1
        train_s += time.perf_counter() - started
        m = probe_point(model, tokenizer, reads_by_size, base)
        points.append(Point(preset, params, step, tokens, train_s, m["perplexity"], m["bits_per_bp"],
                            m["probe_mcc"], m["layer_mcc"], m["size_mcc"]))
        print(f"  {preset} {tokens:,} tokens ({step} steps, {train_s:.0f} s training, "
              f"{tokens / train_s:,.0f} tokens/s): perplexity {m['perplexity']:.1f}, probe MCC "
              f"{m['probe_mcc']:.3f}", flush=True)
    return points


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares line y = a + b x: (a, b, r^2)."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    b, a = np.polyfit(x, y, 1)
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - a - b * x) ** 2)) / spread if spread > 0 else float("nan")
    return float(a), float(b), r2


def print_table(points: Sequence[Point], sizes: Sequence[int], base: int) -> None:
    print(f"  {'preset':6} {'params':>9} {'tokens':>10} {'FLOPs':>9} {'ppl':>8} {'bits/bp':>7} "
          f"{'probe MCC':>9} {'best layer':>12} " + " ".join(f"{'n=' + str(n):>6}" for n in sizes))
    for p in points:
        best = int(np.argmax(p.layer_mcc))
        print(f"  {p.preset:6} {p.params:>9,} {p.tokens:>10,} {p.flops:>9.2e} {p.perplexity:>8.1f} "
              f"{p.bits_per_bp:>7.4f} {p.probe_mcc:>9.3f} {p.layer_mcc[best]:>6.3f} ({best}/{len(p.layer_mcc) - 1}) "
              + " ".join(f"{p.size_mcc[n]:>6.3f}" for n in sizes))
    print(f"  (probe MCC: last layer on {base} held-out reads per organism, as bench/metagene.py; best layer: "
          f"hidden state i of 0 = embeddings .. last = after the final norm; n=N: last layer on N per organism)")


def print_account(points: Sequence[Point], kmer: float) -> None:
    """Fits of MCC on log10(FLOPs) per preset and on bits/bp over all points, and where each line meets
    the 4-mer MCC."""
    beaten = [p for p in points if p.probe_mcc >= kmer]
    if beaten:
        print("  at or above the 4-mer baseline already: " + ", ".join(
            f"{p.preset} at {p.tokens:,} tokens ({p.probe_mcc:.3f})" for p in beaten))
    for preset in dict.fromkeys(p.preset for p in points):
        mine = [p for p in points if p.preset == preset]
        if len(mine) < 2:
            continue
        a, b, r2 = line_fit([math.log10(p.flops) for p in mine], [p.probe_mcc for p in mine])
        at = 10 ** ((kmer - a) / b) if b > 0 else math.nan
        where = (f"reaches {kmer:.3f} at {at:.2e} FLOPs = {at / (6 * mine[0].params):.2e} tokens"
                 if b > 0 else "never reaches it on this line")
        print(f"  fit {preset}: MCC = {a:.3f} {b:+.3f} x log10(FLOPs) (r^2 {r2:.2f}, {len(mine)} points); {where}")
    if len({p.bits_per_bp for p in points}) >= 2:
        a, b, r2 = line_fit([p.bits_per_bp for p in points], [p.probe_mcc for p in points])
        where = f"reaches {kmer:.3f} at {(kmer - a) / b:.3f} bits/bp" if b < 0 else "never reaches it on this line"
        print(f"  fit all points: MCC = {a:.3f} {b:+.3f} x bits/bp (r^2 {r2:.2f}, {len(points)} points); {where}")


def pick(given: str | None, quick: str, full: str, is_quick: bool) -> str:
    """An option's value, or its default for the run (an empty list is a value: that preset is skipped)."""
    return given if given is not None else quick if is_quick else full


def millions(text: str) -> list[int]:
    return [int(float(x) * 1e6) for x in text.split(",") if x]


def run(args: argparse.Namespace) -> None:
    import torch

    import intellect_node.node.metagene.workload  # noqa: F401 (registers its presets and data with diloco)
    from intellect_node.node.demo.metagene import MetageneDemoOptions, prepare_data
    from intellect_node.node.diloco.settings import DilocoSettings
    from intellect_node.node.metagene.evaluate import kmer_features, probe_mcc

    torch.set_num_threads(1)
    q = args.quick
    budgets = {"tiny": millions(pick(args.tiny_budgets, "0.02,0.04", "0.17,0.34,0.69,1.37,2.7,5.4,11", q)),
               "small": millions(pick(args.small_budgets, "0.01", "0.17,0.34,0.69,1.37,2.7", q))}
    sizes = [int(n) for n in pick(args.probe_sizes, "40,80", "100,200,400", q).split(",")]
    base = sizes[0]
    options = MetageneDemoOptions(reads_per_organism=args.reads_per_organism or (600 if q else 16000),
                                  eval_reads_per_organism=base, genomes=args.genomes)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        store, tokenizer, bench_reads = prepare_data(options, Path(tmp))
        reads_by_size = eval_reads_by_size(options, Path(tmp), bench_reads, sizes)
        kmer = {}
        for n, reads in reads_by_size.items():
            names = list(dict.fromkeys(r.source for r in reads))
            labels = [names.index(r.source) for r in reads]
            kmer[n] = probe_mcc(kmer_features([r.sequence for r in reads]), labels, len(set(labels)))
        print(f"probe scale: {args.genomes} genomes, {options.reads_per_organism} training reads per organism, "
              f"held-out {', '.join(str(len(r)) for r in reads_by_size.values())} reads; one peer, constant AdamW "
              f"lr {args.inner_lr:g}, {options.batch} reads per step, {SEQ_LEN}-token rows (data ready in "
              f"{time.perf_counter() - started:.0f} s); 4-mer MCC "
              + ", ".join(f"n={n} {v:.3f}" for n, v in kmer.items()), flush=True)
        points: list[Point] = []
        for preset, wanted in budgets.items():
            settings = DilocoSettings(batch=options.batch, model=preset, seed=options.seed, inner_lr=args.inner_lr,
                                      data=f"metagene:store={store},seq_len={SEQ_LEN}")
            points += train_through(preset, settings, settings.open_data(), wanted, tokenizer, reads_by_size, base)
    print_table(points, sizes, base)
    print_account(points, kmer[base])
    best = max(p.probe_mcc for p in points)
    ratio = best / kmer[base]
    print(f"metagene_probe_scale: ours={best:.3f} peer={kmer[base]:.3f} ratio={ratio:.3f} target={TARGET:.1f} "
          f"{'ok' if ratio >= TARGET else 'short'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="600 reads per organism, tiny budgets (under a minute)")
    parser.add_argument("--genomes", choices=("generated", "pyrodigal"), default="pyrodigal")
    parser.add_argument("--inner-lr", type=float, default=1e-3, help="the one peer's constant AdamW lr")
    parser.add_argument("--reads-per-organism", type=int, default=None,
                        help="training reads per organism (default 16000; quick 600)")
    parser.add_argument("--tiny-budgets", default=None,
                        help="M tokens (default 0.17,0.34,0.69,1.37,2.7,5.4,11; empty: skip the preset)")
    parser.add_argument("--small-budgets", default=None,
                        help="M tokens (default 0.17,0.34,0.69,1.37,2.7; empty: skip the preset)")
    parser.add_argument("--probe-sizes", default=None,
                        help="held-out reads per organism, the first the bench's set (default 100,200,400)")
    args = parser.parse_args()
    run(args)


if __name__ == "__main__":
    main()
