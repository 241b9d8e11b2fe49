"""``LoopDeadline``: a deadline on a peer that a stall of this node's own event loop does not run out.

Why: a deadline on a peer (its first byte within 2 s, its answer within 10 s) measures the peer
only while our loop runs. On a loaded machine, or while a worker thread holds the GIL, the loop
stalls for seconds; when it resumes, trio expires every deadline that passed before it runs the
tasks that read the bytes already waiting in the socket. The guard then reset an honest peer's
stream and charged it 5 points for a timeout that was our own (tests/test_loop_deadline.py stalls
a loop and shows it; twenty such make a ban).

How it tells: a deadline that fires on time was waited out by a loop that ran; one that fires
late (``late_by``) fired after a stall that spans it, and the bytes that came meanwhile are read
in the loop's next turn. A stall that ended before the deadline costs the peer nothing: the loop
read its bytes then. So a late deadline gives the peer its lateness again (at least ``GRACE_S``),
and only a deadline that fired on time blames the peer. No monitor task, no timer: a node at rest
pays nothing for it.
"""

from __future__ import annotations

import logging

import trio

log = logging.getLogger(__name__)
# A deadline handled this late was held up by a stall of the loop, not by the scheduler's ordinary
# jitter (a busy 2-core machine turns the loop in a few to tens of milliseconds).
LATE_S = 0.25
# The least a late deadline gives back: one turn of the loop reads what the stall held up.
GRACE_S = 0.5
# A deadline gives back at most this many times its own length: a loop stalled for minutes is a
# node that cannot serve anyone, and waiting for ever on one stream is not better.
MAX_EXTENSION = 10.0
# A stall this long is logged: the node's peers waited for it (a loaded machine, work on the loop).
LOGGED_STALL_S = 2.0


def late_by(deadline: float) -> float:
    """How long after ``deadline`` (trio time) the loop got round to it: more than ``LATE_S`` means
    a stall of this node's loop spans it."""
    late = trio.current_time() - deadline
    if late >= LOGGED_STALL_S:
        log.info("a deadline on a peer ran %.1f s late (this node's event loop stalled: a loaded machine, "
                 "or long work on the loop); the peer is not blamed for it", late)
    return late


class LoopDeadline:
    """``seconds`` for a peer, from now, not counting a stall of this loop that spans the end.

    Wait in steps, ``with trio.move_on_after(deadline.next_wait())`` around a wait that may be
    repeated, until ``next_wait()`` says 0: the last wait ran out on time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._due: float | None = None
        self._given = 0.0

    def next_wait(self) -> float:
        """The whole deadline first; then, each time the last wait ran out late, that lateness again
        (at least ``GRACE_S``, at most ``MAX_EXTENSION`` times the deadline in all); 0 once a wait
        ran out on time."""
        if self._due is None:
            self._due = trio.current_time() + self.seconds
            return self.seconds
        late = late_by(self._due)
        give = min(max(late, GRACE_S), self.seconds * MAX_EXTENSION - self._given)
        if late <= LATE_S or give <= 0:
            return 0.0
        self._given += give
        self._due = trio.current_time() + give
        return give
