"""The verifier's sampling replay, compiled against eager, side by side on the same logits.

A validator replays every completion token's race (specs/sampling.md): the protocol's noise for
each token of the vocabulary, the claimed token's margin and the race's gap
(``protocol.sampling.margins_of_rows``, top-p 1). peer: the race as the eager torch ops run it
(about twenty-five passes over [rows, vocabulary] int64/float64); ours: the same function through
``protocol.compiled.CompiledOn`` (torch.compile: one fused loop on a CPU, one kernel on a GPU), what
a GPU validator runs by default. The margins and gaps of both are compared (they may differ by the
logarithms' ulps). Logits are random at SmolLM2's vocabulary (49,152); the prefill is not in either.

    python bench/replay.py [--quick] [--positions 2048] [--vocab 49152] [--device cpu|cuda] [--threads 2]

The last line is ``replay: ours=<positions/s> peer=<positions/s> ratio=<x> target=2.0 ok|short``. On
a GPU the figure that matters is bench/gpu_engines.py's verification rate against generation (issue
36 asks 20x); this bench isolates the replay, which was that rate's whole cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.protocol import sampling  # noqa: E402
from intellect_node.protocol.compiled import CompiledOn  # noqa: E402
from intellect_node.protocol.sampling import MAX_SLACK, Replay, margins_of_rows  # noqa: E402

TARGET = 2.0


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="512 positions, 3 rounds (< 1 minute with the compile)")
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.positions, args.rounds = 512, 3
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(args.positions, args.vocab, generator=generator) * 3).to(device)
    tokens = torch.randint(0, args.vocab, (args.positions,), generator=generator)
    completions = max(1, args.positions // 128)  # 128-token completions, as the real-model swarm's
    counts = [args.positions // completions] * completions
    counts[-1] += args.positions - sum(counts)
    replays = [Replay(seed=7 + i, temperature=1.0, top_p=1.0, slack=MAX_SLACK) for i in range(completions)]
    arms = {"peer": CompiledOn(sampling._full_replay, ()), "ours": CompiledOn(sampling._full_replay, {device.type})}

    def run(name: str) -> list:
        sampling._FULL_REPLAY = arms[name]  # the arm the replay runs through
        return margins_of_rows(logits, tokens, replays, counts)

    started = time.perf_counter()
    results = {name: run(name) for name in arms}  # warm-up; ours compiles here
    print(f"{args.positions} positions x {args.vocab} tokens on {device}, {completions} completions; "
          f"warm-up and compile {time.perf_counter() - started:.1f} s")
    if arms["ours"].failed:
        print(f"compiling failed: {arms['ours'].failed}")
    difference = max(max(abs(a.margins - b.margins).max(), abs(a.gaps - b.gaps).max())
                     for a, b in zip(results["ours"], results["peer"], strict=True))
    rates: dict[str, list[float]] = {"peer": [], "ours": []}
    for _ in range(args.rounds):
        for name in arms:
            sync()
            started = time.perf_counter()
            run(name)
            sync()
            rates[name].append(args.positions / (time.perf_counter() - started))
    for name, values in rates.items():
        print(f"{name} rounds (positions/s): {', '.join(f'{v:.0f}' for v in values)}")
    print(f"largest margin or gap difference, ours against peer: {difference:.3g}")
    ours, peer = statistics.median(rates["ours"]), statistics.median(rates["peer"])
    ratio = ours / peer
    print(f"replay: ours={ours:.0f} peer={peer:.0f} ratio={ratio:.2f} target={TARGET} "
          f"{'ok' if ratio >= TARGET else 'short'}")


if __name__ == "__main__":
    main()
