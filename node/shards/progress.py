"""What an operator sees while a checkpoint arrives: a rich bar per step, or log lines.

On a terminal each checkpoint gets a bar with bytes verified, rate and the number of peers that
served it. When stderr is a file (a service, the tests) a bar would fill the log with control
codes, so the same figures go to the log every few seconds instead.
"""

from __future__ import annotations

import logging
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

log = logging.getLogger(__name__)
LOG_EVERY_S = 5.0


class CheckpointProgress:
    def __init__(self, interactive: bool | None = None) -> None:
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self._bar: Progress | None = None
        self._tasks: dict[int, TaskID] = {}
        self._state: dict[int, tuple[int, int, set[str], float, float]] = {}  # done, total, peers, start, logged

    def start(self, step: int, total: int, done: int) -> None:
        now = time.monotonic()
        self._state[step] = (done, total, set(), now, now)
        if self.interactive:
            if self._bar is None:
                self._bar = Progress(TextColumn("step {task.fields[step]}"), BarColumn(), DownloadColumn(),
                                     TransferSpeedColumn(), TextColumn("{task.fields[peers]} peers"),
                                     console=Console(stderr=True))
                self._bar.start()
            self._tasks[step] = self._bar.add_task("", total=total, completed=done, step=step, peers=0)

    def advance(self, step: int, nbytes: int, peer_id: str) -> None:
        if step not in self._state:
            return
        done, total, peers, began, logged = self._state[step]
        peers.add(peer_id)
        done += nbytes
        now = time.monotonic()
        if self._bar is not None and step in self._tasks:
            self._bar.update(self._tasks[step], completed=done, peers=len(peers))
        elif now - logged >= LOG_EVERY_S:
            logged = now
            log.info("step %d: %.1f of %.1f MiB, %.1f MiB/s, %d peers", step, done / 2**20, total / 2**20,
                     done / 2**20 / max(now - began, 1e-3), len(peers))
        self._state[step] = (done, total, peers, began, logged)

    def finish(self, step: int, complete: bool) -> None:
        state = self._state.pop(step, None)
        if state is not None and complete:
            done, total, peers, began, _ = state
            log.info("step %d complete: %.1f MiB in %.1f s from %d peers", step, total / 2**20,
                     time.monotonic() - began, len(peers))
        if self._bar is not None and step in self._tasks:
            self._bar.remove_task(self._tasks.pop(step))
            if not self._tasks:
                self._bar.stop()
                self._bar = None
