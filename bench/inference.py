"""Torch engine throughput on the tiny model, with and without TOPLOC proof capture.

"peer" is the engine generating with hidden-state capture switched off: what an inference node
that proves nothing would get. "ours" is the same generation with the final hidden states
captured and TOPLOC proofs built for every completion (``intellect_node.crypto.toploc.build_proofs`` through
``intellect_node.node.engine.proofs.build_completion_proofs``, which batches the calls; chunks of 32 tokens,
top-k 128). Throughput counts generated tokens per second of wall time, including proof
building. Target: proofs cost at most 5% (ratio >= 0.95).

The headline figures are tokens per second of this process's CPU time, with one torch thread
(the default): on an idle core that equals wall-clock tokens per second, and unlike wall time it
barely moves when other jobs share the machine (on the 2-core development machine, wall-clock
rates of identical runs varied by 2x under other load). Wall-clock medians are printed as well.

Stop tokens are switched off so that every completion has exactly ``max_tokens`` tokens. The
weights therefore do not change the work done; unless ``--model`` is given, the bench builds an
untrained model of the tiny model's shape (the trained one takes two minutes to build).
Runs alternate between the two modes and the median of each is reported, which evens out the
other load on a shared machine.

    .venv/bin/python bench/inference.py [--quick] [--model DIR] [--threads 1]

The last line is ``inference: ours=<tok/s> peer=<tok/s> ratio=<x> target=0.95 ok|short``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.engine.base import SamplingParams, encode_prompt  # noqa: E402
from intellect_node.node.engine.proofs import build_completion_proofs  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.tiny import TinyRecipe, ensure_tiny_model  # noqa: E402
from intellect_node.node.tasks.schema import with_length_target  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402

TARGET = 0.95


def run_once(
    engine: TorchEngine, prompts: list[list[int]], n: int, params: SamplingParams, prove: bool
) -> tuple[float, float, int, int]:
    """One generation (plus proofs when ``prove``): (wall s, CPU s, tokens, proofs built)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    groups = engine.generate(prompts, n=n, params=params, capture_hidden=prove)
    completions = [c for group in groups for c in group]
    proofs = 0
    if prove:
        hidden = [c.hidden_states for c in completions if c.hidden_states is not None]
        proofs = sum(len(p) for p in build_completion_proofs(hidden))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return elapsed, cpu, sum(len(c.token_ids) for c in completions), proofs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs (< 1 minute)")
    parser.add_argument("--model", type=Path, help="HF-layout model dir (default: tiny shape)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the tiny model's decode loop "
        "is bound by Python overhead, and a second thread only adds contention)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    prompts_count, n = 16, 4  # 64 completions per generate call, the engine's batch
    max_tokens, repeats = (64, 7) if args.quick else (128, 11)
    with tempfile.TemporaryDirectory(prefix="ina-bench-") as tmp:
        if args.model is not None:
            model_dir = args.model
            origin = str(model_dir)
        else:
            model_dir = ensure_tiny_model(Path(tmp) / "tiny", TinyRecipe(train_steps=0))
            origin = "tiny model shape, untrained"
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        engine = TorchEngine.from_checkpoint(model_dir, max_batch_rows=prompts_count * n)
        tasks = generate_toy_tasks(seed=2024, count=prompts_count)
        prompts = [
            encode_prompt(tokenizer, with_length_target(t, 64).prompt) for t in tasks
        ]
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, stop_token_ids=(), seed=1)
        params_count = sum(p.numel() for p in engine.model.parameters())
        print(
            f"model: {origin}, {params_count / 1e6:.2f}M params, hidden {engine.hidden_size}; "
            f"{prompts_count} prompts x n={n} x {max_tokens} tokens; threads {args.threads}"
        )
        if args.threads != 1:
            print("note: with several threads, CPU-time rates are per CPU second, not wall second")
        run_once(engine, prompts, n, params, prove=True)  # warm-up: allocator, kernels, caches
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu_rates: dict[bool, list[float]] = {False: [], True: []}
        proof_counts = 0
        for _ in range(repeats):
            for prove in (False, True):
                elapsed, cpu, tokens, proofs = run_once(engine, prompts, n, params, prove)
                rates[prove].append(tokens / elapsed)
                cpu_rates[prove].append(tokens / cpu)
                proof_counts = proofs or proof_counts
        peer, ours = (statistics.median(rates[k]) for k in (False, True))
        cpu_peer, cpu_ours = (statistics.median(cpu_rates[k]) for k in (False, True))
        print(f"peer runs, wall (tok/s): {', '.join(f'{r:.0f}' for r in rates[False])}")
        print(f"ours runs, wall (tok/s): {', '.join(f'{r:.0f}' for r in rates[True])}")
        print(f"wall clock medians: ours={ours:.0f} peer={peer:.0f} ratio={ours / peer:.3f}")
        print(f"CPU time medians: ours={cpu_ours:.0f} peer={cpu_peer:.0f} tokens per CPU second")
        print(f"proofs per run: {proof_counts} (hidden-state capture + crypto.toploc.build_proofs)")
    ratio = cpu_ours / cpu_peer
    verdict = "ok" if ratio >= TARGET else "short"
    print(
        f"inference: ours={cpu_ours:.0f} peer={cpu_peer:.0f} ratio={ratio:.3f} "
        f"target={TARGET} {verdict}"
    )


if __name__ == "__main__":
    main()
