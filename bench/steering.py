"""Steering forgers under the loosest calibrated engine pair (issue 50 item 5).

The widest pair this project has calibrated is vLLM bf16 judged by torch (an H200, bench/HISTORY.md
"Second run"): sampling slack 2.0, logprob tolerance 6.55, margin noise 0.036, TOPLOC 59/7.32/6.
Here that pair is applied on this CPU through the run spec's ``[[run.engines]]`` table (checked by
the wire's ``EnginePair`` rules, as a node's config checks it) to fp32 torch workers judged by an
fp32 torch validator: the forger sees exactly the validator's race, and the judge allows it every
tolerance the vLLM pair needs.

The forger (``tests/support/steering.py``) generates honest batches with ``build_batch``, then
steers completions to end with an answer it chose, the task's right answer (reward it did not earn)
or a wrong one of its choosing (poisoning), keeping only candidates that pass the validator's
per-completion checks, re-proven with the real proof builder; each batch is signed and judged by
``verify_batch`` with one ``JudgeState`` per forger, so the per-worker flip history runs as in a
validator. Classes: strategy ``answer`` (flip the answer tokens and an early stop in) or
``reroll`` (one flip before the answer, honest sampling after it), budget ``greedy`` (every
completion it can, within the group's own flip bound) or ``stealthy`` (summed flips at most their
honest expectation). A group counts as a success when the validator accepts it and it holds a
completion steered to the chosen answer (whose honest version did not end there).

"ours" is the worst class's success rate (successes per group it steered, accepted or not);
"peer" the target, 1 in 1,000. The line before the headline gives the honest groups of the same
batches judged under the same pair: refused (target 0) and set aside. Honest refusals on the CPU
torch/torch pairs with the span rule: ``bench/cross_engine.py``.

A softer answer-span rule (a flip in the span let through when at most ``--span-depth`` noise levels
of the pair deep) is measured with forgers that adapt to it: they steer only with span flips that
shallow, and a group they steered counts as a success when the validator accepts it or sets it
aside for the answer span alone (every other check passed: what the softer rule would accept; for a
greedy forger an upper bound, since a group set aside does not enter the validator's flip history).
Every class also prints how many of its groups could be steered at each depth (``depth_needed``,
budgets aside): one run gives the forgers' reach against every depth, and ``--depths-only`` prints
only that, without judging; its headline's rate is then the share of groups steerable under the
rule, a bound on the successes (a group no candidate steers is no success).

    .venv/bin/python bench/steering.py [--quick] [--groups 96] [--model DIR] [--threads 2]
                                       [--span-depth LEVELS] [--depths-only]

The last line is ``steering: ours=<success rate> peer=0.0010 ratio=<ours/peer> target=<=0.001 ok|short``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cross_engine import DEPTH_LEVELS  # noqa: E402
from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.tiny import ensure_tiny_model  # noqa: E402
from intellect_node.node.roles.inference.builder import build_batch  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.validation import GroupResult, RunContext, verify_batch  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402
from intellect_node.protocol import codec  # noqa: E402
from intellect_node.protocol.rollout_shape import RolloutShape  # noqa: E402
from intellect_node.protocol.rollouts import RolloutBatch  # noqa: E402
from intellect_node.protocol.run_spec import build_run_spec  # noqa: E402
from intellect_node.protocol.verdicts import INCONCLUSIVE  # noqa: E402
from tests.support.steering import SteeringForger, loosest_pair, wrong_answer  # noqa: E402

RUN = "bench-steering"
MANIFEST = bytes(range(32))
TARGET = 0.001


class Bench:
    """The model, the run and its spec, one validator engine and one forger engine."""

    def __init__(self, model: Path, settings: RolloutShape) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.tasks = generate_toy_tasks(seed=5, count=2000)
        self.answers = {t.problem_id: t.verification_info["answer"] for t in self.tasks}
        self.settings = settings
        self.pair = loosest_pair()
        self.spec = build_run_spec(run_id=RUN, authority="spec", tasks=self.tasks, settings=settings,
                                   async_window=2, engines=(self.pair,))
        self.run = RunContext(self.spec, self.tasks)
        self.validator = TorchEngine.from_checkpoint(model, max_batch_rows=64)
        self.worker = TorchEngine.from_checkpoint(model, max_batch_rows=64)

    def honest(self, worker: Identity, first: int) -> RolloutBatch:
        return build_batch(self.worker, self.tokenizer, self.tasks, run_id=RUN, worker=worker.peer_id, step=0,
                           manifest_hash=MANIFEST, first_counter=first, settings=self.settings).batch

    def judge(self, batch: RolloutBatch, worker: Identity, state: JudgeState):
        signed = codec.decode(codec.encode(batch, worker, lifetime_s=600), RolloutBatch)
        return verify_batch(signed, engine=self.validator, tokenizer=self.tokenizer, run=self.run,
                            checkpoint_step_of=lambda h: 0 if h == MANIFEST else None, newest_step=0, state=state)


def passes_softer_rule(result: GroupResult, span_depth: float) -> bool:
    """Accepted, or (a softer rule being measured) set aside for the answer span alone: every
    other check passed, and the forger's span flips are within the depth it adapted to."""
    return result.reason is None or (span_depth > 0 and result.reason == INCONCLUSIVE
                                     and "final answer span" in result.detail)


