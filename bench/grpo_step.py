"""GRPO optimization-step throughput: our GRPOLearner against TRL's GRPOTrainer, same batch.

Both trainers take the same optimizer step on the same tokens, in one process, with the same
torch threads:

- the batch (defaults; ``--prompts``, ``--group-size``, ``--max-tokens``, ``--micro-batch-rows``
  and ``--model`` change them): 16 toy reversal prompts (with the rollout builder's length targets)
  x 8 completions sampled once from the tiny model (torch engine, temperature 1, <= 64 tokens); task rewards from
  ``intellect_node.node.tasks.verify.task_reward``, the sampler's per-token logprobs as the behavior policy;
- the advantages: ours (task + length reward, normalized per group), computed once and given
  to TRL as well, so both losses weight every token identically;
- the loss: token-level GRPO with two-sided clipping (epsilon 0.2, delta 4), normalized by the
  completion tokens of the whole batch, no KL, no entropy bonus, ratio against the behavior
  logprobs: our defaults, TRL's ``loss_type="dapo"`` with ``delta=4``;
- the step: two micro-batches of 64 rows, gradient clipping at 1.0, one AdamW step (lr 1e-4,
  betas 0.9/0.99, weight decay 0.01, 5 warm-up steps), fp32 on CPU. TRL's own defaults, bf16
  autocast and gradient checkpointing, are switched off so both sides do the same arithmetic:
  the script prints both sides' loss and entropy on the first step (same weights), which agree.

What is timed:

- ours: ``GRPOLearner.step(groups)``, all of it: rewards and advantages from the groups, row
  shuffle, packing token lists into tensors, forward + backward per micro-batch (full logits,
  entropy as a metric), clipping, AdamW (torch's default: the single-tensor loop on CPU; weight
  decay on every parameter), scheduler, metrics.
- TRL: ``GRPOTrainer.train()`` as shipped, from its ``on_step_begin`` to its ``on_step_end``
  callback: ``_prepare_inputs`` (with ``_generate_and_score_completions`` returning the
  precomputed, already padded tensors instead of generating; then TRL's shuffle and split),
  ``training_step`` per micro-batch (fused LM head with log-probs and entropy, loss, metrics,
  backward), gradient clipping, AdamW (TRL's default: torch's fused kernel; no weight decay on
  biases and norms), scheduler, zero_grad.
  Its data loading and logging between steps are not timed; neither is the packing into padded
  tensors, which TRL does at generation time and ours does inside the step.

Rounds alternate (one TRL step, then one of ours, from TRL's step-end callback), so load from
other work on a shared machine hits both sides alike; the first rounds are warm-up and are not
counted; the headline is each side's median.

    .venv/bin/pip install -e '.[bench]'      # trl==1.16.0 and its dependencies; torch unchanged
    .venv/bin/python bench/grpo_step.py [--quick] [--threads 2] [--model DIR] [--prompts 16]
        [--group-size 8] [--max-tokens 64] [--micro-batch-rows 64]

The last line is ``grpo_step: ours=<s/step> peer=<s/step> ratio=<peer/ours>x target=1 ok|short``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.app.config import DEFAULT_HOME  # noqa: E402
from intellect_node.node.engine.base import SamplingParams, encode_prompt  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.tiny import ensure_tiny_model, tiny_model_dir  # noqa: E402
from intellect_node.node.roles.trainer.config import LossConfig, OptimConfig, RewardConfig  # noqa: E402
from intellect_node.node.roles.trainer.groups import TrainingGroup  # noqa: E402
from intellect_node.node.roles.trainer.learner import GRPOLearner  # noqa: E402
from intellect_node.node.roles.trainer.rewards import group_advantages, total_rewards  # noqa: E402
from intellect_node.node.tasks.schema import with_length_target  # noqa: E402
from intellect_node.node.tasks.toy import generate_toy_tasks  # noqa: E402
from intellect_node.node.tasks.verify import task_reward  # noqa: E402
from intellect_node.protocol.rollout_shape import DEFAULT_LENGTH_TARGETS  # noqa: E402

try:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:
    raise SystemExit(f"bench/grpo_step.py needs TRL ({exc}); install the bench extra, which leaves torch as it "
                     "is:\n    .venv/bin/pip install -e '.[bench]'") from None

TARGET = 1.0


@dataclass(frozen=True)
class Shape:
    """The batch: prompts x group_size completions of <= max_tokens; the defaults are the tiny
    model's figures, bench/real_model's section of HISTORY.md runs a smaller batch of the real model."""

    prompts: int = 16
    group_size: int = 8
    max_tokens: int = 64
    micro_batch_rows: int = 64

    @property
    def optim(self) -> OptimConfig:
        return OptimConfig(micro_batch_rows=self.micro_batch_rows, max_tokens=self.max_tokens)  # our defaults, stated

LOSS = LossConfig()


def sample_groups(model_dir: Path, tokenizer: PreTrainedTokenizerBase, seed: int, shape: Shape) -> list[TrainingGroup]:
    """The fixed batch, as the trainer would hold it after validation: sampled once, so both
    trainers see exactly the same tokens, rewards and behavior logprobs. No online filter: a
    group whose answers all scored the same keeps its rows (its advantages come from the length
    reward alone), so every step trains on all its rows."""
    engine = TorchEngine.from_checkpoint(model_dir, max_batch_rows=shape.prompts * shape.group_size)
    tasks = generate_toy_tasks(seed=seed, count=shape.prompts, kinds=("reverse",))
    targeted = [with_length_target(task, DEFAULT_LENGTH_TARGETS[i % len(DEFAULT_LENGTH_TARGETS)])
                for i, task in enumerate(tasks)]
    prompts = [encode_prompt(tokenizer, t.prompt) for t in targeted]
    params = SamplingParams(temperature=1.0, max_tokens=shape.max_tokens, seed=seed)
    sampled = engine.generate(prompts, shape.group_size, params, capture_hidden=False)
    groups = []
    for i, (t, prompt, completions) in enumerate(zip(targeted, prompts, sampled, strict=True)):
        texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        groups.append(TrainingGroup(
            key=f"bench:{i}", worker="bench", policy_step=0, task_id=t.task.problem_id,
            length_target=t.length_target, prompt=tuple(prompt),
            completions=tuple(tuple(c.token_ids) for c in completions),
            task_rewards=tuple(task_reward(t.task, text) for text in texts),
            logprobs=tuple(tuple(c.logprobs) for c in completions)))
    return groups


def trl_batch(groups: Sequence[TrainingGroup], pad_id: int) -> dict[str, torch.Tensor]:
    """The groups in the form TRL's generation step hands to its loss: prompts left-padded,
    completions right-padded, the behavior logprobs as ``old_per_token_logps`` and our
    advantages (so both sides weight the same tokens the same)."""
    rows = [(g.prompt, c, lp, float(a)) for g in groups
            for c, lp, a in zip(g.completions, g.logprobs,
                                group_advantages(total_rewards(g.task_rewards, g.lengths, g.length_target,
                                                               RewardConfig())), strict=True)]
    prompt_width = max(len(p) for p, *_ in rows)
    width = max(len(c) for _, c, *_ in rows)
    prompt_ids = torch.full((len(rows), prompt_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(rows), prompt_width), dtype=torch.long)
    completion_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(rows), width), dtype=torch.long)
    behavior = torch.zeros((len(rows), width))
    for i, (prompt, completion, logprobs, _) in enumerate(rows):
        prompt_ids[i, prompt_width - len(prompt):] = torch.tensor(prompt)
        prompt_mask[i, prompt_width - len(prompt):] = 1
        completion_ids[i, : len(completion)] = torch.tensor(completion)
        completion_mask[i, : len(completion)] = 1
        behavior[i, : len(completion)] = torch.tensor(logprobs)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor([r[3] for r in rows]),
            "old_per_token_logps": behavior, "num_items_in_batch": completion_mask.sum()}


class FixedBatchGRPOTrainer(GRPOTrainer):
    """TRL's trainer with generation and scoring replaced by the precomputed batch: everything
    after it (shuffle, split into micro-batches, loss, backward, optimizer) is TRL's own code."""

    def __init__(self, *args: Any, batch: dict[str, torch.Tensor], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fixed_batch = batch

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return dict(self.fixed_batch)  # a fresh dict per call, as generation would hand over


class AlternatingTimer(TrainerCallback):
    """Times each TRL optimizer step (``on_step_begin`` to ``on_step_end``), then runs one of
    ours right after it, so both sides meet the same machine load."""

    def __init__(self, ours: Callable[[], dict[str, float]]) -> None:
        self.ours = ours
        self.trl_seconds: list[float] = []
        self.our_seconds: list[float] = []
        self.our_metrics: list[dict[str, float]] = []
        self.threads: set[int] = set()
        self.started = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trl_seconds.append(time.perf_counter() - self.started)
        self.threads.add(torch.get_num_threads())
        started = time.perf_counter()
        self.our_metrics.append(self.ours())
        self.our_seconds.append(time.perf_counter() - started)
        self.threads.add(torch.get_num_threads())


def trl_config(out: Path, steps: int, shape: Shape) -> GRPOConfig:
    """TRL settings that match ``shape.optim`` and ``LOSS`` (see the module docstring)."""
    optim = shape.optim
    return GRPOConfig(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=shape.micro_batch_rows,
        gradient_accumulation_steps=shape.prompts * shape.group_size // shape.micro_batch_rows,
        num_generations=shape.group_size, max_completion_length=shape.max_tokens, learning_rate=optim.lr,
        adam_beta1=optim.betas[0], adam_beta2=optim.betas[1], weight_decay=optim.weight_decay,
        warmup_steps=optim.warmup_steps, lr_scheduler_type="constant_with_warmup", max_grad_norm=optim.grad_clip,
        loss_type="dapo",
        epsilon=LOSS.clip_eps, delta=LOSS.ratio_cap, beta=0.0, bf16=False, activation_checkpointing=False,
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (< 1 minute)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both sides")
    parser.add_argument("--model", type=Path, default=tiny_model_dir(DEFAULT_HOME / "models"),
                        help="an HF-layout model dir, e.g. `model import`'s (default: the tiny model, built "
                             "there on first use, 1-2 minutes)")
    defaults = Shape()
    parser.add_argument("--prompts", type=int, default=defaults.prompts)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--micro-batch-rows", type=int, default=defaults.micro_batch_rows,
                        help="rows per forward/backward (must divide prompts x group size)")
    parser.add_argument("--seed", type=int, default=0, help="toy tasks and sampling seed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warmup, counted = (2, 4) if args.quick else (3, 20)
    hf_logging.disable_progress_bar()  # per-load bars would bury the table

    shape = Shape(args.prompts, args.group_size, args.max_tokens, args.micro_batch_rows)
    if shape.prompts * shape.group_size % shape.micro_batch_rows:
        raise SystemExit("--micro-batch-rows must divide --prompts x --group-size (TRL's accumulation steps)")
    model_dir = args.model if (args.model / "config.json").is_file() else ensure_tiny_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad_id = int(tokenizer.pad_token_id)
    started = time.perf_counter()
    groups = sample_groups(model_dir, tokenizer, args.seed, shape)
    rows = sum(len(g.completions) for g in groups)
    tokens = sum(sum(g.lengths) for g in groups)
    solved = sum(sum(g.task_rewards) for g in groups)
    print(f"batch: {len(groups)} prompts x {shape.group_size} = {rows} completions, {tokens} completion tokens "
          f"(mean {tokens / rows:.1f}), {solved:.0f} solved; sampled in {time.perf_counter() - started:.1f} s")

    def load() -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")

    learner = GRPOLearner(load(), pad_id, optim=shape.optim, loss=LOSS)  # TRL patches its model: a copy each
    timer = AlternatingTimer(lambda: learner.step(groups))
    with tempfile.TemporaryDirectory(prefix="ina-bench-grpo-") as tmp:
        trainer = FixedBatchGRPOTrainer(
            model=load(), reward_funcs=lambda completions, **_: [0.0] * len(completions),  # never called
            args=trl_config(Path(tmp), warmup + counted, shape), processing_class=tokenizer,
            # TRL's dataloader needs a prompt column to drive its steps; the prompts are never read
            train_dataset=Dataset.from_dict({"prompt": ["unused"] * shape.prompts * (warmup + counted)}),
            callbacks=[timer], batch=trl_batch(groups, pad_id))
        trainer.remove_callback(PrinterCallback)  # with tqdm off it prints every step's log dict
        trainer.train()
    losses = [entry for entry in trainer.state.log_history if "loss" in entry]
    optimizers = {"ours": learner.optimizer, "TRL": trainer.optimizer.optimizer}  # TRL's is accelerate-wrapped
    print(f"torch threads seen during the steps: {sorted(timer.threads)}; optimizers: " + ", ".join(
        f"{side} {type(o).__name__}(fused={o.defaults.get('fused')})" for side, o in optimizers.items()))
    print(f"first step on the same weights: loss ours {timer.our_metrics[0]['loss']:+.4f} "
          f"TRL {losses[0]['loss']:+.4f}; entropy ours {timer.our_metrics[0]['entropy']:.4f} "
          f"TRL {losses[0]['entropy']:.4f}")
    print()
    print("| round | ours (s) | TRL (s) | TRL / ours |")
    print("| --- | --- | --- | --- |")
    for i, (ours, trl) in enumerate(zip(timer.our_seconds, timer.trl_seconds, strict=True)):
        label = f"{i} (warm-up)" if i < warmup else str(i)
        print(f"| {label} | {ours:.3f} | {trl:.3f} | {trl / ours:.2f} |")
    print()
    ours = statistics.median(timer.our_seconds[warmup:])
    peer = statistics.median(timer.trl_seconds[warmup:])
    ratio = peer / ours
    print(f"grpo_step: ours={ours:.3f} peer={peer:.3f} ratio={ratio:.2f}x target={TARGET:g} "
          f"{'ok' if ratio >= TARGET else 'short'}")


if __name__ == "__main__":
    main()
