"""``Dispatch``: how a worker's envelopes reach the run's receivers (trainers and validators).

A batch goes to every receiver at once. The worker waits for their answers only
``BATCH_WAIT_S``: a receiver that is slow to answer (a validator verifying on a loaded machine, a
trainer mid-step; ``deliver`` waits up to 60 s for a reply and retries 5 times) must not stop the
worker from generating for the others. In a slow run of the tiny demo (bench/HISTORY.md) both
workers delivered nothing for a minute after each checkpoint while one receiver was slow, and the
trainer took partial batches. A delivery still running after the wait goes on in the background,
at most ``MAX_PENDING_PER_RECEIVER`` per receiver; past that, or when it fails, the batch waits in
the outbox (``outbox.py``) and is offered again with backoff while its step can still be trained.

Commitments are sent with ``send``, which waits for every answer: what the worker may generate
depends on them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from intellect_node.node.roles.inference.outbox import Outbox
from intellect_node.node.rollouts.exchange import DeliveryFailed, DeliveryRejected, deliver

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
BATCH_WAIT_S = 10.0  # how long a batch's delivery holds the worker back from its next batch
MAX_PENDING_PER_RECEIVER = 2  # deliveries to one receiver still running after that wait
REDELIVER_POLL_S = 1.0  # how often the outbox is looked at for batches due again
IDLE_POLL_S = 0.5


class Dispatch:
    """Sends envelopes to ``receivers()``; ``delivered`` (the worker's tally) counts batch answers."""

    def __init__(self, node: NodeContext, receivers: Callable[[], list[str]],
                 oldest_useful_step: Callable[[], int], delivered: dict[str, int]) -> None:
        self.node, self.receivers, self.oldest_useful_step = node, receivers, oldest_useful_step
        self.outbox = Outbox()  # batches a receiver could not take yet (one restarting, say)
        self.delivered = delivered
        self.backgrounded = 0  # batches whose delivery outlasted BATCH_WAIT_S
        self._pending: Counter[str] = Counter()  # receiver -> deliveries running in the background
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the background deliveries and offer the outbox's batches again as they fall due."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(REDELIVER_POLL_S)
                for entry, receivers in self.outbox.due(time.monotonic(), self.oldest_useful_step()):
                    answers = await self.send(entry.envelope, receivers)
                    self.outbox.settle(entry, answers, time.monotonic())
                    log.info("batch of step %d offered again: %s", entry.step, answers)

    async def batch(self, envelope: bytes, step: int) -> None:
        """Deliver a batch of ``step`` to every receiver; return once all answered or after
        ``BATCH_WAIT_S``, whichever is first."""
        receivers = await self._some_receivers()
        busy = [r for r in receivers if self._pending[r] >= MAX_PENDING_PER_RECEIVER]
        self.outbox.keep(step, envelope, busy, time.monotonic())
        sending = [r for r in receivers if r not in busy]
        left = set(sending)
        all_answered = trio.Event()

        async def one(peer_id: str) -> None:
            answer = await self._answer(peer_id, envelope)
            self.delivered[answer] = self.delivered.get(answer, 0) + 1
            if answer == "failed":
                self.outbox.keep(step, envelope, [peer_id], time.monotonic())
            left.discard(peer_id)
            if not left:
                all_answered.set()

        async def backgrounded(peer_id: str) -> None:
            self._pending[peer_id] += 1
            try:
                await one(peer_id)
            finally:
                self._pending[peer_id] -= 1

        assert self._nursery is not None, "Dispatch.run is not running"
        for peer_id in sending:
            self._nursery.start_soon(backgrounded, peer_id)
        if not sending:
            return
        with trio.move_on_after(BATCH_WAIT_S):
            await all_answered.wait()
        if left:
            self.backgrounded += 1
            log.info("batch of step %d: %d receivers still answering after %.0f s, carrying on",
                     step, len(left), BATCH_WAIT_S)

    async def send(self, envelope: bytes, receivers: list[str] | None = None) -> dict[str, str]:
        """Send to ``receivers`` (default: every receiver known; with none yet, wait for one:
        backpressure) at once and wait for each one's answer, or "rejected" / "failed"."""
        receivers = receivers or await self._some_receivers()
        answers = ["failed"] * len(receivers)

        async def one(index: int, peer_id: str) -> None:
            answers[index] = await self._answer(peer_id, envelope)

        async with trio.open_nursery() as nursery:
            for index, peer_id in enumerate(receivers):
                nursery.start_soon(one, index, peer_id)
        return dict(zip(receivers, answers, strict=True))

    def status(self) -> dict[str, object]:
        return {**self.outbox.status(), "backgrounded": self.backgrounded,
                "in_background": sum(self._pending.values())}

    async def _some_receivers(self) -> list[str]:
        receivers = self.receivers()
        while not receivers:  # the view has no event for a receiver's arrival: poll it
            await trio.sleep(IDLE_POLL_S)
            receivers = self.receivers()
        return receivers

    async def _answer(self, peer_id: str, envelope: bytes) -> str:
        try:
            return await deliver(self.node, peer_id, envelope)
        except DeliveryRejected as exc:
            log.warning("%s", exc)
            return "rejected"
        except DeliveryFailed as exc:
            log.warning("not delivered to %s: %s", peer_id, exc)
            return "failed"
