"""Verification throughput against generation throughput, same model, same machine.

"peer" is what an inference worker does for a batch: ``intellect_node.node.roles.inference.builder.build_batch``
(token-by-token sampling with hidden-state capture, TOPLOC proofs, rewards), counted in
completions ("rows") per second. "ours" is what a validator does for the same batch:
``intellect_node.node.roles.validator.validation.verify_batch`` (assignment and prompt checks, one batched prefill, TOPLOC
verification, logprob and termination checks, rewards). Target: verification at least 10x faster
than generation, so a validator keeps up with ten workers.

The model is the tiny model's shape, untrained (unless ``--model``): an untrained model almost
never samples EOS, so completions run to their 128 tokens and both sides do the full work. Runs
alternate between the two and the median of each is reported (the machine is shared).

    .venv/bin/python bench/validate.py [--quick] [--model DIR] [--threads 2]

The last line is ``validate: ours=<rows/s> peer=<rows/s> ratio=<x> target=10 ok|short``.
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

from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.roles.inference.builder import RolloutSettings, build_batch  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402
from intellect_node.node.demo.tinymodel import TinyRecipe, ensure_tiny_model  # noqa: E402
from intellect_node.node.roles.validator.validation import verify_batch  # noqa: E402
from intellect_node.protocol import codec  # noqa: E402
from intellect_node.protocol.rollouts import RolloutBatch  # noqa: E402

TARGET = 10.0
RUN = "bench"
MANIFEST = bytes(range(32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller runs (< 1 minute)")
    parser.add_argument("--model", type=Path, help="HF-layout model dir (default: tiny shape, untrained)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both sides")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    groups, repeats = (1, 1) if args.quick else (8, 5)
    settings = RolloutSettings(group_size=8, groups_per_batch=groups, max_tokens=128)
    worker = Identity.generate()
    with tempfile.TemporaryDirectory(prefix="ina-bench-") as tmp:
        model_dir = args.model or ensure_tiny_model(Path(tmp) / "tiny", TinyRecipe(train_steps=0))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        generator = TorchEngine.from_checkpoint(model_dir, max_batch_rows=64)
        validator = TorchEngine.from_checkpoint(model_dir, max_batch_rows=64)
        tasks = generate_toy_tasks(seed=2024, count=500)
        print(f"model: {args.model or 'tiny model shape, untrained'}, hidden {generator.hidden_size}; "
              f"{groups} groups x 8 completions x <= 128 tokens; threads {args.threads}")
        verified_rates: list[float] = []
        generated_rates: list[float] = []
        for run in range(repeats + 1):  # run 0 warms both sides up and is not counted
            built = build_batch(generator, tokenizer, tasks, run_id=RUN, worker=worker.peer_id, step=0,
                                manifest_hash=MANIFEST, first_counter=run * groups, settings=settings)
            signed = codec.decode(codec.encode(built.batch, worker, lifetime_s=600), RolloutBatch)
            started = time.perf_counter()
            verdict = verify_batch(signed, engine=validator, tokenizer=tokenizer, tasks=tasks, run_id=RUN,
                                   checkpoint_step_of=lambda h: 0 if h == MANIFEST else None, newest_step=0,
                                   async_window=2, seen_counters={})
            seconds = time.perf_counter() - started
            if verdict.rejected:
                raise SystemExit(f"honest batch rejected: {[(g.reason, g.detail) for g in verdict.rejected]}")
            rows = sum(len(g.completions) for g in built.batch.groups)
            if run:
                generated_rates.append(rows / built.seconds)
                verified_rates.append(rows / seconds)
            print(f"run {run}: {rows} rows, {built.generated_tokens} tokens; generated in {built.seconds:.2f} s, "
                  f"verified in {seconds:.2f} s")
    ours, peer = statistics.median(verified_rates), statistics.median(generated_rates)
    ratio = ours / peer
    print(f"validate: ours={ours:.1f} peer={peer:.1f} ratio={ratio:.1f} target={TARGET:g} "
          f"{'ok' if ratio >= TARGET else 'short'}")


if __name__ == "__main__":
    main()
