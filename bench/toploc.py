"""TOPLOC proof build and verify: crypto.toploc against the reference package toploc 0.1.6.

Same bf16 tensors, same process, torch threads 1 and 2; each round times both sides back to
back (alternating which goes first) so that load from other processes hits both alike, and the
figures are the best of the rounds (the least disturbed run) with the median beside it.

"N threads" also pins the process to N cores (sched_setaffinity): the reference's C++ verifier
starts one std::thread per core whatever torch's thread setting, so without the pin its
"1 thread" verify runs on two cores. One extra line shows that unpinned case as well.

"Ours" is the protocol's path: proofs bound to a row key (specs/toploc.md 3.1: a mask per chunk
added to the coefficients, removed before verifying); unbound, they are checked to be the
reference's bytes, so both sides do the same work.

Targets at hidden 4096 with 1 thread: build >= 3x and verify >= 2x the reference. The last line
is the headline, for whichever of the two is nearer its target (milliseconds per call):

    toploc: ours=<ms> peer=<ms> ratio=<x> target=<y> ok|short

Usage: .venv/bin/python bench/toploc.py [--quick]   (needs scripts/setup-reference.sh)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Run as a script, this file's folder comes first on sys.path, and this file is named toploc too:
# drop the folder so that `import toploc` finds the reference package, and add the repository.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from intellect_node.crypto.toploc import build_proofs, unbind_proofs, verify_proofs  # noqa: E402

TARGETS = {"build": 3.0, "verify": 2.0}
CHUNK, TOPK = 32, 128
KEY = bytes(range(32))  # a row key, as protocol.rollouts.proof_key gives


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(ours: Callable[[], object], peer: Callable[[], object], rounds: int) -> dict[str, float]:
    ours(), peer()  # warm-up: tables, allocator, torch kernels
    mine, theirs = [], []
    for i in range(rounds):
        if i % 2:
            theirs.append(_time(peer))
            mine.append(_time(ours))
        else:
            mine.append(_time(ours))
            theirs.append(_time(peer))
    return {
        "ours": min(mine),
        "peer": min(theirs),
        "ours_median": statistics.median(mine),
        "peer_median": statistics.median(theirs),
    }


def pin(cores: int | None) -> None:
    """Restrict this process to its first ``cores`` allowed cores (None: all of them again)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    allowed = sorted(_ALL_CORES)
    os.sched_setaffinity(0, allowed if cores is None else allowed[:cores])


_ALL_CORES = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


Calls = dict[str, tuple[Callable[[], object], Callable[[], object]]]


def timed_calls(reference: Any, hidden: torch.Tensor, bound: list[bytes], proofs: list[bytes],
                recomputed: torch.Tensor) -> Calls:
    """Per operation, (ours, the reference's) on these tensors: bound here, so a pair kept past its
    loop iteration (the unpinned verify below) still times the inputs it was made for."""
    return {
        "build": (
            lambda: build_proofs(hidden, key=KEY),
            lambda: reference.build_proofs_bytes(hidden, CHUNK, TOPK, skip_prefill=True),
        ),
        "verify": (
            lambda: verify_proofs(recomputed, bound, key=KEY),
            lambda: reference.verify_proofs_bytes(recomputed, proofs, CHUNK, TOPK, skip_prefill=True),
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 tokens, 5 rounds (well under a minute)")
    args = parser.parse_args()
    tokens, rounds = (512, 5) if args.quick else (2048, 25)
    try:
        import toploc as reference
    except ImportError:
        print("the reference toploc is not installed: run scripts/setup-reference.sh")
        print(f"toploc: ours=nan peer=nan ratio=nan target={TARGETS['build']:.2f} short")
        return 1

    print(f"reference toploc {reference.__version__}, torch {torch.__version__}, {tokens} tokens, "
          f"chunks of {CHUNK}, top-{TOPK}, best of {rounds} rounds (median in brackets), ms per call")
    results: dict[tuple[str, int, int], dict[str, float]] = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        pin(threads)
        for width in (896, 4096):
            gen = torch.Generator().manual_seed(width)
            hidden = torch.randn(tokens, width, generator=gen).to(torch.bfloat16)
            proofs = reference.build_proofs_bytes(hidden, CHUNK, TOPK, skip_prefill=True)
            bound = build_proofs(hidden, key=KEY)
            assert unbind_proofs(bound, KEY) == proofs, "not byte-identical: the comparison would be void"
            recomputed = (hidden.float() * 1.01).to(torch.bfloat16)  # figures to compute, not zeros
            cases = timed_calls(reference, hidden, bound, proofs, recomputed)
            if width == 4096:
                verify_4096 = cases["verify"]
            for op, (ours, peer) in cases.items():
                r = measure(ours, peer, rounds)
                results[(op, width, threads)] = r
                print(f"{op:6s} ({tokens}, {width:4d}) threads={threads}: ours {r['ours']:7.2f} "
                      f"[{r['ours_median']:7.2f}]  reference {r['peer']:7.2f} [{r['peer_median']:7.2f}]  "
                      f"ratio {r['peer'] / r['ours']:5.2f}x")

    pin(None)
    torch.set_num_threads(1)
    r = measure(*verify_4096, rounds)
    print(f"verify ({tokens}, 4096) threads=1 unpinned (the reference's verifier on all cores): "
          f"ours {r['ours']:7.2f} [{r['ours_median']:7.2f}]  reference {r['peer']:7.2f} "
          f"[{r['peer_median']:7.2f}]  ratio {r['peer'] / r['ours']:5.2f}x (information, not the target)")

    margins = {op: results[(op, 4096, 1)]["peer"] / results[(op, 4096, 1)]["ours"] / TARGETS[op] for op in TARGETS}
    for op, margin in margins.items():
        print(f"target {op} at hidden 4096, 1 thread: >= {TARGETS[op]:.0f}x -> {'ok' if margin >= 1 else 'short'}")
    head = min(margins, key=lambda op: margins[op])
    r = results[(head, 4096, 1)]
    print(f"headline: {head}, ({tokens}, 4096) bf16, 1 thread, ms per call (best of {rounds})")
    status = "ok" if all(m >= 1 for m in margins.values()) else "short"
    print(f"toploc: ours={r['ours']:.2f} peer={r['peer']:.2f} ratio={r['peer'] / r['ours']:.2f} "
          f"target={TARGETS[head]:.2f} {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
