"""Does the swarm learn, and does asynchrony pay? The demo swarm, asynchronous vs synchronous.

Runs ``intellect-node demo``'s swarm (bootstrap, trainer, two inference nodes, a validator, the
tiny model, toy reversal; node.demo) for ``--minutes`` with the default async level 2 ("ours"),
then the same swarm for the same time with async level 0 ("peer": the trainer only uses rollouts
of its current policy, the synchronous loop). For each it reports the held-out greedy accuracy at
start and end, the trainer's utilization (share of its wall time spent training rather than
waiting for rollouts), accepted / rejected / stale groups, and when the run first reached the
accuracy threshold ``start + --gain``.

Targets (issue 7): held-out accuracy rises by >= 0.3 within 10 minutes from a start <= 0.3; the
asynchronous trainer waits <= 30% of the time and reaches the same accuracy sooner than the
synchronous one.

    .venv/bin/python bench/learning.py [--quick] [--minutes 10] [--out DIR]

The last line is ``learning: ours=<accuracy gain> peer=<accuracy gain> ratio=<x> target=0.3 ok|short``
(ratio: async gain over sync gain).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.demo.swarm import DemoOptions, run_demo  # noqa: E402

TARGET_GAIN = 0.3


def first_reaching(lines: list[dict[str, Any]], level: float) -> float | None:
    """Wall seconds at which held-out accuracy first reached ``level`` (None: never)."""
    for line in lines:
        if line.get("eval_measured") and line["eval_accuracy"] >= level:
            return float(line["wall_s"])
    return None


def one_run(async_level: int, minutes: float, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    options = DemoOptions(steps=100_000, minutes=minutes, out=out, async_level=async_level, dashboard=False)
    summary = run_demo(options, log=lambda line: print(f"  {line}", flush=True))
    lines = [json.loads(raw) for raw in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 s per run (< 1.5 minutes with start-up)")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of each run")
    parser.add_argument("--gain", type=float, default=0.15, help="accuracy gain whose arrival time is compared")
    parser.add_argument("--out", type=Path, help="keep each run's metrics, plot and logs here")
    args = parser.parse_args()
    minutes = 0.33 if args.quick else args.minutes
    root = args.out or Path(tempfile.mkdtemp(prefix="ina-bench-learning-"))
    results = {}
    for name, level in (("async", 2), ("sync", 0)):
        print(f"{name} (async level {level}), {minutes:g} min:", flush=True)
        results[name] = one_run(level, minutes, root / name)
    print(f"\n{'':8} {'start':>6} {'end':>6} {'best':>6} {'steps':>6} {'busy':>6} {'accepted':>9} {'rejected':>9} "
          f"{'stale':>6} {'reached':>8}")
    gains = {}
    start = min(s["eval_accuracy_start"] for s, _ in results.values())
    for name, (summary, lines) in results.items():
        reached = first_reaching(lines, start + args.gain)
        gains[name] = summary["eval_accuracy_end"] - summary["eval_accuracy_start"]
        print(f"{name:8} {summary['eval_accuracy_start']:6.3f} {summary['eval_accuracy_end']:6.3f} "
              f"{summary['eval_accuracy_best']:6.3f} {summary['steps']:6d} {summary['utilization'] or 0:6.2f} "
              f"{summary['accepted_groups']:9d} {summary['rejected_groups']:9d} {summary['stale_groups']:6d} "
              f"{'-' if reached is None else f'{reached:.0f} s':>8}")
    print(f"(busy: trainer's share of time not waiting for rollouts; reached: first time at accuracy "
          f">= start + {args.gain}; runs kept in {root})")
    ours, peer = gains["async"], gains["sync"]
    ratio = ours / peer if peer > 0 else float("inf")
    verdict = "ok" if ours >= TARGET_GAIN and results["async"][0]["eval_accuracy_start"] <= 0.3 else "short"
    print(f"learning: ours={ours:+.3f} peer={peer:+.3f} ratio={ratio:.2f}x target={TARGET_GAIN} {verdict}")


if __name__ == "__main__":
    main()
