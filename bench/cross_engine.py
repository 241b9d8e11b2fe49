"""Honest groups refused when one precision generates and another judges (issue: GPU engines).

The run spec has one ``EnginePair`` per (worker engine, validator engine) name, so a run that
admits bf16 and fp32 torch workers and validators needs torch/torch tolerances that hold for every
precision combination. This bench measures them on this machine's CPU and judges fresh honest
groups under them:

1. calibration: for each combination (worker precision -> validator precision), honest
   completions prefilled by both engines with replays (``node.engine.calibration.measure_pair``);
   the torch/torch pair is ``calibrated_pair`` over the worst figures of all combinations;
2. judging: fresh honest batches from each worker precision, judged by ``verify_batch`` on each
   validator precision, under the calibrated pair ("ours") and under today's fixed torch/torch
   tolerances ("peer": slack 1e-3, logprob 1e-3, calibrated fp32 against fp32 only).

The headline compares the worst combination's share of honest groups refused (a refusal proves a
cheat and bans the worker): ours should be 0 (target: 0 of >= 2,000 groups per combination, the
issue's bar), where the fixed pair refuses bf16 workers. Groups set aside as ``inconclusive``
(a figure past the pair's tolerance but within the proof bound: not credited, not charged;
specs/validation.md, "Two bounds") are counted and printed on their own line before the headline.

    .venv/bin/python bench/cross_engine.py [--quick] [--groups 2000] [--model DIR] [--threads 2]

The last line is ``cross_engine: ours=<refused share> peer=<refused share> ratio=<x> target=0 ok|short``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.validate import build, judge  # noqa: E402
from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.engine.calibration import PairFigures, calibrated_pair  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.tiny import ensure_tiny_model  # noqa: E402
from intellect_node.node.roles.inference.builder import RolloutSettings  # noqa: E402
from intellect_node.node.roles.validator.calibrate import measure_engines  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.validation import RunContext  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402
from intellect_node.protocol.run_spec import TORCH_TORCH, EnginePair, build_run_spec  # noqa: E402
from intellect_node.protocol.verdicts import INCONCLUSIVE  # noqa: E402

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
COMBINATIONS = (("fp32", "fp32"), ("bf16", "fp32"), ("fp32", "bf16"), ("bf16", "bf16"))
RUN = "bench"
TARGET = 0.0


def calibrate(engines: dict[str, TorchEngine], tokenizer: object, tasks: list, settings: RolloutSettings,
              groups: int) -> tuple[EnginePair, dict[str, PairFigures]]:
    """The torch/torch pair that covers every combination, from ``groups`` honest groups each."""
    figures = {f"{w}->{v}": measure_engines(engines[w], engines[v], tokenizer, tasks, settings, groups)
               for w, v in COMBINATIONS}
    return calibrated_pair("torch", "torch", PairFigures.worst_of(list(figures.values()))), figures


def refused(engines: dict[str, TorchEngine], tokenizer: object, tasks: list, settings: RolloutSettings,
            groups: int, pairs: dict[str, EnginePair]) -> dict[str, dict[str, Counter]]:
    """Per spec name and combination, the refusal reasons of fresh honest groups."""
    runs = {name: RunContext(build_run_spec(run_id=RUN, authority="spec", tasks=tasks, settings=settings,
                                            async_window=2, engines=(pair,)), tasks)
            for name, pair in pairs.items()}
    tallies: dict[str, dict[str, Counter]] = {name: {} for name in pairs}
    for worker_precision in PRECISIONS:
        worker = Identity.generate()
        states = {(name, v): JudgeState() for name in pairs for v in PRECISIONS}
        for first in range(0, groups, settings.groups_per_batch):
            built, cpu_s = build(engines[worker_precision], tokenizer, tasks, worker=worker, settings=settings,
                                 first_counter=first)
            for validator_precision in PRECISIONS:
                combination = f"{worker_precision}->{validator_precision}"
                for name, run in runs.items():
                    verdict = judge(built, cpu_s, engines[validator_precision], tokenizer, run=run,
                                    state=states[name, validator_precision], worker=worker).verdict
                    tally = tallies[name].setdefault(combination, Counter())
                    tally["groups"] += len(verdict.groups)
                    for group in verdict.rejected:
                        tally[group.reason] += 1
    return tallies


def share(tally: Counter, inconclusive: bool = False) -> float:
    """The share of groups refused (proven cheats and the flip test), or set aside as inconclusive."""
    chosen = sum(v for k, v in tally.items() if k != "groups" and (k == INCONCLUSIVE) == inconclusive)
    return chosen / max(1, tally["groups"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="under a minute: 64 calibration and 24 judged groups")
    parser.add_argument("--groups", type=int, default=2000, help="honest groups judged per combination")
    parser.add_argument("--calibration-groups", type=int, default=512)
    parser.add_argument("--model", type=Path, help="an HF-layout model [default: the demo's tiny model]")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    groups, calibration_groups = (24, 64) if args.quick else (args.groups, args.calibration_groups)
    # the demo's tiny model, built once per machine (about a minute) and reused by later runs
    model = args.model or ensure_tiny_model(Path(tempfile.gettempdir()) / "ina-bench-tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    engines = {name: TorchEngine.from_checkpoint(model, dtype=dtype) for name, dtype in PRECISIONS.items()}
    tasks = generate_toy_tasks(seed=5, count=2000)
    settings = RolloutSettings(group_size=8, groups_per_batch=8, max_tokens=48)
    started = time.perf_counter()
    pair, figures = calibrate(engines, tokenizer, tasks, settings, calibration_groups)
    for combination, f in figures.items():
        print(f"calibration {combination}: {f.summary()}", flush=True)
    print(f"calibrated torch/torch: margin_noise={pair.margin_noise:.3g} sampling_slack={pair.sampling_slack:.3g} "
          f"logprob_atol={pair.logprob_atol:.3g} TOPLOC {pair.toploc_max_exp_mismatches}/"
          f"{pair.toploc_max_mant_err_mean:.3g}/{pair.toploc_max_mant_err_median:.3g} "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    tallies = refused(engines, tokenizer, tasks, settings, groups, {"calibrated": pair, "fixed": TORCH_TORCH})
    for name, by_combination in tallies.items():
        for combination, tally in by_combination.items():
            reasons = {k: v for k, v in tally.items() if k != "groups"}
            print(f"{name} {combination}: {tally['groups']} groups, refused {share(tally):.4f}, "
                  f"inconclusive {share(tally, inconclusive=True):.4f} {reasons}", flush=True)
    ours = max(share(t) for t in tallies["calibrated"].values())
    peer = max(share(t) for t in tallies["fixed"].values())
    set_aside = max(share(t, inconclusive=True) for t in tallies["calibrated"].values())
    print(f"honest groups set aside as inconclusive (not refused, not credited), worst combination: {set_aside:.4f}")
    ratio = ours / peer if peer else float("inf") if ours else 0.0
    print(f"({time.perf_counter() - started:.0f} s in all; CPU, {args.threads} threads; "
          f"{groups} groups per combination)")
    print(f"cross_engine: ours={ours:.4f} peer={peer:.4f} ratio={ratio:.3f} target={TARGET:g} "
          f"{'ok' if ours <= TARGET else 'short'}")


if __name__ == "__main__":
    main()