def run_class(bench: Bench, strategy: str, answer_kind: str, budget: str, groups: int, honest_tally: Counter,
              naive: bool, span_depth: float, judging: bool) -> Counter:
    """One forger class over ``groups`` groups: its tally (``needed:K``: groups it could steer at a
    depth of K noise levels), and the same honest groups judged (added to ``honest_tally``). A
    naive forger ignores the answer-span rule: a group of its set aside there is no success at any depth."""
    span_depth = 0.0 if naive else span_depth
    worker = Identity.generate()
    forger = SteeringForger(bench.worker, bench.tokenizer, bench.spec, bench.pair, worker.peer_id,
                            strategy=strategy, budget=budget, knows_span_rule=not naive, span_depth=span_depth)
    choose = (lambda task_id: bench.answers[task_id]) if answer_kind == "right" else (
        lambda task_id: wrong_answer(bench.answers[task_id]))
    state, honest_state, tally = JudgeState(), JudgeState(), Counter()
    for first in range(0, groups, bench.settings.groups_per_batch):
        honest = bench.honest(worker, first)
        if judging:
            for group in bench.judge(honest, worker, honest_state).groups:
                honest_tally["groups"] += 1
                honest_tally[group.reason or "accepted"] += 1
        steered, report = forger.steer(honest, choose)
        verdicts = bench.judge(steered, worker, state).groups if judging else [None] * len(report)
        for summary, result in zip(report, verdicts, strict=True):
            tally["groups"] += 1
            tally["could"] += summary.could > 0
            tally["forged"] += summary.forged > 0
            tally["flips"] += summary.flips
            tally["expected_x1000"] += round(1000 * summary.expected)
            tally["reach"] += summary.depth_needed <= span_depth
            for level in DEPTH_LEVELS:
                tally[f"needed:{level}"] += summary.depth_needed <= level * bench.pair.margin_noise
            honest_tally["span_groups"] += 1
            honest_tally["span_chance_x1e6"] += round(1e6 * -math.expm1(-summary.honest_span_expected))
            if summary.forged and result is not None:
                tally[f"forged:{result.reason or 'accepted'}"] += 1
                tally["success"] += passes_softer_rule(result, span_depth)
                if not passes_softer_rule(result, span_depth) and result.reason != INCONCLUSIVE \
                        and "caught_at" not in tally:
                    tally["caught_at"] = tally["groups"]
                    print(f"  refused at group {tally['groups']}: {result.reason}: {result.detail}", flush=True)
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="under a minute: 8 groups of the answer strategy")
    parser.add_argument("--groups", type=int, default=96, help="groups per forger class")
    parser.add_argument("--model", type=Path, help="an HF-layout model [default: the demo's tiny model]")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--strategies", default="answer,reroll")
    parser.add_argument("--budgets", default="greedy,stealthy")
    parser.add_argument("--answers", default="right,wrong")
    parser.add_argument("--naive", action="store_true",
                        help="forgers that do not know the answer-span rule (they flip answer tokens too)")
    parser.add_argument("--span-depth", type=float, default=0.0,
                        help="a softer answer-span rule to measure: span flips this many noise levels deep pass")
    parser.add_argument("--depths-only", action="store_true",
                        help="only the depth each group needs to be steered, nothing judged (rates: a bound)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.quick:
        args.groups, args.strategies, args.budgets = 8, "answer", "greedy"
    model = args.model or ensure_tiny_model(Path(tempfile.gettempdir()) / "ina-bench-tiny")
    settings = RolloutShape(group_size=8, groups_per_batch=8, max_tokens=48)
    bench = Bench(model, settings)
    span_depth = args.span_depth * bench.pair.margin_noise
    print(f"answer-span rule: flips deeper than {args.span_depth:g} noise levels ({span_depth:.4g}) set a group "
          f"aside{'' if args.span_depth else ' (the validator rule: any flip)'}; "
          f"{'depths only, nothing judged' if args.depths_only else 'judged by verify_batch'}", flush=True)
    print(f"pair: slack {bench.pair.sampling_slack}, logprob {bench.pair.logprob_atol}, margin noise "
          f"{bench.pair.margin_noise}, TOPLOC {bench.pair.toploc_max_exp_mismatches}/"
          f"{bench.pair.toploc_max_mant_err_mean}/{bench.pair.toploc_max_mant_err_median}; groups of "
          f"{settings.group_size}, {settings.max_tokens} tokens, T={settings.temperature}, top-p {settings.top_p}",
          flush=True)
    started, worst, honest = time.perf_counter(), 0.0, Counter()
    for strategy in args.strategies.split(","):
        for answer_kind in args.answers.split(","):
            for budget in args.budgets.split(","):
                tally = run_class(bench, strategy, answer_kind, budget, args.groups, honest, args.naive,
                                  span_depth, judging=not args.depths_only)
                # without judging, the groups it could steer under the rule bound its successes
                rate = tally["reach" if args.depths_only else "success"] / max(1, tally["groups"])
                worst = max(worst, rate)
                outcomes = {k.split(":", 1)[1]: v for k, v in tally.items() if k.startswith("forged:")}
                needed = {level: tally[f"needed:{level}"] for level in DEPTH_LEVELS}
                got = (f"steerable under the rule {tally['reach']}" if args.depths_only
                       else f"success {tally['success']}")
                print(f"{strategy}/{answer_kind}/{budget}: {tally['groups']} groups, steerable {tally['could']}, "
                      f"steered {tally['forged']} {outcomes}, {got} ({rate:.4f}); flips "
                      f"{tally['flips']} where honest noise explains {tally['expected_x1000'] / 1000:.1f}; first "
                      f"refused at group {tally.get('caught_at', 'never')} ({time.perf_counter() - started:.0f} s)\n"
                      f"  groups steerable at a span-flip depth of <= K noise levels, budgets aside: {needed}",
                      flush=True)
    span_chance = honest.pop("span_chance_x1e6", 0) / 1e6 / max(1, honest.pop("span_groups", 0))
    refused = sum(v for k, v in honest.items() if k not in ("groups", "accepted", INCONCLUSIVE))
    print(f"honest groups of the same batches: {honest['groups']}, refused {refused}, set aside "
          f"{honest[INCONCLUSIVE]} {dict(honest)}; {time.perf_counter() - started:.0f} s, {args.threads} threads")
    print(f"an honest group's chance of a flip in an answer span under the pair's noise (the flip test's curve), "
          f"set aside by the answer-span rule where the pair's engines differ: {span_chance:.4f}")
    print(f"steering: ours={worst:.4f} peer={TARGET:.4f} ratio={worst / TARGET:.2f} target=<={TARGET:g} "
          f"{'ok' if worst <= TARGET and refused == 0 else 'short'}")


if __name__ == "__main__":
    main()
