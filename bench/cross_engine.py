"""Honest groups refused when one engine or precision generates and another judges (issue: GPU engines).

The run spec has one ``EnginePair`` per (worker engine, validator engine) name, so a run that
admits bf16 and fp32 torch workers and validators needs torch/torch tolerances that hold for every
precision combination (and vllm/torch ones for vLLM workers). This bench measures them on this
machine and judges fresh honest groups under them:

1. calibration: for each combination (worker -> validator), honest completions prefilled by both
   engines with replays (``node.engine.calibration.measure_pair``); each engine-name pair is
   ``calibrated_pair`` over the worst figures of its combinations;
2. judging: fresh honest batches from each worker, judged by ``verify_batch`` on each validator,
   under the calibrated pairs ("ours") and under today's fixed torch/torch tolerances ("peer":
   slack 1e-3, logprob 1e-3, calibrated fp32 against fp32 only) given to every engine pair.

Workers and validators are ``engine[:precision][@device]`` as ``--engine`` takes them
(``torch:bfloat16@cuda``, ``vllm:bfloat16``); the default is torch fp32 and bf16 on this machine's
CPU, both ways. The judged workers' keys follow from ``--seed`` (``worker_identity``), so a run is
reproduced group for group. The headline compares the worst combination's share of honest groups
refused (a refusal proves a cheat and bans the worker): ours should be 0 (target: 0 of >= 2,000 groups per
combination, the issue's bar), where the fixed pair refuses bf16 workers. Groups set aside as
``inconclusive`` (a figure past the pair's tolerance but within the proof bound: not credited, not
charged; specs/validation.md, "Two bounds") are counted and printed on their own line before the headline.

The answer-span rule's price and a softer rule's (specs/sampling.md section 4, "The answer span"):
for each combination, the judged groups' deepest flip in a final answer span, replayed on the
validator as ``verify_batch`` replays it, gives how many honest groups a rule letting span flips of
up to K noise levels of the calibrated pair through would still set aside, for each K in
``DEPTH_LEVELS`` (K = 0: the validator's rule, any flip); bench/steering.py measures what forgers
reach at the same depths.

    .venv/bin/python bench/cross_engine.py [--quick] [--groups 2000] [--model DIR] [--threads 2] [--seed 0]
    python bench/cross_engine.py --workers vllm:bfloat16 --validators torch:float32@cuda,torch:float32@cpu  # a GPU

The last line is ``cross_engine: ours=<refused share> peer=<refused share> ratio=<x> target=0 ok|short``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.validate import build, judge  # noqa: E402
from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.engine import build_engine  # noqa: E402
from intellect_node.node.engine.base import Engine, derive_seed  # noqa: E402
from intellect_node.node.engine.calibration import PairFigures, calibrated_pair  # noqa: E402
from intellect_node.node.models.tiny import ensure_tiny_model  # noqa: E402
from intellect_node.node.roles.validator.answer_span import span_flip_depth  # noqa: E402
from intellect_node.node.roles.validator.calibrate import measure_engines  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.validation import RunContext  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402
from intellect_node.protocol.assignment import sampling_seed  # noqa: E402
from intellect_node.protocol.rollout_shape import RolloutShape  # noqa: E402
from intellect_node.protocol.rollouts import RolloutBatch, unpack_tokens  # noqa: E402
from intellect_node.protocol.run_spec import TORCH_TORCH, EnginePair, RunSpec, build_run_spec  # noqa: E402
from intellect_node.protocol.sampling import Replay  # noqa: E402
from intellect_node.protocol.verdicts import INCONCLUSIVE  # noqa: E402

CPU_ENGINES = "torch:float32@cpu,torch:bfloat16@cpu"
RUN = "bench"
TARGET = 0.0
# span-flip depths, in noise levels of the pair, at which a softer answer-span rule is measured
DEPTH_LEVELS = (0, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16)


def load_engines(specs: list[str], model: Path, vllm_memory: float) -> dict[str, Engine]:
    """One engine per distinct ``engine[:precision][@device]``."""
    engines: dict[str, Engine] = {}
    for spec in specs:
        if spec not in engines:
            choice, _, device = spec.partition("@")
            options = {"gpu_memory_utilization": vllm_memory} if choice.startswith("vllm") else {}
            engines[spec] = build_engine(choice, model, device=device or None, **options)
    return engines


def calibrate(engines: dict[str, Engine], workers: list[str], validators: list[str], tokenizer: object,
              tasks: list, settings: RolloutShape, groups: int) -> tuple[list[EnginePair], dict[str, PairFigures]]:
    """One pair per (worker engine, validator engine) name covering each of its combinations, from
    ``groups`` honest groups per combination."""
    figures = {f"{w}->{v}": measure_engines(engines[w], engines[v], tokenizer, tasks, settings, groups)
               for w in workers for v in validators}
    by_names: dict[tuple[str, str], list[PairFigures]] = {}
    for w in workers:
        for v in validators:
            by_names.setdefault((engines[w].name, engines[v].name), []).append(figures[f"{w}->{v}"])
    pairs = [calibrated_pair(w, v, PairFigures.worst_of(f)) for (w, v), f in by_names.items()]
    return pairs, figures


def span_flip_depths(batch: RolloutBatch, validator: Engine, tokenizer: object, spec: RunSpec) -> list[float]:
    """Each group's deepest flip in a final answer span (``span_flip_depth``, 0: none), replayed on
    ``validator`` as ``verify_batch`` replays it (the batch's rows in one prefill, the spec's sampling
    and its pair's slack)."""
    pair = spec.pair(batch.engine, validator.name)
    assert pair is not None  # the run spec names every combination's engines
    prompts, completions, replays, sizes = [], [], [], []
    for group in batch.groups:
        seed = sampling_seed(batch.run_id, batch.worker, batch.policy_step, group.counter)
        for j, completion in enumerate(group.completions):
            prompts.append(unpack_tokens(group.prompt_ids).tolist())
            completions.append(unpack_tokens(completion.token_ids).tolist())
            replays.append(Replay(derive_seed(seed, j), spec.temperature, spec.top_p, pair.sampling_slack))
        sizes.append(len(group.completions))
    depths = [span_flip_depth(tokens, result.sampling_margins, tokenizer)
              for tokens, result in zip(completions, validator.prefill(prompts, completions, replays), strict=True)]
    starts = np.cumsum([0] + sizes)
    return [max(depths[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]


def worker_identity(worker: str, seed: int) -> Identity:
    """The judged worker's key, a function of its engine and ``--seed``: a worker's tasks and
    sampling seeds follow from its peer ID, so a refused counter is reproduced by rerunning."""
    return Identity.from_seed(hashlib.sha256(f"bench/cross_engine/{seed}/{worker}".encode()).digest())


def refused(engines: dict[str, Engine], workers: list[str], validators: list[str], tokenizer: object, tasks: list,
            settings: RolloutShape, groups: int, pairs: dict[str, list[EnginePair]],
            depths: dict[str, list[float]], seed: int) -> dict[str, dict[str, Counter]]:
    """Per spec name and combination, the refusal reasons of fresh honest groups; ``depths`` gets
    each combination's groups' deepest answer-span flips under the calibrated pair."""
    runs = {name: RunContext(build_run_spec(run_id=RUN, authority="spec", tasks=tasks, settings=settings,
                                            async_window=2, engines=tuple(spec_pairs)), tasks)
            for name, spec_pairs in pairs.items()}
    tallies: dict[str, dict[str, Counter]] = {name: {} for name in pairs}
    for w in workers:
        worker = worker_identity(w, seed)
        states = {(name, v): JudgeState() for name in pairs for v in validators}
        for first in range(0, groups, settings.groups_per_batch):
            built, cpu_s = build(engines[w], tokenizer, tasks, worker=worker, settings=settings, first_counter=first)
            for v in validators:
                depths.setdefault(f"{w}->{v}", []).extend(
                    span_flip_depths(built.batch, engines[v], tokenizer, runs["calibrated"].spec))
                for name, run in runs.items():
                    verdict = judge(built, cpu_s, engines[v], tokenizer, run=run, state=states[name, v],
                                    worker=worker).verdict
                    tally = tallies[name].setdefault(f"{w}->{v}", Counter())
                    tally["groups"] += len(verdict.groups)
                    for group in verdict.rejected:
                        tally[group.reason] += 1
                        # what refused an honest group, and what a token past the proof bound set aside
                        if name == "calibrated" and (group.reason != INCONCLUSIVE
                                                     or "past the proof bound" in group.detail):
                            print(f"{'set aside' if group.reason == INCONCLUSIVE else 'refused'} under the "
                                  f"calibrated pair, {w}->{v}, worker {worker.peer_id}, counter {group.counter}: "
                                  f"{group.reason}: {group.detail}", flush=True)
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
    parser.add_argument("--seed", type=int, default=0, help="the judged workers' keys (worker_identity)")
    parser.add_argument("--workers", default=CPU_ENGINES, help="engine[:precision][@device], comma-separated")
    parser.add_argument("--validators", default=CPU_ENGINES, help="engine[:precision][@device], comma-separated")
    parser.add_argument("--vllm-memory", type=float, default=0.3, help="a vLLM engine's gpu_memory_utilization")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    groups, calibration_groups = (24, 64) if args.quick else (args.groups, args.calibration_groups)
    # the demo's tiny model (the shipped weights), installed once per machine and reused by later runs
    model = args.model or ensure_tiny_model(Path(tempfile.gettempdir()) / "ina-bench-tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    workers, validators = args.workers.split(","), args.validators.split(",")
    engines = load_engines(workers + validators, model, args.vllm_memory)
    tasks = generate_toy_tasks(seed=5, count=2000)
    settings = RolloutShape(group_size=8, groups_per_batch=8, max_tokens=48)
    started = time.perf_counter()
    pairs, figures = calibrate(engines, workers, validators, tokenizer, tasks, settings, calibration_groups)
    for combination, f in figures.items():
        print(f"calibration {combination}: {f.summary()}", flush=True)
    for pair in pairs:
        print(f"calibrated {pair.worker}/{pair.validator}: margin_noise={pair.margin_noise:.3g} "
              f"sampling_slack={pair.sampling_slack:.3g} logprob_atol={pair.logprob_atol:.3g} TOPLOC "
              f"{pair.toploc_max_exp_mismatches}/{pair.toploc_max_mant_err_mean:.3g}/"
              f"{pair.toploc_max_mant_err_median:.3g} ({time.perf_counter() - started:.0f} s)", flush=True)
    fixed = [dataclasses.replace(TORCH_TORCH, worker=p.worker, validator=p.validator) for p in pairs]
    depths: dict[str, list[float]] = {}
    tallies = refused(engines, workers, validators, tokenizer, tasks, settings, groups,
                      {"calibrated": pairs, "fixed": fixed}, depths, args.seed)
    for name, by_combination in tallies.items():
        for combination, tally in by_combination.items():
            reasons = {k: v for k, v in tally.items() if k != "groups"}
            print(f"{name} {combination}: {tally['groups']} groups, refused {share(tally):.4f}, "
                  f"inconclusive {share(tally, inconclusive=True):.4f} {reasons}", flush=True)
    for combination, found in depths.items():
        w, v = combination.split("->")
        noise = next(p.margin_noise for p in pairs if (engines[w].name, engines[v].name) == (p.worker, p.validator))
        print(f"answer-span set-asides, {combination}: of {len(found)} groups, set aside by a rule letting span flips "
              f"of <= K noise levels ({noise:.3g}) through: "
              f"{ {level: sum(d > level * noise for d in found) for level in DEPTH_LEVELS} }", flush=True)
    ours = max(share(t) for t in tallies["calibrated"].values())
    peer = max(share(t) for t in tallies["fixed"].values())
    set_aside = max(share(t, inconclusive=True) for t in tallies["calibrated"].values())
    print(f"honest groups set aside as inconclusive (not refused, not credited), worst combination: {set_aside:.4f}")
    ratio = ours / peer if peer else float("inf") if ours else 0.0
    print(f"({time.perf_counter() - started:.0f} s in all; {args.threads} CPU threads; "
          f"{groups} groups per combination)")
    print(f"cross_engine: ours={ours:.4f} peer={peer:.4f} ratio={ratio:.3f} target={TARGET:g} "
          f"{'ok' if ours <= TARGET else 'short'}")


if __name__ == "__main__":
    main()
