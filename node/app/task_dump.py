"""What is every task of a running node waiting on: ``kill -USR1 <pid>`` writes it to the log.

A node that stops making progress without failing (a service awaiting something that never
comes) shows nothing in its log and nothing in ``status`` but stale counters. A Python traceback
of the main thread would show only trio's scheduler; what an operator needs is each trio task's
chain of awaits, innermost last, which ``trio.lowlevel.Task.iter_await_frames`` gives.
"""

from __future__ import annotations

import logging
import signal

import trio

log = logging.getLogger(__name__)


def await_stacks() -> str:
    """Every trio task of this run, indented under the nursery that owns it, with the file:line of
    each coroutine it is suspended in (outermost first)."""
    lines: list[str] = []

    def visit(task: trio.lowlevel.Task, depth: int) -> None:
        lines.append(f"{'  ' * depth}task {task.name}")
        for frame, lineno in task.iter_await_frames():
            lines.append(f"{'  ' * depth}  {frame.f_code.co_filename}:{lineno} in {frame.f_code.co_name}")
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                visit(child, depth + 1)

    visit(trio.lowlevel.current_root_task(), 0)
    return "\n".join(lines)


async def dump_on_signal(signum: int = signal.SIGUSR1) -> None:
    """Log ``await_stacks()`` at WARNING each time the process receives ``signum``."""
    with trio.open_signal_receiver(signum) as signals:
        async for _ in signals:
            log.warning("await stacks of every task (on %s):\n%s", signal.Signals(signum).name, await_stacks())
