"""Delivering rollout batches over streams (``/ina/rollouts/1.0.0``, specs/rollouts.md).

``RolloutReceiver`` is the service validators and trainers run: it checks each incoming batch as a
wire message, stores it durably in a ``RolloutInbox`` and only then acknowledges. The same stream
carries a worker's ``work_commitment`` (the envelope's type says which), handed to the judge's
``on_commitment`` (its commitment book), whose answer goes back as the reply. ``deliver`` is
the worker's side: it retries until the receiver answers, which is safe because storage is keyed by
the envelope's hash (a retry of a stored batch is answered ``duplicate``).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from intellect_node.node.rollouts.inbox import InboxFull, RolloutInbox
from intellect_node.node.swarm.context import NodeContext
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.errors import InvalidValue, Rejected
from intellect_node.protocol.framing import (
    MAX_DELIVERY_REPLY,
    ROLLOUTS_PROTOCOL,
    decode_delivery_reply,
    encode_delivery_reply,
)
from intellect_node.protocol.rollouts import RolloutAnnouncement, RolloutBatch

log = logging.getLogger(__name__)
# the roles that receive batches: a worker delivers to their members, a node with one runs the receiver
RECEIVER_ROLES = frozenset({"trainer", "validator"})
READ_TIMEOUT_S = 60.0
MAX_CONCURRENT_BATCHES = 4
# the book's answers; too_many_groups is charged (no honest worker sends it), the others cost nothing
COMMITMENT_ANSWERS = frozenset({"stored", "late", "early", "duplicate", "busy", "too_many_groups"})
CommitmentHandler = Callable[[codec.Signed[WorkCommitment]], str]


class DeliveryFailed(Exception):
    """No answer from the receiver after every retry."""


class DeliveryRejected(DeliveryFailed):
    """The receiver refused the batch; retrying the same bytes cannot help."""


class RolloutReceiver:
    """Accepts rollout batches into an inbox; ``on_stored(digest, signed)`` hears of each new one,
    ``on_commitment(signed)`` answers each work commitment (None: this node judges nothing)."""

    def __init__(self, inbox: RolloutInbox,
                 on_stored: Callable[[str, codec.Signed[RolloutBatch]], None] | None = None,
                 on_commitment: CommitmentHandler | None = None) -> None:
        self.inbox = inbox
        self.on_stored = on_stored
        self.on_commitment = on_commitment
        self.name = "rollouts"
        self.received: Counter[str] = Counter()  # batches by outcome: stored, duplicate, busy, rejected
        self.commitments: Counter[str] = Counter()  # commitments by answer: stored, late, duplicate, ...
        self.announced = 0  # batches workers announced on gossip, delivered here or elsewhere
        self._slots = trio.Semaphore(MAX_CONCURRENT_BATCHES)

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.node = node
        node.host.set_stream_handler(TProtocol(ROLLOUTS_PROTOCOL), self._handle)
        task_status.started()
        await trio.sleep_forever()

    def status(self) -> dict[str, Any]:
        return {"received": dict(self.received), "commitments": dict(self.commitments), "announced": self.announced}

    def on_announcement(self, signed: codec.Signed[RolloutAnnouncement], raw: bytes) -> bool:
        """Count a batch a worker announced (the node has checked that it is of this run)."""
        self.announced += 1
        return True

    async def _handle(self, stream: INetStream) -> None:
        peer_id = stream.muxed_conn.peer_id.to_base58()
        if self.node.scores.is_banned(peer_id):
            await close_quietly(stream)
            return
        # The slot is taken after the read: idle or slow senders (bounded per peer and IP by
        # node/swarm/guard.py) must not hold the node's few decode-and-store slots.
        async with contextlib.AsyncExitStack() as held:
            tally = self.received
            try:
                envelope = await read_frame(stream, RolloutBatch.MAX_SIZE, READ_TIMEOUT_S)
                await held.enter_async_context(self._slots)
                signed: codec.Signed[Any] = codec.decode(envelope, (RolloutBatch, WorkCommitment))
                if isinstance(signed.message, WorkCommitment):
                    tally = self.commitments
                    status, reason = self._commit(signed, peer_id)
                else:
                    status, reason = await self._accept(envelope, signed, peer_id)
            except Rejected as exc:
                self.node.scores.reject(peer_id, exc.reason, f"rollout delivery: {exc}")
                status, reason = "rejected", exc.reason
            tally[status] += 1
            try:
                await write_frame(stream, encode_delivery_reply(status, reason))
            except Exception as exc:  # the worker hung up; it will retry and get "duplicate"
                log.info("could not answer %s: %s", peer_id, exc)
            finally:
                await close_quietly(stream)

    def _commit(self, signed: codec.Signed[WorkCommitment], peer_id: str) -> tuple[str, str]:
        """A worker's work commitment, answered by the judge's book (signature, lifetime and
        signer already checked by the decode)."""
        commitment = signed.message
        if commitment.run_id != self.node.config.run_id:
            raise InvalidValue(f"commitment for run {commitment.run_id!r}")
        if self.on_commitment is None:  # no fault of the worker's: it commits to every receiver
            return "not_judging", "this node judges no rollouts: it keeps no commitments"
        if self.node.scores.is_banned(signed.signer_peer_id):
            return "rejected", "banned_worker"
        answer = self.on_commitment(signed)
        assert answer in COMMITMENT_ANSWERS, answer
        if answer == "too_many_groups":
            self.node.scores.reject(peer_id, "invalid_value", f"commitment of {commitment.groups} groups over the cap")
        return answer, ""

    async def _accept(self, envelope: bytes, signed: codec.Signed[RolloutBatch], peer_id: str) -> tuple[str, str]:
        if signed.message.run_id != self.node.config.run_id:
            raise InvalidValue(f"batch for run {signed.message.run_id!r}")
        if self.node.scores.is_banned(signed.signer_peer_id):  # relayed by another peer: not its fault
            return "rejected", "banned_worker"
        try:
            digest, new = await trio.to_thread.run_sync(self.inbox.store, envelope)
        except InboxFull as exc:
            log.info("inbox full for %s: %s", peer_id, exc)
            return "busy", str(exc)
        if not new:
            return "duplicate", ""
        log.info("stored rollout batch %s from %s (%d groups)", digest[:12], peer_id, len(signed.message.groups))
        self.node.view.vouch(signed.signer_peer_id)  # accepted work: kept through sybil floods
        if self.on_stored is not None:
            self.on_stored(digest, signed)
        return "stored", ""


async def deliver(node: NodeContext, peer_id: str, envelope: bytes, *, attempts: int = 5,
                  first_backoff_s: float = 0.5) -> str:
    """Send one batch or work commitment envelope to ``peer_id``; returns the receiver's answer:
    "stored" or "duplicate" (a commitment also "late", "early", "too_many_groups" or "not_judging").

    Retries transport failures and "busy" answers (the receiver's inbox share is full) with
    exponential backoff (``DeliveryFailed`` when they run out); a "rejected" answer is final
    (``DeliveryRejected``).
    """
    peer = ID.from_base58(peer_id)
    backoff = first_backoff_s
    last_error = "no attempt made"
    for _ in range(attempts):
        try:
            with trio.fail_after(READ_TIMEOUT_S):
                stream = await node.host.new_stream(peer, [TProtocol(ROLLOUTS_PROTOCOL)])
                try:
                    await write_frame(stream, envelope)
                    status, reason = decode_delivery_reply(await read_frame(stream, MAX_DELIVERY_REPLY, READ_TIMEOUT_S))
                finally:
                    await close_quietly(stream)
        except Rejected as exc:
            node.scores.reject(peer_id, exc.reason, f"delivery reply: {exc}")
            last_error = f"bad reply: {exc}"
        except Exception as exc:  # connection refused, reset, timeout: try again
            last_error = f"{type(exc).__name__}: {exc}"
        else:
            if status == "rejected":
                raise DeliveryRejected(f"{peer_id} rejected the batch: {reason}")
            if status != "busy":
                return status
            last_error = f"busy: {reason}"
        await trio.sleep(backoff)
        backoff *= 2
    raise DeliveryFailed(f"{peer_id} did not take the batch after {attempts} attempts ({last_error})")

