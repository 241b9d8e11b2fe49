"""The torch engine's decode step against transformers' own, side by side on one model.

peer: transformers' decode loop, ``model.model(...)`` with its ``DynamicCache`` one token per row
per step (what the torch engine ran until the static decoder); ours: the same steps on
``node/engine/static_decode.StaticDecoder`` as the engine now runs them (exact shapes on a CPU;
padded shapes replayed as CUDA graphs on a GPU). Both feed the same fixed tokens after the same
prompt run (tests/support/decode_reference.py), so the work is identical and the hidden states are
compared too (bit for bit on a CPU). Sampling, proofs and the output head are not in either: this
is the step the engine's loop repeats. Runs alternate; medians of decode tokens per wall second.

The model has random weights from a fixed seed: SmolLM2-135M's shape (``--shape smollm2``, the
default; ``--quick`` takes the tiny one) or a tiny one (``--shape tiny``: gpu_engines.py's, 2 layers).

    python bench/decode.py [--quick] [--shape smollm2|tiny] [--rows 32] [--steps 128] [--device cpu|cuda]

The last line is ``decode: ours=<tok/s> peer=<tok/s> ratio=<x> target=1.0 ok|short``: on a CPU the
step must cost no more than transformers' (at 135M it is bound by the matrix products, so the
saved cache copies are a small share; on the tiny model, bound by Python, a large one). On a GPU the
measure that matters is the engine against plain vLLM, bench/gpu_engines.py's ``torch`` row.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_engines import SMOL_SHAPE, TINY_SHAPE  # noqa: E402
from tests.support.decode_reference import static_decode, transformers_decode  # noqa: E402

TARGET = 1.0


def build(shape: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = SMOL_SHAPE if shape == "smollm2" else TINY_SHAPE
    torch.manual_seed(0)
    config = LlamaConfig(**dims, max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def timed(run) -> tuple[float, list[torch.Tensor]]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    states = run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started, states


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny shape, 3 rounds (< 1 minute)")
    parser.add_argument("--shape", choices=("smollm2", "tiny"), help="default: smollm2 (tiny with --quick)")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.quick:  # 135M on a CPU takes minutes; at 40 steps its cache copies are too small to see
        args.shape, args.rounds = args.shape or "tiny", 3
    args.shape = args.shape or "smollm2"
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    model = build(args.shape, args.device, dtype)
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (int(length),), generator=generator).tolist()
               for length in torch.randint(8, 24, (args.rows,), generator=generator)]  # decode-dominated
    padded = args.device != "cpu"
    arms = {
        "peer": lambda: transformers_decode(model, prompts, args.steps),
        "ours": lambda: static_decode(model, prompts, args.steps, padded=padded, cuda_graphs=padded)[0],
    }
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.shape} shape, {params / 1e6:.1f}M params, {dtype}, {args.device}; "
          f"{args.rows} rows x {args.steps} steps; ours {'padded, CUDA graphs' if padded else 'exact'}")
    rates: dict[str, list[float]] = {"peer": [], "ours": []}
    with torch.inference_mode():
        outputs = {name: run() for name, run in arms.items()}  # warm-up (and graph capture)
        difference = max((a.float() - b.float()).abs().max().item() for a, b in zip(*outputs.values(), strict=True))
        for _ in range(args.rounds):
            for name, run in arms.items():
                seconds, _ = timed(run)
                rates[name].append(args.rows * args.steps / seconds)
    for name, values in rates.items():
        print(f"{name} rounds (tok/s): {', '.join(f'{v:.0f}' for v in values)}")
    print(f"largest hidden-state difference, ours against peer: {difference:.3g}")
    ours, peer = statistics.median(rates["ours"]), statistics.median(rates["peer"])
    ratio = ours / peer
    print(f"decode: ours={ours:.0f} peer={peer:.0f} ratio={ratio:.2f} target={TARGET} "
          f"{'ok' if ratio >= TARGET else 'short'}")


if __name__ == "__main__":
    main()
