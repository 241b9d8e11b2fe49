"""``python -m intellect_node.node.models.tiny PATH [--rebuild] [--steps N] [--threads T]``: install (or reuse) the
tiny model at PATH and print its recorded start (the demo's held-out reversal accuracy) and its greedy accuracy per
toy task kind on 200 held-out tasks. ``--rebuild`` builds the default recipe from scratch instead of installing the
shipped weights, and says whether this machine made the same bytes; ``--steps`` (a recipe other than the default,
so always built) sets the lr schedule's length; ``--threads`` the evaluation's threads (the build runs on one)."""

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
from intellect_node.node.models.tiny.shipped import SHIPPED_SHA256, file_sha256
from intellect_node.node.tasks.toy import generate_toy_tasks

EVAL_SEED = 424242


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--steps", type=int, default=DEFAULT_RECIPE.train_steps)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rebuild", action="store_true", help="build the default recipe rather than install it")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = dataclasses.replace(DEFAULT_RECIPE, train_steps=args.steps)
    started = time.perf_counter()
    path = ensure_tiny_model(args.path, recipe, log=print, rebuild=args.rebuild)
    record = json.loads((path / RECIPE_FILE).read_text())
    print(f"model at {path} ({time.perf_counter() - started:.1f} s): {record['steps']} steps, "
          f"start accuracy {record['start_accuracy']} (the demo's step 0), built with {record['built_with']}")
    if args.rebuild and recipe == DEFAULT_RECIPE:
        same = file_sha256(path / "model.safetensors") == SHIPPED_SHA256["model.safetensors"]
        print("the same weights as the shipped ones" if same else "other weights than the shipped ones "
              "(another CPU's rounding: in the band, but it may learn differently)")
    engine = TorchEngine.from_checkpoint(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = generate_toy_tasks(EVAL_SEED, 400)
    for kind in dict.fromkeys(recipe.kinds):  # each kind once, in order
        subset = [t for t in tasks if t.verification_info["kind"] == kind]
        print(f"greedy accuracy {kind}: {greedy_accuracy(engine, tokenizer, subset):.3f}")


if __name__ == "__main__":
    main()
