"""The child-process reaper: ends what a test module left running and names it in a warning.

Integration tests start real nodes, averager children, sandboxes and helper processes. A test that
fails half-way can leave one running, which then holds a port, a file lock or a core for the rest
of the run (and on CI, for the next job). Every live descendant is terminated (SIGTERM, then
SIGKILL after a grace period) and named, so a leak is seen and fixed rather than piling up.
"""

from __future__ import annotations

import os
import warnings

import psutil

GRACE_S = 5.0
# multiprocessing's own helpers live as long as the interpreter by design and are shared by tests
INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def reap_children(where: str) -> list[str]:
    """Terminate every live descendant of this process; return what was reaped, for the warning."""
    described = [(c, _describe(c)) for c in psutil.Process(os.getpid()).children(recursive=True) if _alive(c)]
    leftovers = [(c, name) for c, name in described if not any(h in name for h in INTERPRETER_HELPERS)]
    if not leftovers:
        return []
    children, names = [c for c, _ in leftovers], [name for _, name in leftovers]
    for child in children:
        _signal(child, "terminate")
    _, alive = psutil.wait_procs(children, timeout=GRACE_S)
    for child in alive:
        _signal(child, "kill")
    psutil.wait_procs(alive, timeout=GRACE_S)
    warnings.warn(f"{where} left {len(names)} process(es) running, reaped: {names}", stacklevel=1)
    return names


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:120]}"
    except psutil.Error:
        return str(process.pid)


def _signal(process: psutil.Process, how: str) -> None:
    try:
        getattr(process, how)()
    except psutil.Error:
        pass  # already gone
