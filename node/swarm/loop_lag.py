"""``LoopLag``: how long this process's event loop could not run its tasks, and ``LoopDeadline``,
a deadline on a peer that counts only the time the loop could serve it.

Why: a deadline on a peer (its first byte within 2 s, its answer within 10 s) measures the peer
only while our loop runs. On a loaded machine, or while a worker thread holds the GIL, the loop
stalls for seconds; when it resumes, trio expires every deadline that passed before it reads the
bytes already waiting in the socket. The guard then reset an honest peer's stream and charged it
5 points for a timeout that was our own (tests/test_loop_lag.py stalls a loop and shows it; twenty
such make a ban). A ``LoopDeadline`` that runs out gives the peer back the stall it saw, and only
a peer that had the whole deadline of our loop's time is blamed.

One monitor per trio run (a system task, started on first use): a tick every ``TICK_S`` measures
how late it woke. Its cost is four wake-ups a second per process, whatever the number of streams.
"""

from __future__ import annotations

import logging

import trio
from trio.lowlevel import RunVar, spawn_system_task

log = logging.getLogger(__name__)
TICK_S = 0.25
# A stall this long is logged: the node's peers waited for it (a loaded machine, work on the loop).
LOGGED_STALL_S = 2.0
# Lateness below this is the scheduler's ordinary jitter, not a stall.
JITTER_S = 0.02
# A deadline is extended by at most this many times its own length: a loop stalled for minutes is
# a node that cannot serve anyone, and waiting for ever on one stream is not better.
MAX_EXTENSION = 10.0

_RUN_LAG: RunVar[LoopLag] = RunVar("intellect_node_loop_lag")


class LoopLag:
    """Seconds the loop was late waking its tasks, summed since the monitor started."""

    def __init__(self) -> None:
        self._stalled_s = 0.0
        self._due: float | None = None  # when the tick should wake next (None: not running)

    async def run(self) -> None:
        try:
            while True:
                self._due = trio.current_time() + TICK_S
                await trio.sleep(TICK_S)
                late = trio.current_time() - self._due
                if late > JITTER_S:
                    self._stalled_s += late
                if late >= LOGGED_STALL_S:
                    log.info("this node's event loop stalled %.1f s (a loaded machine, or long work on the loop); "
                             "deadlines on peers were extended by it", late)
        finally:
            self._due = None

    def stalled_s(self) -> float:
        """The stall so far, including one the tick has not woken from yet: when the loop resumes,
        a deadline that expired may run before the tick does."""
        pending = 0.0
        if self._due is not None:
            late = trio.current_time() - self._due
            pending = late if late > JITTER_S else 0.0
        return self._stalled_s + pending


def loop_lag() -> LoopLag:
    """This trio run's monitor, started on first use (as a system task, it lives as long as the run)."""
    try:
        return _RUN_LAG.get()
    except LookupError:
        lag = LoopLag()
        _RUN_LAG.set(lag)
        spawn_system_task(lag.run, name="intellect_node.loop_lag")
        return lag


class LoopDeadline:
    """``seconds`` of this loop's time for a peer, from now.

    Wait in steps: ``with trio.move_on_after(deadline.next_wait())`` around a wait that may be
    repeated, until ``next_wait()`` says 0: the peer has had its whole time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lag = loop_lag()
        self._stalled_at_start = self._lag.stalled_s()
        self._credited = 0.0
        self._waits = 0

    def next_wait(self) -> float:
        """How long to wait next: the whole deadline first, then the stall seen since and not yet
        given back (0: none, or the extension's cap reached)."""
        self._waits += 1
        if self._waits == 1:
            return self.seconds
        owed = self.stall_seen() - self._credited
        cap = self.seconds * MAX_EXTENSION - self._credited
        give = min(owed, cap)
        if give <= JITTER_S:
            return 0.0
        self._credited += give
        return give

    def stall_seen(self) -> float:
        """How long this loop stalled since the deadline started."""
        return self._lag.stalled_s() - self._stalled_at_start
