"""Math answers: the last ``\\boxed{...}`` of a completion, checked by symbolic equivalence.

Equivalence is math-verify's (LaTeX -> sympy, then numeric and symbolic comparison), so
``\\boxed{0.5}``, ``\\boxed{1/2}`` and ``\\boxed{\\dfrac{2}{4}}`` all match a ground truth of
``\\frac{1}{2}``. A completion without a box scores nothing: INTELLECT-2's prompts ask for one.

Sympy can run for minutes or exhaust memory on a hostile answer (``\\boxed{9^{9^{9^9}}}``), so
every check has a time limit. math-verify's own limit uses ``signal.alarm``: it works only in the
main thread (the node verifies from worker threads) and cannot interrupt a long big-integer
operation in C. So every check runs in one long-lived child process (memory-capped) that is
killed and replaced when it overruns; a check costs a pipe round trip, the child's start (about
a second, importing sympy) is paid once.
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import threading
from typing import Any

_BOX_MARKERS = ("\\boxed", "\\fbox")
_MAX_ANSWER_CHARS = 1000  # longer boxed answers are refused outright: no honest answer is that long
_CHILD_START_TIMEOUT_S = 120.0
_CHILD_MEMORY_BYTES = 2 << 30


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), or None when there is none."""
    start = max(text.rfind(marker) for marker in _BOX_MARKERS)
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0 or text[start:open_at].strip() not in _BOX_MARKERS:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def _equivalent(answer: str, ground_truth: str, timeout_s: int | None) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs: list[Any] = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold = parse(f"${ground_truth}$", extraction_config=configs, parsing_timeout=timeout_s)
    got = parse(f"$\\boxed{{{answer}}}$", extraction_config=configs, parsing_timeout=timeout_s)
    if not gold or not got:
        return False
    return bool(verify(gold, got, timeout_seconds=timeout_s))


def _child_main() -> None:
    """Loop of the verifier child: one JSON request per stdin line, "1" or "0" per stdout line."""
    import resource

    import math_verify  # noqa: F401  (import before announcing readiness: it takes a second)

    resource.setrlimit(resource.RLIMIT_AS, (_CHILD_MEMORY_BYTES, _CHILD_MEMORY_BYTES))
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            ok = _equivalent(request["answer"], request["ground_truth"], None)
        except Exception:  # MemoryError included: hostile input is a wrong answer, not a crash
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


class _ChildVerifier:
    """One verifier child process shared by all threads; replaced after a timeout.

    A plain ``python -m`` subprocess speaking JSON lines, not ``multiprocessing``: spawn would
    re-import the caller's ``__main__`` (which breaks unguarded scripts) and fork is unsafe in a
    threaded process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def _read_line(self, process: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], timeout_s)
        return process.stdout.readline() if ready else None

    def _start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        if self._read_line(process, _CHILD_START_TIMEOUT_S) != b"ready\n":
            process.kill()
            process.wait()
            raise RuntimeError("math verifier child did not start")
        self._process = process
        return process

    def close(self) -> None:
        """Stop the child (at interpreter exit); a later check would start a new one."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for pipe in (self._process.stdin, self._process.stdout):
                if pipe is not None:
                    pipe.close()
        self._process = None

    def check(self, answer: str, ground_truth: str, timeout_s: float) -> bool:
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                self._stop()
                process = self._start()
            assert process.stdin is not None
            request = json.dumps({"answer": answer, "ground_truth": ground_truth})
            process.stdin.write(request.encode() + b"\n")
            reply = self._read_line(process, timeout_s)
            if reply in (b"1\n", b"0\n"):
                return reply == b"1\n"
            self._stop()  # overran or died: kill it, the next call starts a fresh one
            return False


_CHILD = _ChildVerifier()
atexit.register(_CHILD.close)


def verify_math(
    completion: str, verification_info: dict[str, Any], timeout_s: float = 5.0
) -> bool:
    """True when the completion's last boxed answer equals ``verification_info["ground_truth"]``.

    A check that exceeds ``timeout_s`` counts as wrong.
    """
    answer = last_boxed(completion)
    if answer is None or not answer.strip() or len(answer) > _MAX_ANSWER_CHARS:
        return False
    return _CHILD.check(answer, str(verification_info["ground_truth"]), timeout_s)


if __name__ == "__main__":
    _child_main()
