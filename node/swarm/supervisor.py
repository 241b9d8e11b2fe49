"""Keep the node's services running: one failing service is restarted, never the node's end.

A service (a role's loop, the shard overlay, membership upkeep, the control socket) runs in the
node's nursery; before, an exception in any of them cancelled the nursery and ended the node. Now
each runs under ``Supervisor.run``: a failure is logged with its traceback, the service is started
again after a backoff that doubles up to ``MAX_BACKOFF_S`` (reset after ``STABLE_S`` of good
running), and ``states`` tells ``status`` (under ``supervisor``) what happened. Only the host itself is allowed to end
the node (``HostFailed``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import trio

log = logging.getLogger(__name__)
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
STABLE_S = 60.0  # a service that ran this long before failing starts again from the first backoff

# Called with task_status; calls task_status.started() when ready, then runs until cancelled.
Startable = Callable[..., Awaitable[None]]


class HostFailed(Exception):
    """The libp2p host (or its pubsub, DHT) failed: the node cannot go on without it."""


@dataclass
class ServiceState:
    state: str = "starting"  # running, restarting, finished
    restarts: int = 0
    last_error: str = ""


def at_once(loop: Callable[[], Awaitable[None]]) -> Startable:
    """A plain loop as a ``Startable`` that is ready as soon as it starts."""

    async def started(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await loop()

    return started


class Supervisor:
    def __init__(self) -> None:
        self.states: dict[str, ServiceState] = {}

    async def run(self, name: str, start: Startable,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run ``start`` and restart it whenever it raises; reports started after its first start,
        or after its first failure (the node does not wait for a service that cannot start)."""
        state = self.states[name] = ServiceState()
        backoff, reported = FIRST_BACKOFF_S, False
        while True:
            began = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(start)
                    state.state = "running"
                    if not reported:
                        task_status.started()
                        reported = True
                state.state = "finished"
                return
            except Exception as exc:
                if trio.current_time() - began >= STABLE_S:
                    backoff = FIRST_BACKOFF_S
                state.state, state.restarts = "restarting", state.restarts + 1
                cause = _innermost(exc)
                state.last_error = f"{type(cause).__name__}: {cause}"[:300]
                log.error("service %s failed; restarting in %g s", name, backoff, exc_info=exc)
                if not reported:
                    task_status.started()
                    reported = True
                await trio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {name: asdict(state) for name, state in self.states.items()}


def _innermost(exc: BaseException) -> BaseException:
    """The error itself rather than the one-member groups trio's nurseries wrap it in."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
