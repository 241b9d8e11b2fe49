"""``python -m intellect_node.node.models.tiny PATH [--steps N] [--threads T]``: build (or reuse) the tiny model
at PATH and print its recorded start (the demo's held-out reversal accuracy) and its greedy accuracy per toy task
kind on 200 held-out tasks. ``--steps`` sets the lr schedule's length; ``--threads`` the evaluation's threads (the
build runs on one)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.models.tiny.build import DEFAULT_RECIPE, RECIPE_FILE, ensure_tiny_model, greedy_accuracy
from intellect_node.node.tasks.toy import generate_toy_tasks

EVAL_SEED = 424242


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--steps", type=int, default=DEFAULT_RECIPE.train_steps)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = dataclasses.replace(DEFAULT_RECIPE, train_steps=args.steps)
    started = time.perf_counter()
    path = ensure_tiny_model(args.path, recipe, log=print)
    record = json.loads((path / RECIPE_FILE).read_text())
    print(f"model at {path} ({time.perf_counter() - started:.1f} s): {record['steps']} steps, "
          f"start accuracy {record['start_accuracy']} (the demo's step 0), built with {record['built_with']}")
    engine = TorchEngine.from_checkpoint(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = generate_toy_tasks(EVAL_SEED, 400)
    for kind in dict.fromkeys(recipe.kinds):  # each kind once, in order
        subset = [t for t in tasks if t.verification_info["kind"] == kind]
        print(f"greedy accuracy {kind}: {greedy_accuracy(engine, tokenizer, subset):.3f}")


if __name__ == "__main__":
    main()
