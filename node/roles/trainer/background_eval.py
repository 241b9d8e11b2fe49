"""``BackgroundEvaluations``: the trainer's held-out evaluations, off the path of its steps.

An evaluation answers a few hundred held-out prompts greedily: on SmolLM2-135M and two shared cores
that took the trainer 60 to 300 s, and while it ran in the loop the trainer neither trained on the
groups that had arrived nor published its step. The starting point's evaluation alone held the
first step back by five minutes (bench/HISTORY.md, "Evaluations off the step's path"). So the loop
hands a copy of the policy to this runner and goes on: the copy is evaluated in a worker thread
while the trainer gathers, trains and publishes, and its line reaches ``metrics.jsonl`` when done.

At most one copy waits: a newer step's copy replaces a waiting older one (which is logged), so a
trainer whose steps outpace evaluations holds two copies of the weights at most (the one being
evaluated and the newest) and reports the newest policy it could measure. The evaluation being run
always finishes: the starting point's, submitted before any step, is always measured.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from torch import nn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalJob:
    step: int
    model: nn.Module  # a copy of the policy of ``step``, owned by the job


class BackgroundEvaluations:
    def __init__(self, evaluate: Callable[[nn.Module], float],
                 record: Callable[[int, float], Awaitable[None]]) -> None:
        """``evaluate(model)``: the held-out accuracy (runs in a worker thread); ``record(step,
        accuracy)``: called on the trio loop with each result, in step order."""
        self._evaluate = evaluate
        self._record = record
        self._waiting: EvalJob | None = None
        self._submitted = trio.Event()
        self.running_step: int | None = None
        self.replaced = 0  # copies dropped for a newer step's before they were evaluated
        self.failed = 0  # evaluations that raised (logged; nothing recorded for their step)
        self.submitted_step: int | None = None  # the newest step handed over

    def submit(self, step: int, model: nn.Module) -> None:
        """Queue ``model`` (a copy the caller will not touch again) as the policy of ``step``."""
        if self._waiting is not None:
            self.replaced += 1
            log.info("the evaluation of step %d is skipped: step %d's is newer and the one of step %s still runs",
                     self._waiting.step, step, self.running_step)
        self._waiting = EvalJob(step, model)
        self.submitted_step = step
        self._submitted.set()

    async def submit_copy(self, step: int, policy: Callable[[], nn.Module]) -> None:
        """Submit a copy of ``policy()`` as it is now, made in a worker thread (hundreds of MB for
        a real model; ``policy`` may gather a sharded model's weights): the trainer goes on after."""
        self.submit(step, await trio.to_thread.run_sync(lambda: copy.deepcopy(policy()).requires_grad_(False)))

    @property
    def pending(self) -> int:
        """Evaluations submitted and not yet recorded (0, 1 or 2)."""
        return (self._waiting is not None) + (self.running_step is not None)

    async def run(self) -> None:
        """Evaluate what is submitted, one at a time, until cancelled. A cancelled evaluation's
        thread is abandoned (it only reads its own copy): a stopping node does not wait for it."""
        while True:
            while self._waiting is None:
                self._submitted = trio.Event()
                await self._submitted.wait()
            job, self._waiting = self._waiting, None
            self.running_step = job.step
            try:
                accuracy = await trio.to_thread.run_sync(self._evaluate, job.model, abandon_on_cancel=True)
            except Exception:  # a measurement that failed (memory, a bad prompt) must not stop training
                self.failed += 1
                log.exception("the evaluation of step %d failed; training goes on", job.step)
                continue
            finally:
                self.running_step = None
            await self._record(job.step, accuracy)
