"""``assert`` test cases, judged so that the program under test cannot forge or steer the verdict.

Why two sandboxes: anything the harness decides inside the program's interpreter the program can
reach (frames, ``gc``, ``sys.settrace``, ``atexit``, ``os._exit(0)``, an ``__eq__`` that is always
True). So the program runs alone in one sandbox (``serve`` mode of ``_sandbox_boot.py``) and only
answers calls to its top-level functions with plain values (None, bool, int, float, str, bytes,
complex, and list/tuple/set/frozenset/dict of those, checked by exact type). The task's test code
runs in a second sandbox (``check`` mode) that never executes model-written code: the program's
functions are proxies there, the values compared are ones the checker decoded itself, and the pass
record is written to a file of the node's only after the test code returned normally. The node
reads that record; no exit status decides anything.

What a program can still do: answer each call with any plain value it likes (which is what solving
is; hard-coded answers pass as they would anywhere), and fail in any way it wants. Tests that need
more than plain values from the program (its classes, objects, mutated arguments) fail; the
program must not shadow builtins the test code relies on (such names are never imported).
"""

from __future__ import annotations

import os
import time

from intellect_node.node.tasks.sandbox import _STARTUP_S, Sandboxes, SandboxLimits, read_capped, wait

PASSED = b'{"passed": true}\n'


def passes_asserts(program: str, test: str, limits: SandboxLimits | None = None) -> bool:
    """True when ``test`` (e.g. ``assert add(1, 2) == 3``) runs to its end against ``program``.

    Raises ``SandboxUnavailable`` when the machine cannot isolate code.
    """
    limits = limits or SandboxLimits()
    started = time.monotonic()
    with Sandboxes(limits) as boxes:
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        result = boxes.workspace.output("check-result")
        try:
            boxes.start("program", {"mode": "serve", "program": program, "requests_fd": requests_r,
                                    "answers_fd": answers_w}, pass_fds=(requests_r, answers_w))
            checker = boxes.start("check", {"mode": "check", "test": test, "requests_fd": requests_w,
                                            "answers_fd": answers_r, "result_fd": result},
                                  pass_fds=(requests_w, answers_r, result))
        finally:
            for fd in (requests_r, requests_w, answers_r, answers_w, result):
                os.close(fd)
        wait(checker, started + limits.timeout_s + _STARTUP_S)
        return read_capped(boxes.workspace.path / "check-result", len(PASSED) + 1) == PASSED
