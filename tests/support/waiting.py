"""Waiting, in a trio test, for a state that other processes, hosts or libraries reach in their own
time: a node's status file, py-libp2p's connection table, a counter bumped by a handler. None of
them offers an event a test could wait on, so these poll, with a deadline. Node code waits on
events instead (ruff's ASYNC110 keeps polls out of it)."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def poll_until(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.05) -> None:
    """Return once ``predicate()`` holds; ``trio.TooSlowError`` past ``timeout_s``."""
    with trio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - the state is another party's, with no event to wait on
            await trio.sleep(poll_s)


async def poll_up_to(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.05) -> bool:
    """Whether ``predicate()`` held within ``timeout_s``: for a test that goes on either way (a
    settling period) or asserts with a message of its own."""
    with trio.move_on_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - as in poll_until
            await trio.sleep(poll_s)
        return True
    return False
