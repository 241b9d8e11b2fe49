"""Build, train and save the project's tiny model: a Qwen2-shaped decoder for the toy tasks.

Why build on first use rather than commit weights: the swarm never relies on two machines
building identical bytes (the trainer publishes checkpoint 0 through the shard overlay, named by
its manifest hash); what must be reproducible is the recipe, which is recorded next to the
weights in ``tinymodel.json`` and checked on reuse. Building takes about two and a half minutes
on 2 cores (one torch thread, quiet) and keeps megabytes of binary out of git history.

The recipe:

- tokenizer: byte-level BPE trained on toy prompts, digits always split one per token (answers
  are digit strings), three specials ``<pad> <bos> <eos>`` and a chat template that renders a
  prompt as ``<bos>{prompt}\\n``; the completion is the answer followed by ``<eos>``;
- model: Qwen2 (4 layers, hidden 192, intermediate 576, 6 heads over 2 KV heads, tied
  embeddings), about 1.8M parameters (small on purpose: a GRPO step on two cores must take well
  under a second; version 1's hidden 128, 0.83M, stopped near 0.58 under GRPO where this one goes
  past 0.9 in one process: bench/RESULTS.md, "Model size is the lever"), random init from the
  recipe seed;
- training: supervised, loss on the answer and EOS only, AdamW with warm-up and cosine decay,
  three addition batches for one reversal batch, 850 steps of 32: greedy accuracy ends low on
  purpose so that GRPO has room to raise it (version 2, measured by ``python -m
  intellect_node.node.models.tiny``: addition 0.200, reversal 0.290 on about 200 held-out tasks
  each, and 0.12-0.165 on the demo trainer's 200 reversal prompts; version 1 gave 0.135 / 0.095,
  and 900 steps of it 0.48 / 0.48: the models sit on the steep part of the curve, so another
  machine's float rounding may land a few points away).
  Half of the training prompts carry the "Think for N tokens..." suffix so both forms parse.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from intellect_node.node.engine.base import SamplingParams, encode_prompt
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.tasks.schema import Task, with_length_target
from intellect_node.node.tasks.toy import generate_toy_tasks, verify_toy

RECIPE_FILE = "tinymodel.json"
SPECIALS = ("<pad>", "<bos>", "<eos>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}{% endif %}"
)
LENGTH_TARGETS = (16, 32, 64, 128)
TRAIN_SEED_OFFSET = 1_000_003  # training tasks never share a seed with evaluation sets


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the tiny model; stored beside the weights."""

    version: int = 2  # names the cache directory (``tiny_model_dir``): a new recipe, a new version
    seed: int = 0
    vocab_size: int = 320
    hidden_size: int = 192
    intermediate_size: int = 576
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    max_positions: int = 256
    train_steps: int = 850
    batch_size: int = 32
    lr: float = 2e-3
    # the kinds that training batches cycle through; a kind repeated is trained more. Reversal is
    # learned in a few hundred steps, addition needs about four times as many.
    kinds: tuple[str, ...] = ("add", "add", "add", "reverse")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"kinds": list(self.kinds)}


def build_tokenizer(recipe: TinyRecipe) -> PreTrainedTokenizerFast:
    """Byte-level BPE over toy prompts; merges end up on the fixed prompt words."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [
        with_length_target(t, n).prompt + "\n" + t.verification_info["answer"]
        for t, n in zip(
            generate_toy_tasks(recipe.seed + TRAIN_SEED_OFFSET, 2000, recipe.kinds),
            LENGTH_TARGETS * 500,
        )
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        chat_template=CHAT_TEMPLATE,
    )


def build_model(recipe: TinyRecipe, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A randomly initialized Qwen2 of the recipe's shape."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(recipe.seed)
    return Qwen2ForCausalLM(config)


def _training_batch(
    rng: random.Random, recipe: TinyRecipe, tokenizer: PreTrainedTokenizerFast
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tasks = generate_toy_tasks(rng.getrandbits(62), recipe.batch_size, recipe.kinds)
    rows = []
    for task in tasks:
        prompt = task.prompt
        if rng.random() < 0.5:
            prompt = with_length_target(task, rng.choice(LENGTH_TARGETS)).prompt
        context = encode_prompt(tokenizer, prompt)
        answer = tokenizer.encode(task.verification_info["answer"], add_special_tokens=False)
        rows.append((context, answer + [tokenizer.eos_token_id]))
    width = max(len(c) + len(a) for c, a in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (context, answer) in enumerate(rows):
        seq = context + answer
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(context) : len(seq)] = torch.tensor(answer)  # loss on the answer only
    return ids, mask, labels


def train(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, recipe: TinyRecipe
) -> float | None:
    """Supervised warm-up on toy tasks; returns the last step's loss (None for zero steps)."""
    # The stream's name is part of the recipe (it fixes the training data), not a module path:
    # it kept its name when the package moved under demo/ (renaming it built a different model,
    # reversal 0.015 instead of 0.24 greedy, and the demo had nothing to learn from).
    rng = random.Random(f"intellect-node/tinymodel/train/{recipe.seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    warmup = max(1, recipe.train_steps // 10)

    def factor(step: int) -> float:  # linear warm-up, then cosine decay to a tenth
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, recipe.train_steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    loss: torch.Tensor | None = None
    for _ in range(recipe.train_steps):
        ids, mask, labels = _training_batch(rng, recipe, tokenizer)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    model.eval()
    return None if loss is None else float(loss.detach())


def greedy_accuracy(
    engine: TorchEngine, tokenizer: PreTrainedTokenizerFast, tasks: list[Task]
) -> float:
    """Fraction of ``tasks`` whose greedy completion passes the toy verifier."""
    prompts = [encode_prompt(tokenizer, t.prompt) for t in tasks]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    outputs = engine.generate(prompts, n=1, params=params, capture_hidden=False)
    texts = [tokenizer.decode(group[0].token_ids, skip_special_tokens=True) for group in outputs]
    solved = sum(verify_toy(text, t.verification_info) for t, text in zip(tasks, texts))
    return solved / len(tasks)


def build_tiny_model(path: str | Path, recipe: TinyRecipe) -> Path:
    """Build the tiny model into ``path`` (which must not exist yet) and return it."""
    target = Path(path)
    tokenizer = build_tokenizer(recipe)
    model = build_model(recipe, tokenizer)
    final_loss = train(model, tokenizer, recipe)
    target.mkdir(parents=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    record = {"recipe": recipe.to_json(), "final_loss": final_loss}
    (target / RECIPE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return target


def tiny_model_dir(models: Path) -> Path:
    """Where the default recipe's model lives under a models directory: one directory per recipe
    version, so a cache built by an older release is left alone rather than refused."""
    return models / f"tiny-v{TinyRecipe.version}"


def ensure_tiny_model(path: str | Path, recipe: TinyRecipe | None = None) -> Path:
    """The tiny model at ``path``, built there first if absent.

    Concurrent callers (several nodes of a demo) are safe: each builds in a private temporary
    directory and renames it into place; the first rename wins and the others reuse it. An
    existing model built from a different recipe is an error, never silently replaced.
    """
    recipe = recipe or TinyRecipe()
    target = Path(path)
    if not (target / RECIPE_FILE).exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=target.parent))
        try:
            built = build_tiny_model(scratch / "model", recipe)
            try:
                os.rename(built, target)
            except OSError:
                if not (target / RECIPE_FILE).exists():
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    stored = json.loads((target / RECIPE_FILE).read_text())["recipe"]
    if stored != recipe.to_json():
        raise ValueError(f"{target} holds a tiny model built from another recipe: {stored}")
    return target
