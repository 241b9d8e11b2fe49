"""Verifiable sampling: inverse-CDF against an exponential race, and the honest replay margin.

Three figures decide the design of specs/sampling.md:

1. Replay cost per position at a 150k vocabulary: float64 softmax + cumulative sum for an
   inverse-CDF sampler, the race of ``intellect_node.protocol.sampling`` (splitmix64 noise per
   token in int64 arithmetic, then the score margin).
2. Robustness to logit noise (what a second engine's kernels add): for noise of standard
   deviation sigma on the logits, the positions whose token changes with no slack, and the slack
   each design would need to admit all of them (CDF units; logit units for the race).
3. The honest margin of the torch engine judged by itself: tokens generated on 1 and 2 threads
   and batch sizes 1..64 (identical), replayed by a prefill at another batch size; the smallest
   margin (>= 0: every token the exact choice of the verifier's replay).

    .venv/bin/python bench/sampling.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.engine.base import SamplingParams, derive_seed  # noqa: E402
from intellect_node.node.engine.torch_engine import TorchEngine  # noqa: E402
from intellect_node.node.models.tiny import TinyRecipe, ensure_tiny_model  # noqa: E402
from intellect_node.protocol.sampling import Replay, margins, sample  # noqa: E402


def inverse_cdf(logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The alternative design: the token whose interval of the float64 CDF (token id order) holds
    u; also the CDF, whose disagreement between engines is the slack such a design would need."""
    cdf = torch.cumsum(torch.softmax(logits.double(), dim=-1), dim=-1)
    return torch.searchsorted(cdf, u[:, None], right=True)[:, 0].clamp(max=logits.shape[-1] - 1), cdf


def timed(fn, repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats * 1e3


def cost_and_robustness(vocab: int, positions: int) -> None:
    generator = torch.Generator().manual_seed(0)
    # a Zipf-like LM distribution: logits decreasing in log-rank, shuffled over token ids
    base = -1.1 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float64))
    logits = torch.stack([base[torch.randperm(vocab, generator=generator)] for _ in range(positions)]).float()
    u = torch.rand(positions, dtype=torch.float64, generator=generator)
    replay = Replay(seed=7, temperature=1.0, top_p=1.0, slack=0.0)
    tokens = sample(logits, [7] * positions, list(range(positions)), 1.0, 1.0)
    softmax = timed(lambda: torch.softmax(logits.double(), dim=-1), 3) / positions
    inv = timed(lambda: inverse_cdf(logits, u), 3) / positions
    race = timed(lambda: margins(logits, tokens, replay), 3) / positions
    top = timed(lambda: margins(logits, tokens, Replay(7, 1.0, 0.9, 1e-3)), 1) / positions
    print(f"vocab {vocab}, {positions} positions: replay ms/position: inverse-CDF {inv:.2f}, "
          f"race {race:.2f} (top-p 0.9: {top:.2f}); a float64 softmax alone {softmax:.2f}")
    inv_tokens, cdf = inverse_cdf(logits, u)
    for sigma in (1e-4, 1e-3, 1e-2):
        noisy = logits + sigma * torch.randn(logits.shape, generator=generator)
        moved, noisy_cdf = inverse_cdf(noisy, u)
        worst_race = float(-np.min(margins(noisy, tokens, replay)))
        changed_race = int((sample(noisy, [7] * positions, list(range(positions)), 1.0, 1.0) != tokens).sum())
        print(f"  logit noise {sigma:g}: changed tokens inverse-CDF {int((moved != inv_tokens).sum())}/{positions} "
              f"(CDF disagreement up to {float((noisy_cdf - cdf).abs().max()):.1e}), race {changed_race}/{positions} "
              f"(score deficit up to {max(worst_race, 0.0):.1e})")


def honest_margins(quick: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="ina-bench-") as tmp:
        model_dir = ensure_tiny_model(Path(tmp) / "tiny", TinyRecipe(train_steps=0))
        engine = TorchEngine.from_checkpoint(model_dir)
        prompts = [[1, 5 + i, 9, 13 + 2 * i] for i in range(4)]
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=48 if quick else 96, seed=3,
                                stop_token_ids=())
        reference = None
        worst, rows = float("inf"), 0
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for batch in ((1, 64) if quick else (1, 3, 16, 64)):
                engine.max_batch_rows = batch
                out = engine.generate(prompts, 16, params, capture_hidden=False)
                tokens = [c.token_ids for group in out for c in group]
                reference = reference or tokens
                assert tokens == reference, f"tokens differ at {threads} threads, batch {batch}"
                engine.max_batch_rows = 7  # the verifier batches differently
                replays = [Replay(derive_seed(3, i), 1.0, 0.95, 1e-3) for i in range(len(tokens))]
                results = engine.prefill([p for p in prompts for _ in range(16)], tokens, replays)
                worst = min(worst, min(float(np.min(r.sampling_margins)) for r in results))
                rows += len(tokens)
        print(f"honest torch/torch: identical tokens on 1 and 2 threads, batch sizes "
              f"{'1, 64' if quick else '1, 3, 16, 64'}; {rows} rows replayed, smallest margin {worst:.3e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    cost_and_robustness(150_000, 16 if args.quick else 64)
    honest_margins(args.quick)


if __name__ == "__main__":
    main()
