"""The ``[trainer]`` section's types: ``TrainerOptions`` and its sub-tables ``OptimConfig``,
``LossConfig``, ``RewardConfig`` (and ``LoraConfig``, which checks the LoRA fields), torch-free so
that loading the config and ``--help`` never import torch.

The section holds every field of ``TrainerOptions`` but the model, tasks, publish directory and
trusted validators (which ``join`` decides): defaults < the config file's ``[trainer]`` < an old
``--trainer-config`` file (deprecated: the same keys, without the ``trainer.`` prefix) < environment
(``INTELLECT_NODE_TRAINER_BATCH_GROUPS``; a sub-table's key by its path,
``INTELLECT_NODE_TRAINER_OPTIM_LR``) < command-line flags. node/app/join.py loads it through
node/config's ``load_section``, which merges the sub-tables key by key across these layers.

``async_level`` is run-wide: it comes from ``[run]`` unless the trainer's section names it. The
section holds the knobs a user tunes rarely; the flags the ones a demo or a quick run sets::

    [trainer]
    batch_groups = 16
    [trainer.optim]     # OptimConfig: lr, betas, weight_decay, warmup_steps, ...
    lr = 5e-4
    [trainer.loss]      # LossConfig: clip_eps, ratio_cap, normalization, ...
    [trainer.rewards]   # RewardConfig: length_coef, length_form

Typed by node/config: unknown keys are errors that name the key, so a typo never silently trains
with a default. What the knobs do is told where they act: node.roles.trainer.learner
(``old_policy``), loss (the clipping), rewards (the length reward), lora, service.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

DEPRECATED_FILE = ("--trainer-config is deprecated: move the file's keys into config.toml's [trainer] section "
                   "([optim] becomes [trainer.optim], and so on)")

OLD_POLICIES = ("behavior", "recompute")
NORMALIZATIONS = ("token", "constant")
LENGTH_FORMS = ("absolute", "over", "none")
# the dtype workers and validators run (specs/deltas.md), by torch's name for it
POLICY_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.01
    warmup_steps: int = 5  # linear warm-up, in optimizer steps
    # then cosine decay to ``final_lr_fraction`` x lr over this many optimizer steps, constant after
    # (0: constant lr): late in a run a sharp policy moves most per step, which stale rollouts pay for
    decay_steps: int = 0
    final_lr_fraction: float = 0.1
    grad_clip: float = 1.0
    micro_batch_rows: int = 64
    optimizer_steps: int = 1  # per rollout step
    max_tokens: int = 64  # completion budget, the "constant" normalization's unit
    old_policy: str = "behavior"  # or "recompute": see node.roles.trainer.learner's docstring

    def __post_init__(self) -> None:
        if self.old_policy not in OLD_POLICIES:
            raise ValueError(f"old_policy {self.old_policy!r}; choose one of {OLD_POLICIES}")
        if self.lr <= 0 or self.grad_clip <= 0:
            raise ValueError("lr and grad_clip must be > 0")
        if self.micro_batch_rows < 1 or self.optimizer_steps < 1 or self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError("micro_batch_rows and optimizer_steps must be >= 1, warmup_steps and decay_steps >= 0")
        if not 0 < self.final_lr_fraction <= 1:
            raise ValueError("final_lr_fraction must be in (0, 1]")

    def lr_factor(self, optimizer_step: int) -> float:
        """The learning rate of optimizer step ``optimizer_step`` (from 0) as a fraction of ``lr``."""
        if optimizer_step < self.warmup_steps:
            return (optimizer_step + 1) / self.warmup_steps
        if not self.decay_steps:
            return 1.0
        progress = min(1.0, (optimizer_step - self.warmup_steps) / self.decay_steps)
        return self.final_lr_fraction + (1 - self.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class LossConfig:
    clip_eps: float = 0.2
    ratio_cap: float = 4.0  # delta: applied before the clip
    normalization: str = "token"  # "token": / completion tokens in the optimizer batch; "constant": / rows * max_tokens
    entropy_coef: float = 0.0
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization {self.normalization!r}; choose one of {NORMALIZATIONS}")
        if not 0 < self.clip_eps < 1:
            raise ValueError("clip epsilon must be in (0, 1)")
        if self.ratio_cap <= 1 + self.clip_eps:
            raise ValueError("the ratio cap delta must exceed 1 + epsilon")


@dataclass(frozen=True)
class RewardConfig:
    """``absolute``: -c * |len - target| (INTELLECT-2); ``over``: only length beyond the target
    costs; ``none``: task reward alone."""

    length_coef: float = 0.0003
    length_form: str = "absolute"

    def __post_init__(self) -> None:
        if self.length_form not in LENGTH_FORMS:
            raise ValueError(f"length reward form {self.length_form!r}; choose one of {LENGTH_FORMS}")
        if self.length_coef < 0:
            raise ValueError("length reward coefficient must be >= 0")


# every linear layer of a Llama-family block: attention-only adapters (q and v) learned a fifth as
# much in four GRPO steps of SmolLM2-135M at their best lr (0.31 -> 0.40 held out), all seven at rank 1
# as much as full fine-tuning (0.31 -> 0.83 in two steps, as full's 0.83; bench/HISTORY.md, "LoRA's recipe")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = LORA_TARGETS  # last components of the wrapped modules' names

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank {self.rank}: must be >= 1")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha {self.alpha}: must be > 0")
        if not self.targets:
            raise ValueError("LoRA needs at least one target module name")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank




@dataclass(frozen=True)
class TrainerOptions:
    model_dir: Path
    task_spec: str
    publish_dir: Path
    batch_groups: int = 16  # GRPO groups (prompts) per step
    async_level: int = 2
    max_steps: int | None = None  # stop training after this step (the node keeps serving)
    eval_every: int = 5
    # and by wall time: a slow model's steps take minutes, so a step count alone left a 14-minute
    # real-model demo with no evaluation after step 0 (issue 52)
    eval_every_s: float = 180.0
    first_eval_s: float = 120.0  # the first evaluation after step 0, counted from the first trained step
    eval_tasks: int = 200
    engine: str = "torch"  # for verification
    trusted: tuple[str, ...] = ()
    verify_fraction: float = 1.0  # the rest waits for agreeing trusted verdicts (node/roles/validator/verdict_trust.py)
    bridge_after_s: float = 60.0  # no usable group for this long while workers wait for the next step: bridge step
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    rewards: RewardConfig = RewardConfig()
    seed: int = 0
    # the dtype workers and validators run (specs/deltas.md): fp32 masters are rounded to it at each
    # publish; bfloat16 halves the checkpoint and makes each step's delta sparse at RL learning rates
    policy_dtype: str = "float32"
    # LoRA (specs/deltas.md 3a): 0 trains every weight; >= 1 trains only adapters of this rank on the
    # targeted linear layers, and each step ships the adapter instead of the weights
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if self.lora_rank:
            LoraConfig(self.lora_rank, self.lora_alpha, self.lora_targets)  # its own checks
        elif self.lora_rank < 0:
            raise ValueError("lora_rank must be >= 0")
        if self.policy_dtype not in POLICY_DTYPES:
            raise ValueError(f"policy_dtype {self.policy_dtype!r}; choose one of {sorted(POLICY_DTYPES)}")
        if self.batch_groups < 1 or self.async_level < 0 or self.eval_every < 1:
            raise ValueError("batch_groups and eval_every must be >= 1, async_level >= 0")
        if not self.bridge_after_s > 0:
            raise ValueError("bridge_after_s must be > 0")
        if not (self.eval_every_s > 0 and self.first_eval_s > 0):
            raise ValueError("eval_every_s and first_eval_s must be > 0")
        if not 0.0 <= self.verify_fraction <= 1.0:
            raise ValueError("verify_fraction must be in [0, 1]")
        if self.verify_fraction < 1.0 and not self.trusted:
            raise ValueError("a trainer that verifies only part of the batches needs --trust-validator for the rest")

