"""``kill -USR1`` on a node: every trio task's await stack goes to the log (node.app.task_dump)."""

from __future__ import annotations

import logging
import os
import signal

import trio
import trio.testing

from intellect_node.node.app.task_dump import await_stacks, dump_on_signal
from tests.support.waiting import poll_until


async def waits_for_an_event_that_never_comes(event: trio.Event) -> None:
    await event.wait()


async def test_the_stacks_name_each_task_and_where_it_waits() -> None:
    event = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waits_for_an_event_that_never_comes, event, name="stuck-judge")
        await trio.testing.wait_all_tasks_blocked()
        stacks = await_stacks()
        nursery.cancel_scope.cancel()
    lines = stacks.splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip() == "task stuck-judge")
    assert "in waits_for_an_event_that_never_comes" in lines[index + 1]  # the task's own coroutine
    assert any("_sync.py" in line and "in wait" in line for line in lines[index + 1:index + 4])  # then Event.wait
    assert lines[index].startswith("  ")  # indented under the test's task


async def test_sigusr1_logs_the_stacks(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="intellect_node.node.app.task_dump")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dump_on_signal)
        await trio.testing.wait_all_tasks_blocked()
        os.kill(os.getpid(), signal.SIGUSR1)
        await poll_until(lambda: caplog.records, 5, poll_s=0.01)
        nursery.cancel_scope.cancel()
    text = caplog.records[0].getMessage()
    assert "on SIGUSR1" in text and "in dump_on_signal" in text
