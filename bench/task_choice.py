"""Does choosing one's tasks pay? Accepted reward of honest work against four task-choosing cheats (issue 30).

A worker's task at (run, worker key, policy step, counter) is public before any work
(``protocol.assignment.task_index``) and keys are free, so a cheater can look at tasks before it
decodes anything. Every strategy here gets the same compute budget, ``--groups`` groups generated
by the real rollout builder (``build_batch`` on a ``TorchEngine``), and every batch it delivers is
signed, round-tripped through the codec and judged by the real judge: ``verify_batch`` on a
validator ``TorchEngine`` with one ``JudgeState``, then the validator service's
``without_cheating_batch``; a worker with a proven cheat is banned for the run (what
``protocol.verdicts.PROVEN_CHEATS`` means: its later batches are dropped unjudged).

The cheater knows which tasks it can solve: before anything else it decodes every task of the
list greedily (its own model, the run's smallest length target) and calls "solvable" the ones it
gets right. Strategies:

- ``honest``: one key, counters 0, 1, 2 ... of the newest step, batches of 4 groups, all delivered;
- ``grind``: fresh keys until one's counter-0 task (newest step) is solvable; one group per key;
- ``select``: a fresh key per group, counter 0; a group is delivered only if some completion scored
  (mixed or high rewards), the others are thrown away (an unused key stalls nothing);
- ``shop``: one key; for each group, the first step of the async window (newest, newest-1,
  newest-2) whose next dense counter's task is solvable (the newest when none is);
- ``burn``: fresh keys until counter 1's task is solvable, then a junk counter 0 (the good
  group's completions under counter 0's prompt: costs no decoding) and the good counter 1 in
  one batch;
- ``burn-split``: the same, the junk in one batch and the good group in the next.

The window's three checkpoints carry the same weights (only their manifest hashes differ), so
stepping between them changes the task and nothing else. Reported per strategy: groups generated
(the work), delivered and accepted, and the mean task reward (a group's mean over its
completions, as the validator recomputed it) per accepted group and per group of work.

Noise margin: a group's reward is a sample mean over its completions and tasks differ in
difficulty, so both means carry sampling noise. A cheat counts as gaining only when its mean
exceeds honest's by more than two standard errors of the difference (from the per-group rewards
of both sides), i.e. ``ok`` while ratio <= 1 + 2 * sqrt(se_cheat**2 + se_honest**2) / honest: equal
strategies read ``short`` about 2.5% of the time.

    .venv/bin/python bench/task_choice.py [--quick] [--groups N] [--model DIR] [--threads 2]

Default model: the demo's tiny model (``intellect-node demo``'s cache; built once, about two and a
half minutes) and the demo's tasks (``DEMO_TASKS``, 4000 reversals). ``--quick``: a small model of
the same recipe trained for a few seconds (greedy reversal about 0.2-0.35) and the first 500
tasks. The last line is
``task_choice: ours=<worst cheat's reward per accepted group> peer=<honest's> ratio=<x> target=1.0 ok|short``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.demo.swarm import DEMO_TASKS, DemoOptions  # noqa: E402
from intellect_node.node.demo.tinymodel import TinyRecipe, ensure_tiny_model  # noqa: E402
from intellect_node.node.engine.base import SamplingParams, encode_prompt  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.roles.inference.builder import RolloutSettings, build_batch  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.service import without_cheating_batch  # noqa: E402
from intellect_node.node.roles.validator.validation import BatchVerdict, RunContext, verify_batch  # noqa: E402
from intellect_node.protocol.run_spec import build_run_spec  # noqa: E402
from intellect_node.node.tasks.schema import Task, with_length_target  # noqa: E402
from intellect_node.node.tasks.spec import load_task_spec  # noqa: E402
from intellect_node.node.tasks.verify import task_reward  # noqa: E402
from intellect_node.protocol import codec  # noqa: E402
from intellect_node.protocol.assignment import length_target, task_index  # noqa: E402
from intellect_node.protocol.rollouts import RolloutBatch, RolloutGroup, pack_tokens  # noqa: E402
from intellect_node.protocol.verdicts import PROVEN_CHEATS  # noqa: E402

TARGET = 1.0
RUN = "bench-task-choice"
NEWEST = 2  # policy steps 0, 1, 2: the async window (2) of the newest
WINDOW = 2
MANIFESTS = {step: bytes([step]) * 32 for step in range(NEWEST - WINDOW, NEWEST + 1)}
SETTINGS = RolloutSettings(group_size=8, groups_per_batch=4, max_tokens=16)  # reversal answers: <= 6 digits and EOS
QUICK_RECIPE = TinyRecipe(hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2,
                          train_steps=150, batch_size=16, lr=3e-3, kinds=("reverse",))
STRATEGIES = ("honest", "grind", "select", "shop", "burn", "burn-split")


@dataclass
class Tally:
    """What one strategy did and what the judge paid for it."""

    work: int = 0  # groups generated by decoding
    delivered: int = 0
    keys: int = 0  # keys generated (grinding)
    accepted: list[float] = field(default_factory=list)  # accepted groups' mean task reward
    rejections: dict[str, int] = field(default_factory=dict)

    def per_accepted(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0

    def per_work(self) -> float:
        return sum(self.accepted) / self.work if self.work else 0.0

    def stderr(self) -> float:
        """Standard error of ``per_accepted``."""
        n = len(self.accepted)
        return statistics.stdev(self.accepted) / math.sqrt(n) if n > 1 else float("inf")


class Judge:
    """One validator: the real ``verify_batch`` with a persistent ``JudgeState``, the service's
    ``without_cheating_batch``, and the ban that a proven cheat earns."""

    def __init__(self, engine: TorchEngine, tokenizer: object, run: RunContext) -> None:
        self.engine, self.tokenizer, self.run = engine, tokenizer, run
        self.state = JudgeState()
        self.banned: set[str] = set()

    def judge(self, batch: RolloutBatch, worker: Identity, tally: Tally) -> BatchVerdict | None:
        tally.delivered += len(batch.groups)
        if worker.peer_id in self.banned:
            tally.rejections["banned_worker"] = tally.rejections.get("banned_worker", 0) + len(batch.groups)
            return None
        signed = codec.decode(codec.encode(batch, worker, lifetime_s=600), RolloutBatch)
        step_of = {h: s for s, h in MANIFESTS.items()}.get
        verdict = without_cheating_batch(verify_batch(
            signed, engine=self.engine, tokenizer=self.tokenizer, run=self.run, checkpoint_step_of=step_of,
            newest_step=NEWEST, state=self.state))
        if any(g.reason in PROVEN_CHEATS for g in verdict.groups):
            self.banned.add(worker.peer_id)
        for g in verdict.groups:
            if g.reason is None:
                tally.accepted.append(sum(g.rewards) / len(g.rewards))
            else:
                tally.rejections[g.reason] = tally.rejections.get(g.reason, 0) + 1
        return verdict


class Sim:
    """The run's world: tasks, the worker's engine, the judge, and the cheater's knowledge."""

    def __init__(self, model_dir: Path, tasks: Sequence[Task]) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tasks = list(tasks)
        self.generator = TorchEngine.from_checkpoint(model_dir, max_batch_rows=64)
        validator = TorchEngine.from_checkpoint(model_dir, max_batch_rows=64)
        authority = Identity.generate()
        spec = build_run_spec(run_id=RUN, authority=authority.peer_id, tasks=self.tasks, settings=SETTINGS,
                              async_window=WINDOW)
        self.judge = Judge(validator, self.tokenizer, RunContext(spec, self.tasks))
        self.solvable = self.greedy_solvable()

    def greedy_solvable(self) -> list[bool]:
        """The cheater's pre-run: which tasks its greedy decoding solves."""
        target = min(SETTINGS.length_targets)
        prompts = [encode_prompt(self.tokenizer, with_length_target(t, target).prompt) for t in self.tasks]
        outputs = self.generator.generate(prompts, 1, SamplingParams(temperature=0.0, max_tokens=SETTINGS.max_tokens),
                                          capture_hidden=False)
        return [task_reward(t, self.tokenizer.decode(c.token_ids, skip_special_tokens=True)) > 0
                for t, (c,) in zip(self.tasks, outputs)]

    def task_of(self, worker: Identity, step: int, counter: int) -> int:
        return task_index(RUN, worker.peer_id, step, counter, len(self.tasks))

    def build(self, worker: Identity, step: int, first_counter: int, groups: int, tally: Tally) -> RolloutBatch:
        tally.work += groups
        return build_batch(self.generator, self.tokenizer, self.tasks, run_id=RUN, worker=worker.peer_id, step=step,
                           manifest_hash=MANIFESTS[step], first_counter=first_counter,
                           settings=dataclasses.replace(SETTINGS, groups_per_batch=groups)).batch

    def grind(self, tally: Tally, good: Callable[[Identity], bool]) -> Identity:
        while True:
            key = Identity.generate()
            tally.keys += 1
            if good(key):
                return key

    def junk(self, good: RolloutGroup, worker: Identity, counter: int) -> RolloutGroup:
        """Counter ``counter``'s group made without decoding: its assigned task, length target and
        prompt, with another group's completions."""
        task = self.tasks[self.task_of(worker, NEWEST, counter)]
        target = length_target(RUN, worker.peer_id, NEWEST, counter, SETTINGS.length_targets)
        prompt = encode_prompt(self.tokenizer, with_length_target(task, target).prompt)
        return dataclasses.replace(good, counter=counter, task_id=task.problem_id, length_target=target,
                                   prompt_ids=pack_tokens(prompt))

    def run(self, strategy: str, budget: int) -> Tally:
        tally, judge = Tally(), self.judge
        if strategy == "honest":
            worker = Identity.generate()
            for first in range(0, budget, SETTINGS.groups_per_batch):
                batch = self.build(worker, NEWEST, first, min(SETTINGS.groups_per_batch, budget - first), tally)
                judge.judge(batch, worker, tally)
        elif strategy == "grind":
            while tally.work < budget:
                key = self.grind(tally, lambda k: self.solvable[self.task_of(k, NEWEST, 0)])
                judge.judge(self.build(key, NEWEST, 0, 1, tally), key, tally)
        elif strategy == "select":
            while tally.work < budget:
                key = Identity.generate()
                batch = self.build(key, NEWEST, 0, 1, tally)
                if any(c.reward > 0 for c in batch.groups[0].completions):
                    judge.judge(batch, key, tally)
        elif strategy == "shop":
            worker = Identity.generate()
            steps = range(NEWEST, NEWEST - WINDOW - 1, -1)
            while tally.work < budget:
                step = next((s for s in steps
                             if self.solvable[self.task_of(worker, s, judge.state.expected(worker.peer_id, s))]),
                            NEWEST)
                batch = self.build(worker, step, judge.state.expected(worker.peer_id, step), 1, tally)
                judge.judge(batch, worker, tally)
        elif strategy in ("burn", "burn-split"):
            while tally.work < budget:
                key = self.grind(tally, lambda k: self.solvable[self.task_of(k, NEWEST, 1)])
                good = self.build(key, NEWEST, 1, 1, tally)
                junk = dataclasses.replace(good, groups=(self.junk(good.groups[0], key, 0),))
                if strategy == "burn":
                    judge.judge(dataclasses.replace(good, groups=junk.groups + good.groups), key, tally)
                else:
                    judge.judge(junk, key, tally)
                    judge.judge(good, key, tally)
        else:
            raise ValueError(strategy)
        return tally


