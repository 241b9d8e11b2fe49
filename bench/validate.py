"""Verification throughput against generation throughput, same model, same machine.

"peer" is what an inference worker does for a batch: ``intellect_node.node.roles.inference.builder.build_batch``
(token-by-token sampling with hidden-state capture, TOPLOC proofs, rewards), counted in
completions ("rows") per second. "ours" is what a validator does for the same batch:
``intellect_node.node.roles.validator.validation.verify_batch`` (assignment and prompt checks, one batched prefill, TOPLOC
verification, logprob and termination checks, the sampling replay of every token, rewards), judged
by a run spec with the batch's settings. The replay's share is measured apart:
``protocol.sampling.margins`` alone on logits of the model's vocabulary for the batch's positions, and on random logits of a 150k
vocabulary (what a real model's head costs the replay per position). Target: verification at least 10x faster
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.engine.base import Engine  # noqa: E402
from intellect_node.node.roles.inference.builder import BuiltBatch, RolloutSettings, build_batch  # noqa: E402
from intellect_node.node.tasks.schema import Task  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402
from intellect_node.node.demo.tinymodel import TinyRecipe, ensure_tiny_model  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.validation import BatchVerdict, RunContext, verify_batch  # noqa: E402
from intellect_node.node.rollouts.run_spec import TORCH_TORCH, build_run_spec  # noqa: E402
from intellect_node.protocol import codec  # noqa: E402
from intellect_node.protocol.rollouts import RolloutBatch  # noqa: E402
from intellect_node.protocol.sampling import Replay, margins  # noqa: E402

TARGET = 10.0
RUN = "bench"
MANIFEST = bytes(range(32))
BIG_VOCAB = 150_000


def replay_cost(vocab: int, positions: int = 128) -> float:
    """Seconds per position of ``margins`` on [positions, vocab] float32 logits (random: the cost
    depends on the shape, not the values)."""
    logits = torch.randn(positions, vocab, generator=torch.Generator().manual_seed(0)) * 3
    tokens = logits.argmax(dim=-1)
    started = time.perf_counter()
    margins(logits, tokens, Replay(7, 1.0, 1.0, TORCH_TORCH.sampling_slack))
    return (time.perf_counter() - started) / positions


@dataclass(frozen=True)
class Judged:
    """One honest batch and its verdict, with both sides' wall and CPU seconds."""

    built: BuiltBatch
    verdict: BatchVerdict
    generate_cpu_s: float
    verify_s: float
    verify_cpu_s: float

    @property
    def rows(self) -> int:
        return sum(len(g.completions) for g in self.built.batch.groups)


def generate_and_judge(generator: Engine, validator: Engine, tokenizer: object, tasks: Sequence[Task], *,
                       run: RunContext, state: JudgeState, worker: Identity, settings: RolloutSettings,
                       first_counter: int) -> Judged:
    """What a worker and a validator do for one batch: ``build_batch`` (sampling, capture, proofs,
    rewards), the signed envelope's round trip, then ``verify_batch`` on the validator's engine
    (bench/real_model.py judges the real model with it too)."""
    cpu_started = time.process_time()
    built = build_batch(generator, tokenizer, tasks, run_id=RUN, worker=worker.peer_id, step=0,
                        manifest_hash=MANIFEST, first_counter=first_counter, settings=settings)
    generate_cpu_s = time.process_time() - cpu_started
    signed = codec.decode(codec.encode(built.batch, worker, lifetime_s=600), RolloutBatch)
    started, cpu_started = time.perf_counter(), time.process_time()
    verdict = verify_batch(signed, engine=validator, tokenizer=tokenizer, run=run,
                           checkpoint_step_of=lambda h: 0 if h == MANIFEST else None, newest_step=0, state=state)
    return Judged(built, verdict, generate_cpu_s, time.perf_counter() - started, time.process_time() - cpu_started)


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
        run_context = RunContext(build_run_spec(run_id=RUN, authority=worker.peer_id, tasks=tasks, settings=settings,
                                                async_window=2), tasks)
        state = JudgeState()
        replay_shares: list[float] = []
        print(f"model: {args.model or 'tiny model shape, untrained'}, hidden {generator.hidden_size}; "
              f"{groups} groups x 8 completions x <= 128 tokens; threads {args.threads}")
        verified_rates: list[float] = []
        generated_rates: list[float] = []
        for run in range(repeats + 1):  # run 0 warms both sides up and is not counted
            judged = generate_and_judge(generator, validator, tokenizer, tasks, run=run_context, state=state,
                                        worker=worker, settings=settings, first_counter=run * groups)
            built, seconds, rows = judged.built, judged.verify_s, judged.rows
            replay = replay_cost(validator.vocab_size) * built.generated_tokens
            if judged.verdict.rejected:
                raise SystemExit(f"honest batch rejected: {[(g.reason, g.detail) for g in judged.verdict.rejected]}")
            if run:
                generated_rates.append(rows / built.seconds)
                verified_rates.append(rows / seconds)
                replay_shares.append(replay / seconds)
            print(f"run {run}: {rows} rows, {built.generated_tokens} tokens; generated in {built.seconds:.2f} s, "
                  f"verified in {seconds:.2f} s (replay about {replay:.3f} s)")
        per_position = replay_cost(BIG_VOCAB)
    print(f"replay share of validation time: {statistics.median(replay_shares):.1%}; at a {BIG_VOCAB} vocabulary "
          f"the replay costs {per_position * 1e3:.2f} ms per position ({per_position * 128 * 8 * groups:.1f} s for "
          f"this batch's {128 * 8 * groups} positions)")
    ours, peer = statistics.median(verified_rates), statistics.median(generated_rates)
    ratio = ours / peer
    print(f"validate: ours={ours:.1f} peer={peer:.1f} ratio={ratio:.1f} target={TARGET:g} "
          f"{'ok' if ratio >= TARGET else 'short'}")


if __name__ == "__main__":
    main()
