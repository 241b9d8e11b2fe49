"""What kernel isolation costs per program: HumanEval's reference solutions, sandboxed vs not.

"peer" is the baseline a judge without isolation would use: the same interpreter started as
``python -I -c PROGRAM`` in a plain subprocess, PROGRAM being the problem's prompt, reference
solution, tests and ``check(entry_point)`` in one module; it must exit 0. "ours" is what the node
pays to score the same answer: ``verify_code`` on the completion (two bubblewrap + seccomp
sandboxes, the program serving its functions to the checker that runs the tests, the pass record
read back), which must return True. Also printed, not judged: ``run_python`` on PROGRAM (one
sandbox, exit status), the isolation alone. Both sides run alternately, problem by problem, so
the shared machine's noise falls on both; each figure is wall-clock ms per program.

Target (issue 31): isolation costs at most 50 ms per program, i.e. ``ours - peer <= 50``.

    .venv/bin/python bench/sandbox.py [--quick] [--problems N] [--repeats R]

The last line is ``sandbox: ours=<ms/program> peer=<ms/program> ratio=<ours/peer> target=50 ok|short``
(target: the most ms per program that ours may add to peer).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from intellect_node.node.tasks.code_verifier import verify_code  # noqa: E402
from intellect_node.node.tasks.humaneval import canonical_answer, humaneval_task, read_humaneval  # noqa: E402
from intellect_node.node.tasks.sandbox import require_sandbox, run_python  # noqa: E402

TARGET_MS = 50.0
PYTHON = os.path.realpath(sys.executable)  # the interpreter the sandbox runs, without the venv


def whole_program(record: dict) -> str:
    """The reference solution and HumanEval's tests as one module, as an unisolated judge runs it."""
    return f"{record['prompt']}{record['canonical_solution']}\n\n{record['test']}\n\ncheck({record['entry_point']})\n"


def plain(program: str) -> bool:
    done = subprocess.run([PYTHON, "-I", "-c", program], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    return done.returncode == 0


def timed(check: Callable[[], bool], what: str) -> float:
    started = time.perf_counter()
    if not check():
        raise SystemExit(f"{what}: a reference solution failed")
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the first 40 problems once (under a minute)")
    parser.add_argument("--problems", type=int, default=None, help="how many problems [164; 40 with --quick]")
    parser.add_argument("--repeats", type=int, default=None, help="passes over the problems [3; 1 with --quick]")
    args = parser.parse_args()
    count = args.problems or (40 if args.quick else 164)
    repeats = args.repeats or (1 if args.quick else 3)
    require_sandbox()
    records = read_humaneval()[:count]
    print(f"{len(records)} HumanEval reference solutions x {repeats}; interpreter {PYTHON}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    timed(lambda: plain("pass"), "warm-up")
    timed(lambda: run_python("pass").ok, "warm-up")
    ours: list[float] = []
    peer: list[float] = []
    alone: list[float] = []
    for _ in range(repeats):
        for record in records:
            program, task = whole_program(record), humaneval_task(record)
            peer.append(timed(lambda program=program: plain(program), f"peer {record['task_id']}"))
            alone.append(timed(lambda program=program: run_python(program).ok, f"run_python {record['task_id']}"))
            ours.append(timed(lambda record=record, task=task: verify_code(canonical_answer(record),
                                                                           task.verification_info),
                              f"verify_code {record['task_id']}"))
    for name, values in (("peer, python -I", peer), ("run_python, one sandbox", alone), ("verify_code", ours)):
        print(f"{name:<24} mean {statistics.mean(values):6.1f} ms  median {statistics.median(values):6.1f} ms  "
              f"p90 {statistics.quantiles(values, n=10)[-1]:6.1f} ms")
    ours_ms, peer_ms = statistics.mean(ours), statistics.mean(peer)
    print(f"isolation adds {statistics.mean(alone) - peer_ms:.1f} ms per program alone, "
          f"{ours_ms - peer_ms:.1f} ms as the node scores it (verify_code)")
    print(f"sandbox: ours={ours_ms:.1f} peer={peer_ms:.1f} ratio={ours_ms / peer_ms:.2f} target={TARGET_MS:g} "
          f"{'ok' if ours_ms - peer_ms <= TARGET_MS else 'short'}")


if __name__ == "__main__":
    main()
