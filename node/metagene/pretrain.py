"""Local pretraining: the inner step that DiLoCo peers share, and a one-machine loop around it.

Why here and not in the DiLoCo role: a DiLoCo peer runs exactly these inner steps between outer
synchronisations; keeping ``train_step`` free of any networking lets the role call it and lets
``metagene pretrain`` train on one machine with the same code. Local pretraining draws each step's
reads with ``sharding`` as a single peer (round = step), so its data order is the protocol's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from intellect_node.node.diloco.llama import Preset
from intellect_node.node.diloco.recipe import make_optimizer
from intellect_node.node.metagene.dataset import TokenizedReads
from intellect_node.node.metagene.feed import round_batches
from intellect_node.node.metagene.loss import lm_loss
from intellect_node.node.metagene.recipe import MetageneRecipe
from intellect_node.node.metagene.sequences import PackedBatch

RECIPE_FILE = "metagene.json"


def train_step(model: LlamaForCausalLM, optimizer: torch.optim.Optimizer, batch: PackedBatch,
               recipe: MetageneRecipe, step: int) -> dict[str, float]:
    """One optimizer step at ``recipe.lr_at(step)``: forward with the document mask, loss with
    z-loss, backward, clip, AdamW. Returns the step's metrics."""
    for group in optimizer.param_groups:
        group["lr"] = recipe.lr_at(step)
    model.train()
    logits = model(**batch.model_inputs()).logits
    parts = lm_loss(logits, batch.labels, recipe.z_loss)
    optimizer.zero_grad(set_to_none=True)
    parts.total.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
    optimizer.step()
    return {"step": step, "loss": float(parts.total.detach()), "ce": float(parts.cross_entropy.detach()),
            "z": float(parts.z_loss.detach()),
            "grad_norm": float(grad_norm), "lr": recipe.lr_at(step), "tokens": parts.tokens}


def pretrain(model: LlamaForCausalLM, store: TokenizedReads, recipe: MetageneRecipe, steps: int, reads_per_batch: int,
             seq_len: int = 512, seed: int = 0, pack: bool = True,
             on_step: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """``steps`` steps on one machine; step s trains on round s of a one-peer assignment."""
    optimizer = make_optimizer(model, recipe)
    history = []
    for step in range(steps):
        started = time.perf_counter()
        (batch,) = round_batches(store, seed, step, 0, 1, reads_per_batch, reads_per_batch, seq_len, pack)
        metrics = train_step(model, optimizer, batch, recipe, step)
        metrics["seconds"] = time.perf_counter() - started
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
    return history


def save_pretrained(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path, preset: Preset,
                    recipe: MetageneRecipe, extra: dict[str, Any]) -> Path:
    """HF layout (config.json, model.safetensors, tokenizer files) plus ``metagene.json`` with the
    preset, recipe and run facts, so a reader knows what produced the weights."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"preset": asdict(preset), "recipe": asdict(recipe)} | extra
    (out / RECIPE_FILE).write_text(json.dumps(record, indent=2))
    return out
