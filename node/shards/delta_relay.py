"""Passing delta bodies on instead of a star from the trainer (specs/deltas.md section 4).

A delta body is megabytes, but every follower needs it at once: sent by the trainer alone, a step
costs its uplink one body per follower. ``DeltaSeeds`` is what every server (the trainer's and each
member's) keeps per step: whom it handed the body to; past ``[shards] delta_seed_copies`` copies it
refuses with the names of those holders, and sends again only after a hold with no upload under
way (they may have left). So the body spreads as a tree with that fan-out, and no node's uplink
carries more than a few bodies a step. ``HeldBodies`` is a follower's side: a body whose hash
matched the signed manifest is served from then on, before its step is built (the body is what the
next follower needs, and it checks it again), from an anonymous in-memory file, so the server
sends it as it sends any file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

KEPT_STEPS = 8  # steps whose hand-outs a server remembers: the async window and then some


@dataclass
class _Handouts:
    holders: list[str] = field(default_factory=list)  # newest last: peers that serve
    handed: int = 0  # copies sent whole, or being sent, to peers that serve
    uploading: int = 0
    last_end: float = float("-inf")


class DeltaSeeds:
    """One server's hand-outs of delta bodies, by step: whether to send one more or name holders."""

    def __init__(self, copies: int, hold_s: float, max_named: int) -> None:
        self.copies, self.hold_s, self.max_named = copies, hold_s, max_named
        self._steps: dict[int, _Handouts] = {}

    def refusal(self, step: int, now: float) -> list[str] | None:
        """The holders to name in a 409 for ``step``'s body, newest first; None: send it."""
        handouts = self._steps.get(step)
        if handouts is None or handouts.handed < self.copies or not handouts.holders:
            return None
        if not handouts.uploading and now - handouts.last_end > self.hold_s:
            return None  # nothing under way for a hold: the holders may be gone, send one more
        return handouts.holders[::-1][:self.max_named]

    def started(self, step: int, peer: str) -> None:
        """An upload of ``step``'s body to ``peer``, a member that serves, begins."""
        handouts = self._steps.get(step)
        if handouts is None:
            handouts = self._steps[step] = _Handouts()
            for old in sorted(self._steps)[:-KEPT_STEPS]:
                del self._steps[old]
        handouts.handed += 1
        handouts.uploading += 1
        if peer in handouts.holders:
            handouts.holders.remove(peer)
        handouts.holders.append(peer)
        del handouts.holders[:-self.max_named]

    def ended(self, step: int, peer: str, now: float, whole: bool) -> None:
        """That upload ended; one that did not arrive whole is no copy and names no holder."""
        handouts = self._steps.get(step)
        if handouts is None:
            return
        handouts.uploading -= 1
        handouts.last_end = now
        if not whole:
            handouts.handed -= 1
            if peer in handouts.holders:
                handouts.holders.remove(peer)


class HeldBodies:
    """Verified delta bodies of steps being built here, by step, each in a memfd."""

    def __init__(self) -> None:
        self._files: dict[int, tuple[int, int]] = {}  # step -> (descriptor, size)

    def hold(self, step: int, body: bytes) -> None:
        self.release(step)
        fd = os.memfd_create(f"delta-{step}", os.MFD_CLOEXEC)
        view, written = memoryview(body), 0
        try:
            while written < len(body):
                written += os.write(fd, view[written:])
        except BaseException:
            os.close(fd)
            raise
        self._files[step] = (fd, len(body))

    def open(self, step: int) -> tuple[int, int] | None:
        """(a descriptor of its own for the caller to close, size), or None if none is held."""
        held = self._files.get(step)
        return None if held is None else (os.dup(held[0]), held[1])

    def release(self, step: int) -> None:
        held = self._files.pop(step, None)
        if held is not None:
            os.close(held[0])
