"""GRPO step time: the FSDP2-sharded learner in 2 gloo processes against the plain one in 1.

The model has the tiny model's shape (TinyRecipe: Qwen2, 4 layers, hidden 128, vocab 320, tied
embeddings) with random weights: step time does not depend on the values. The batch: 16 groups
x 8 completions of 4-12 tokens after 8-16-token prompts, behavior logprobs given, default
OptimConfig (micro-batches of 64 rows, one AdamW step). Each process uses one torch thread, so
the 2-process run uses two cores where the plain one uses one: the question is what sharding
costs or gains on CPU at this size, not a like-for-like core count. The first step of each side
is warm-up; the headline is each side's median.

    .venv/bin/python bench/trainer_sharding.py [--quick]

The last line is ``trainer_sharding: ours=<s/step, 2 processes> peer=<s/step, 1 process>
ratio=<peer/ours> target=1 ok|short``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.models.tiny.build import TinyRecipe  # noqa: E402 (after the path)
from intellect_node.node.roles.trainer.groups import TrainingGroup  # noqa: E402
from intellect_node.node.roles.trainer.learner import GRPOLearner  # noqa: E402
from intellect_node.node.roles.trainer.sharded import ShardedLearner  # noqa: E402

TARGET = 1.0


def tiny_shaped_model() -> Qwen2ForCausalLM:
    recipe = TinyRecipe()
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=recipe.vocab_size, hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads, max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=2))


def batch(seed: int) -> list[TrainingGroup]:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(16):
        prompt = tuple(int(t) for t in rng.integers(3, 320, size=int(rng.integers(8, 17))))
        completions = tuple(tuple(int(t) for t in rng.integers(3, 320, size=int(rng.integers(4, 13))))
                            for _ in range(8))
        groups.append(TrainingGroup(
            key=f"{g:064x}:{g}", worker="w", policy_step=0, task_id=f"t{g}", length_target=16, prompt=prompt,
            completions=completions, task_rewards=tuple(float(r) for r in rng.integers(0, 2, size=8)),
            logprobs=tuple(tuple(float(x) for x in -rng.random(len(c)) * 5) for c in completions)))
    return groups


def timed_steps(learner: GRPOLearner, steps: int, barrier: bool) -> list[float]:
    times = []
    for step in range(steps + 1):
        groups = batch(step)
        if barrier:
            dist.barrier()
        started = time.perf_counter()
        learner.step(groups)
        times.append(time.perf_counter() - started)
    return times[1:]


def _process(rank: int, world: int, port: int, steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        learner = ShardedLearner(tiny_shaped_model(), 0, init_device_mesh("cpu", (world,)))
        times = timed_steps(learner, steps, barrier=True)
        if rank == 0:
            Path(out).write_text(" ".join(map(str, times)))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 timed steps per side instead of 10")
    args = parser.parse_args()
    steps = 3 if args.quick else 10
    torch.set_num_threads(1)
    plain = statistics.median(timed_steps(GRPOLearner(tiny_shaped_model(), 0), steps, barrier=False))
    with tempfile.TemporaryDirectory() as scratch, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        out = str(Path(scratch) / "times")
        mp.spawn(_process, args=(2, port, steps, out), nprocs=2, join=True)
        sharded = statistics.median(float(t) for t in Path(out).read_text().split())
    rows = 16 * 8
    print(f"1 process: {plain:.3f} s/step; 2 processes (FSDP2, gloo): {sharded:.3f} s/step; {rows} rows")
    ratio = plain / sharded
    print(f"trainer_sharding: ours={sharded:.3f} peer={plain:.3f} ratio={ratio:.2f} target={TARGET:g} "
          f"{'ok' if ratio >= TARGET else 'short'}")


if __name__ == "__main__":
    main()
