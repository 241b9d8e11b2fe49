"""Generation throughput on one GPU: plain vLLM against our VllmEngine with proofs, and our TorchEngine.

Same model, same work, one process each (a vLLM instance keeps its share of the GPU until its process
ends): ``--prompts`` random prompts of ``--prompt-length`` tokens, ``-n`` completions each (a GRPO
group), ``--new-tokens`` tokens per completion with end-of-sequence ignored, sampled at temperature 1.

- peer: ``vllm.LLM.generate`` as anyone runs it (CUDA graphs, prefix caching, its own sampler);
- ours: ``VllmEngine.generate`` (the protocol sampler inside vLLM's step, hidden states and
  log-probabilities captured there) plus the TOPLOC proofs of every completion
  (``build_completion_proofs``), as an inference worker does per batch; then the verification
  prefill with sampling replays of the same completions on the same engine (its torch twin: what a
  validator on this GPU does), reported as a multiple of ours' generation rate (the issue asks 20x);
- torch: ``TorchEngine`` on the GPU in the same precision, generation plus proofs;
- plain_v1 (``--engines`` adds it): plain vLLM on its V1 model runner, which a custom logits processor
  forces (vLLM 0.26 runs plain generation on V2): the runner's share of the gap.

The model is SmolLM2-135M's shape with random weights from a fixed seed (``--model DIR`` for another
HF-layout model). A warm-up call runs before each timed one. Without CUDA or vLLM, only the torch
child runs (a CPU rehearsal with ``--quick``: a tiny shape).

    python bench/gpu_engines.py [--quick] [--model DIR] [--prompts 32] [-n 8] [--new-tokens 256]

The last line is ``gpu_engines: ours=<tok/s> peer=<tok/s> ratio=<x> target=0.85 ok|short``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in the child's process
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TARGET = 0.85
RESULT = "RESULT "
SMOL_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3)
TINY_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)


def build_model(out: Path, shape: dict) -> Path:
    """A Llama of ``shape`` with random weights (seed 0), bf16, HF layout, and a word-level tokenizer
    over its whole vocabulary (vLLM loads one); reused when already there."""
    if (out / "config.json").exists():
        return out
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    config = LlamaConfig(**shape, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_act="silu",
                         head_dim=shape["hidden_size"] // shape["num_attention_heads"])
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, shape["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<pad>").save_pretrained(out)
    return out


def prompts_for(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(1234)
    return torch.randint(3, vocab, (args.prompts, args.prompt_length), generator=generator).tolist()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def child_plain(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    """Plain vLLM: n samples per prompt from its own sampler."""
    from vllm import LLM
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(args.model), dtype=args.dtype, gpu_memory_utilization=args.gpu_memory, seed=0,
              max_model_len=args.prompt_length + args.new_tokens + 8)
    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(requests[:2], VllmSamplingParams(n=2, max_tokens=8, ignore_eos=True, detokenize=False),
                 use_tqdm=False)
    sync()
    started = time.perf_counter()
    outputs = llm.generate(requests, VllmSamplingParams(n=args.n, temperature=1.0, max_tokens=args.new_tokens,
                                                        ignore_eos=True, detokenize=False, seed=1), use_tqdm=False)
    sync()
    seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def _timed_generation(engine: object, args: argparse.Namespace, prompts: list[list[int]]) -> tuple[list, dict]:
    """Generation plus proofs, after a warm-up; the completions and the figures."""
    from intellect_node.node.engine.base import SamplingParams
    from intellect_node.node.engine.proofs import build_completion_proofs

    warm = engine.generate(prompts[:2], 2, SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=(), seed=2))
    build_completion_proofs([c.hidden_states for g in warm for c in g])
    sync()
    started = time.perf_counter()
    groups = engine.generate(prompts, args.n, SamplingParams(temperature=1.0, max_tokens=args.new_tokens,
                                                             stop_token_ids=(), seed=1))
    sync()
    generated = time.perf_counter() - started
    build_completion_proofs([c.hidden_states for g in groups for c in g])
    seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    return groups, {"tokens": tokens, "generate_s": generated, "seconds": seconds, "tok_s": tokens / seconds}


def _timed_verification(engine: object, prompts: list[list[int]], groups: list, n: int) -> dict:
    """The verification prefill with sampling replays of ``groups`` (the seeds ``_timed_generation`` used)."""
    import numpy as np

    from intellect_node.node.engine.base import SamplingParams
    from intellect_node.protocol.sampling import MAX_SLACK, Replay

    params = SamplingParams(temperature=1.0, stop_token_ids=(), seed=1)
    rows = [(p, c) for p, g in enumerate(groups) for c in g]
    replays = [Replay(params.completion_seed(p, n, c.sample_index), 1.0, 1.0, MAX_SLACK) for p, c in rows]
    # warm-up: the replay's race is compiled on a GPU at its first call (protocol/compiled.py)
    engine.prefill([prompts[p] for p, _ in rows[:4]], [c.token_ids for _, c in rows[:4]], replays[:4])
    sync()
    started = time.perf_counter()
    results = engine.prefill([prompts[p] for p, _ in rows], [c.token_ids for _, c in rows], replays)
    sync()
    seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for _, c in rows)
    margins = np.concatenate([r.sampling_margins for r in results])
    return {"verify_tok_s": tokens / seconds, "verify_s": seconds, "own_min_margin": float(margins.min()),
            "own_flips": int((margins < 0).sum()), "positions": int(margins.size)}


def child_ours(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    from intellect_node.node.engine.vllm_engine import VllmEngine

    engine = VllmEngine.from_checkpoint(args.model, dtype=args.dtype, gpu_memory_utilization=args.gpu_memory, seed=0,
                                        max_model_len=args.prompt_length + args.new_tokens + 8)
    groups, figures = _timed_generation(engine, args, prompts)
    return {**figures, **_timed_verification(engine, prompts, groups, args.n)}


def child_torch(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    import torch

    from intellect_node.node.engine.torch_engine import TorchEngine

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype) if device == "cuda" else torch.float32
    engine = TorchEngine.from_checkpoint(args.model, device=device, dtype=dtype, max_batch_rows=args.prompts * args.n)
    groups, figures = _timed_generation(engine, args, prompts)
    return {**figures, **_timed_verification(engine, prompts, groups, args.n), "device": device}


def child_plain_v1(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    """Plain vLLM on its V1 model runner, the one a custom logits processor (ours) runs on: how much
    of ours' gap to plain vLLM is the runner's."""
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    return child_plain(args, prompts)


CHILDREN = {"plain": child_plain, "ours": child_ours, "torch": child_torch, "plain_v1": child_plain_v1}


def run_child(name: str, argv: list[str], timeout: float) -> dict | None:
    """This file as ``--child name`` in its own process; its result, or None (its output is shown)."""
    command = [sys.executable, "-u", str(Path(__file__).resolve()), *argv, "--child", name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        print(f"{name}: no result within {timeout:.0f} s\n{(expired.stdout or '')[-3000:]}", flush=True)
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        print(f"{name}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}", flush=True)
        return None
    return json.loads(lines[-1][len(RESULT):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a quarter of the work (a tiny model without a GPU)")
    parser.add_argument("--model", type=Path, help="an HF-layout model [default: SmolLM2-135M's shape, random]")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("-n", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--gpu-memory", type=float, default=0.5, help="vLLM's gpu_memory_utilization")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per child process")
    parser.add_argument("--engines", default="plain,ours,torch", help="which children run (with a GPU and vLLM)")
    parser.add_argument("--child", choices=tuple(CHILDREN), help=argparse.SUPPRESS)
    args = parser.parse_args()
    import importlib.util

    import torch

    gpu = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None
    if args.quick:
        args.prompts, args.new_tokens = max(1, args.prompts // 2), max(8, args.new_tokens // 2)
    if args.model is None:
        shape, label = (SMOL_SHAPE, "smol-shape") if gpu or not args.quick else (TINY_SHAPE, "tiny-shape")
        args.model = build_model(Path(tempfile.gettempdir()) / f"ina-bench-{label}", shape)
    if args.child:
        from transformers import AutoConfig

        prompts = prompts_for(args, AutoConfig.from_pretrained(args.model).vocab_size)
        print(RESULT + json.dumps(CHILDREN[args.child](args, prompts)), flush=True)
        return
    argv = [a for a in sys.argv[1:] if a != "--quick"] + ["--model", str(args.model), "--prompts", str(args.prompts),
                                                          "--new-tokens", str(args.new_tokens)]
    names = [name for name in args.engines.split(",") if gpu or name == "torch"]
    results = {name: run_child(name, argv, args.timeout) for name in names}
    work = f"{args.prompts} prompts x n={args.n} x {args.new_tokens} tokens, {args.dtype}, model {args.model}"
    print(f"work: {work}; {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    for name, result in results.items():
        print(f"{name}: {json.dumps(result)}", flush=True)

    def rate(name: str) -> float | None:
        result = results.get(name)
        return None if result is None else result["tok_s"]

    ours, peer, torch_rate = rate("ours"), rate("plain"), rate("torch")
    v1_rate = rate("plain_v1")
    if v1_rate is not None and peer:
        of_v1 = "" if ours is None else f"; ours = {ours / v1_rate:.3f}x of it"
        print(f"plain vLLM on its V1 model runner (ours' runner): {v1_rate:.0f} tok/s = {v1_rate / peer:.3f}x "
              f"plain{of_v1}")
    if torch_rate is not None and peer:
        print(f"torch engine with proofs: {torch_rate:.0f} tok/s = {torch_rate / peer:.3f}x plain vLLM (target 0.3)")
    if ours is not None and results["ours"].get("verify_tok_s"):
        print(f"verification prefill with replays on the same GPU: {results['ours']['verify_tok_s']:.0f} tok/s = "
              f"{results['ours']['verify_tok_s'] / ours:.1f}x ours' generation (target 20)")
    if ours is None or not peer:
        reason = "no GPU with vLLM here" if not gpu else "a child failed"
        print(f"gpu_engines: ours=na peer=na ratio=na target={TARGET} short ({reason})")
        return
    ratio = ours / peer
    print(f"gpu_engines: ours={ours:.0f} peer={peer:.0f} ratio={ratio:.3f} target={TARGET} "
          f"{'ok' if ratio >= TARGET else 'short'}")


if __name__ == "__main__":
    main()
