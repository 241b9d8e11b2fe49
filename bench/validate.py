"""Verification throughput against generation throughput, same model, same machine.

"peer" is what an inference worker does for a batch: ``intellect_node.node.roles.inference.builder.build_batch``
(token-by-token sampling with hidden-state capture, TOPLOC proofs, rewards), counted in
completions ("rows") per second. "ours" is what a validator does for the same batch:
``intellect_node.node.roles.validator.validation.verify_batch`` (assignment and prompt checks, one batched \
prefill, TOPLOC
verification, logprob and termination checks, the sampling replay of every token, rewards), judged
by a run spec with the batch's settings. The replay's share is measured apart:
``protocol.sampling.margins`` alone on logits of the model's vocabulary for the batch's positions, and on \
random logits of a 150k
vocabulary (what a real model's head costs the replay per position). Target: verification at least 10x faster
than generation, so a validator keeps up with ten workers.

The model is the tiny model's shape, untrained (unless ``--model``): an untrained model almost
never samples EOS, so completions run to their 128 tokens and both sides do the full work. Runs
alternate between the two and the median of each is reported (the machine is shared).

    .venv/bin/python bench/validate.py [--quick] [--model DIR] [--threads 2] [--device cuda] [--validator-device cpu]

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
from intellect_node.crypto.toploc import Thresholds, verify_proofs  # noqa: E402
from intellect_node.node.engine.base import Engine, PrefillResult  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.tiny import TinyRecipe, ensure_tiny_model  # noqa: E402
from intellect_node.node.roles.inference.builder import BuiltBatch, build_batch  # noqa: E402
from intellect_node.node.roles.validator.ledger import JudgeState  # noqa: E402
from intellect_node.node.roles.validator.validation import BatchVerdict, RunContext, verify_batch  # noqa: E402
from intellect_node.node.tasks.schema import Task  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402
from intellect_node.protocol import codec  # noqa: E402
from intellect_node.protocol.rollout_shape import RolloutShape  # noqa: E402
from intellect_node.protocol.rollouts import RolloutBatch, proof_key, unpack_tokens  # noqa: E402
from intellect_node.protocol.run_spec import (  # noqa: E402
    TORCH_TORCH,
    EnginePair,  # noqa: E402
    build_run_spec,
)
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


def build(generator: Engine, tokenizer: object, tasks: Sequence[Task], *, worker: Identity,
          settings: RolloutShape, first_counter: int) -> tuple[BuiltBatch, float]:
    """What a worker does for one batch: ``build_batch`` (sampling, capture, proofs, rewards);
    the batch and the CPU seconds it took."""
    cpu_started = time.process_time()
    built = build_batch(generator, tokenizer, tasks, run_id=RUN, worker=worker.peer_id, step=0,
                        manifest_hash=MANIFEST, first_counter=first_counter, settings=settings)
    return built, time.process_time() - cpu_started


def judge(built: BuiltBatch, generate_cpu_s: float, validator: Engine, tokenizer: object, *, run: RunContext,
          state: JudgeState, worker: Identity) -> Judged:
    """What a validator does for a built batch: the signed envelope's round trip, then
    ``verify_batch`` on the validator's engine (a batch judged twice needs a ``state`` per judge:
    a judge refuses counters it has seen)."""
    signed = codec.decode(codec.encode(built.batch, worker, lifetime_s=600), RolloutBatch)
    started, cpu_started = time.perf_counter(), time.process_time()
    verdict = verify_batch(signed, engine=validator, tokenizer=tokenizer, run=run,
                           checkpoint_step_of=lambda h: 0 if h == MANIFEST else None, newest_step=0, state=state)
    return Judged(built, verdict, generate_cpu_s, time.perf_counter() - started, time.process_time() - cpu_started)


def generate_and_judge(generator: Engine, validator: Engine, tokenizer: object, tasks: Sequence[Task], *,
                       run: RunContext, state: JudgeState, worker: Identity, settings: RolloutShape,
                       first_counter: int) -> Judged:
    """What a worker and a validator do for one batch: ``build`` then ``judge`` (bench/real_model.py
    judges the real model with them too)."""
    built, generate_cpu_s = build(generator, tokenizer, tasks, worker=worker, settings=settings,
                                  first_counter=first_counter)
    return judge(built, generate_cpu_s, validator, tokenizer, run=run, state=state, worker=worker)


class Recording:
    """A validator's engine whose prefill results are kept: ``verify_batch`` reports the sampling
    margin and the logprob error it saw, but of TOPLOC only pass or fail, so ``toploc_figures``
    re-reads the proofs against the hidden states the validator recomputed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: list[tuple[Sequence[int], Sequence[int], PrefillResult]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    def prefill(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                replays: Sequence[Replay] | None = None) -> list[PrefillResult]:
        results = self.engine.prefill(prompts, completions, replays)
        self.seen.extend(zip(prompts, completions, results, strict=True))
        return results


@dataclass
class Figures:
    """The worst of what the completion checks measured, against the run's limits (``pair``):
    TOPLOC's exponent mismatches and mantissa errors per chunk (largest), the logprob error
    (largest) and the sampling margin (smallest: accepted while >= -slack)."""

    chunks: int = 0
    exp_mismatches: int = 0
    mant_err_mean: float = 0.0
    mant_err_median: float = 0.0
    logprob_error: float = 0.0
    sampling_margin: float = float("inf")

    def add(self, judged: Judged, recorded: Recording, pair: EnginePair) -> None:
        """Fold in one judged batch (``recorded``: the engine that judged it; its record is emptied)."""
        batch = judged.built.batch
        proofs = {(tuple(unpack_tokens(g.prompt_ids).tolist()), tuple(unpack_tokens(c.token_ids).tolist())):
                  (c.proofs, proof_key(batch.manifest_hash, batch.policy_step, g.prompt_ids, c.token_ids))
                  for g in batch.groups for c in g.completions}
        limits = Thresholds(max_exp_mismatches=pair.toploc_max_exp_mismatches,
                            max_mant_err_mean=pair.toploc_max_mant_err_mean,
                            max_mant_err_median=pair.toploc_max_mant_err_median)
        for prompt, completion, again in recorded.seen:
            claimed, key = proofs[tuple(prompt), tuple(completion)]
            for v in verify_proofs(again.hidden_states, list(claimed), key=key, thresholds=limits):
                self.chunks += 1
                self.exp_mismatches = max(self.exp_mismatches, v.exp_mismatches)
                self.mant_err_mean = max(self.mant_err_mean, v.mant_err_mean)
                self.mant_err_median = max(self.mant_err_median, v.mant_err_median)
        recorded.seen.clear()
        for g in judged.verdict.accepted:
            if g.max_logprob_error is not None:
                self.logprob_error = max(self.logprob_error, g.max_logprob_error)
            if g.min_sampling_margin is not None:
                self.sampling_margin = min(self.sampling_margin, g.min_sampling_margin)

    def report(self, pair: EnginePair) -> str:
        return (f"TOPLOC over {self.chunks} chunks: exponent mismatches {self.exp_mismatches} "
                f"(limit {pair.toploc_max_exp_mismatches}), mantissa error mean {self.mant_err_mean:.3g} "
                f"(limit {pair.toploc_max_mant_err_mean:g}), median {self.mant_err_median:.3g} "
                f"(limit {pair.toploc_max_mant_err_median:g}); logprob error {self.logprob_error:.3g} "
                f"(limit {pair.logprob_atol:g}); sampling margin {self.sampling_margin:.3g} "
                f"(limit -{pair.sampling_slack:g})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller runs (< 1 minute)")
    parser.add_argument("--model", type=Path, help="HF-layout model dir (default: tiny shape, untrained)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both sides")
    parser.add_argument("--device", default="cpu", help="the worker's engine (cpu, cuda, ...)")
    parser.add_argument("--validator-device", default="cpu", help="the validator's engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    groups, repeats = (1, 1) if args.quick else (8, 5)
    settings = RolloutShape(group_size=8, groups_per_batch=groups, max_tokens=128)
    worker = Identity.generate()
    with tempfile.TemporaryDirectory(prefix="ina-bench-") as tmp:
        model_dir = args.model or ensure_tiny_model(Path(tmp) / "tiny", TinyRecipe(train_steps=0))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        generator = TorchEngine.from_checkpoint(model_dir, device=args.device, max_batch_rows=64)
        validator = TorchEngine.from_checkpoint(model_dir, device=args.validator_device, max_batch_rows=64)
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