def noise_margin(cheat: Tally, honest: Tally) -> float:
    """Two standard errors of the difference of the two means, as a share of honest's mean: the
    ratio a cheat may reach by sampling noise alone (one-sided, about 2.5% of the time)."""
    if honest.per_accepted() <= 0:
        return 0.0
    errors = [t.stderr() if len(t.accepted) > 1 else 0.0 for t in (cheat, honest)]
    return 2 * math.sqrt(sum(e * e for e in errors)) / honest.per_accepted()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few-second model, fewer groups (< 1 minute)")
    parser.add_argument("--groups", type=int, help="groups generated per strategy [quick 48, full 400]")
    parser.add_argument("--model", type=Path, help="HF-layout model dir [the demo's tiny model; quick: a small one]")
    parser.add_argument("--tasks", help=f"task spec [{DEMO_TASKS}; quick: its first 500]")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help=f"comma-separated, of {STRATEGIES}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if "honest" not in strategies or any(s not in STRATEGIES for s in strategies):
        parser.error(f"--strategies: honest and any of {STRATEGIES}")
    budget = args.groups or (48 if args.quick else 400)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ina-bench-") as tmp:
        if args.model:
            model_dir = args.model
        elif args.quick:
            model_dir = ensure_tiny_model(Path(tmp) / "tiny", QUICK_RECIPE)
        else:
            model_dir = ensure_tiny_model(DemoOptions().model_cache)
        tasks = load_task_spec(args.tasks or DEMO_TASKS)
        if args.quick and not args.tasks:
            tasks = tasks[:500]
        sim = Sim(model_dir, tasks)
        solvable = sum(sim.solvable) / len(sim.solvable)
        print(f"model: {args.model or ('quick tiny recipe' if args.quick else model_dir)}; {len(tasks)} tasks, "
              f"greedy solves {solvable:.3f}; {budget} groups x {SETTINGS.group_size} completions x <= "
              f"{SETTINGS.max_tokens} tokens per strategy; ready in {time.perf_counter() - started:.0f} s", flush=True)
        tallies: dict[str, Tally] = {}
        for name in strategies:
            t0 = time.perf_counter()
            tallies[name] = sim.run(name, budget)
            print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    honest = tallies["honest"]
    print(f"\n{'strategy':11} {'work':>5} {'keys':>5} {'deliv':>5} {'accept':>6} {'reward/accepted':>16} "
          f"{'reward/work':>11} {'ratio':>6}  rejections")
    for name, t in tallies.items():
        ratio = t.per_accepted() / honest.per_accepted() if honest.per_accepted() else float("inf")
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(t.rejections.items())) or "-"
        print(f"{name:11} {t.work:5d} {t.keys:5d} {t.delivered:5d} {len(t.accepted):6d} "
              f"{t.per_accepted():9.3f} ±{t.stderr() if len(t.accepted) > 1 else 0:.3f} {t.per_work():11.3f} "
              f"{ratio:6.2f}  {rejected}")
    print("(reward: a group's mean task reward over its completions as the validator recomputed it; ± one "
          "standard error; ratio: reward per accepted group over honest's; keys: keys generated while grinding)")
    cheats = {name: t for name, t in tallies.items() if name != "honest"}
    if not cheats:
        print("task_choice: needs at least one cheat")
        return
    worst = max(cheats, key=lambda name: cheats[name].per_accepted())
    peer = honest.per_accepted()
    ours = cheats[worst].per_accepted()
    ratio = ours / peer if peer > 0 else (1.0 if ours <= 0 else float("inf"))
    margin = noise_margin(cheats[worst], honest)
    print(f"worst cheat: {worst}; noise margin (two standard errors of the difference, over honest's mean) {margin:.3f}")
    print(f"task_choice: ours={ours:.3f} peer={peer:.3f} ratio={ratio:.2f} target={TARGET:g} "
          f"{'ok' if ratio <= TARGET + margin else 'short'}")


if __name__ == "__main__":
    main()
