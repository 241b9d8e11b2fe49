"""Two real in-process nodes on 127.0.0.1: a worker delivers rollout batches to a receiver."""

import os
import threading

import pytest
import trio
from libp2p.custom_types import TProtocol

from intellect_node.crypto.envelope import seal
from intellect_node.crypto.identity import Identity
from intellect_node.node.roles.validator.commitments import CommitmentBook
from intellect_node.node.rollouts.exchange import DeliveryFailed, DeliveryRejected, RolloutReceiver, deliver
from intellect_node.node.rollouts.inbox import InboxFull, InboxLimits, RolloutInbox
from intellect_node.node.swarm.streams import read_frame
from intellect_node.protocol import codec
from intellect_node.protocol.commitments import WorkCommitment
from intellect_node.protocol.errors import Truncated, Unanswered
from intellect_node.protocol.framing import HEADER, ROLLOUTS_PROTOCOL, decode_delivery_reply, frame
from intellect_node.protocol.rollouts import RolloutBatch
from tests.support.inprocess_nodes import make_node
from tests.support.protocol_samples import sample_batch

RUN = "delivery-test"


@pytest.fixture
async def pair(tmp_path, nursery):
    inbox = RolloutInbox(tmp_path / "receiver" / "inbox")
    stored = []
    receiver_service = RolloutReceiver(inbox, on_stored=lambda digest, signed: stored.append(digest))
    receiver = make_node(tmp_path, "receiver", RUN, services=[receiver_service])
    addrs = await nursery.start(receiver.run)
    worker_identity = Identity.generate()
    worker = make_node(tmp_path, "worker", RUN, worker_identity, bootstrap=addrs)
    await nursery.start(worker.run)
    return receiver, worker, worker_identity, inbox, stored


def signed_batch(identity: Identity, **changes) -> bytes:
    unsigned = sample_batch(**{"run_id": RUN, "worker": identity.peer_id, **changes})
    return codec.encode(unsigned, identity, lifetime_s=600)


async def test_batch_is_stored_durably_once_and_retries_are_duplicates(pair):
    receiver, worker, identity, inbox, stored = pair
    envelope = signed_batch(identity)
    assert await deliver(worker, receiver.peer_id, envelope) == "stored"
    assert await deliver(worker, receiver.peer_id, envelope) == "duplicate"
    assert len(stored) == 1 and inbox.pending() == stored
    assert inbox.load(stored[0]) == envelope
    assert codec.decode(RolloutInbox(inbox.directory).load(stored[0]), RolloutBatch).message.run_id == RUN


async def test_a_batch_delivered_again_after_its_judge_recorded_it_is_a_duplicate(pair):
    """A worker whose ``stored`` answer was lost delivers again, maybe after the judge has judged
    the batch and removed it from the inbox: it must not be stored (and judged) a second time."""
    receiver, worker, identity, inbox, stored = pair
    recorded: set[str] = set()
    inbox.judged = recorded.__contains__
    envelope = signed_batch(identity)
    assert await deliver(worker, receiver.peer_id, envelope) == "stored"
    recorded.add(stored[0])  # the judge records its verdict, then removes the batch
    inbox.remove(stored[0])
    assert await deliver(worker, receiver.peer_id, envelope) == "duplicate"
    assert len(stored) == 1 and inbox.pending() == []
    other = signed_batch(identity, policy_step=1)  # another batch of the same worker is still new
    assert await deliver(worker, receiver.peer_id, other) == "stored"


async def test_invalid_batches_are_refused_with_their_reason_and_charged(pair):
    receiver, worker, identity, inbox, _ = pair
    with pytest.raises(DeliveryFailed, match="invalid_value"):
        await deliver(worker, receiver.peer_id, signed_batch(identity, run_id="another-run"))
    forged = bytearray(signed_batch(identity))
    forged[-5] ^= 1
    with pytest.raises(DeliveryFailed, match="bad_signature"):
        await deliver(worker, receiver.peer_id, bytes(forged))
    assert inbox.pending() == []
    assert receiver.scores.rejections["bad_signature"] == 1
    assert receiver.scores.penalty(identity.peer_id) > 0


async def test_oversize_frame_is_refused_before_reading_and_garbage_is_malformed(pair):
    receiver, worker, _, inbox, _ = pair
    for raw, reason in ((HEADER.pack(RolloutBatch.MAX_SIZE + 1), "oversize"), (frame(os.urandom(500)), "malformed")):
        stream = await worker.host.new_stream(receiver.host.get_id(), [TProtocol(ROLLOUTS_PROTOCOL)])
        await stream.write(raw)
        status, answered = decode_delivery_reply(await read_frame(stream, 1024, 10))
        assert (status, answered) == ("rejected", reason)
    assert inbox.pending() == []


async def test_delivery_to_an_absent_peer_gives_up_with_a_clear_error(pair):
    _, worker, _, _, _ = pair
    with pytest.raises(DeliveryFailed, match="after 2 attempts"):
        with trio.fail_after(30):
            await deliver(worker, Identity.generate().peer_id, b"x", attempts=2, first_backoff_s=0.1)


async def test_a_receiver_that_hangs_up_unanswered_costs_little_and_is_not_banned(pair):
    """A receiver that closes the stream without a reply (busy, stopping, or one that banned the
    worker) gave no answer, not a bad one: ``unanswered`` at 1 point, so a worker does not ban an
    honest validator over it (at ``truncated``'s 10 points it did within minutes, in the demo)."""
    receiver, worker, identity, inbox, _ = pair
    receiver_id = receiver.host.get_id().to_base58()

    async def hang_up(stream) -> None:
        await stream.close()

    receiver.host.set_stream_handler(TProtocol(ROLLOUTS_PROTOCOL), hang_up)
    with pytest.raises(DeliveryFailed, match="after 3 attempts"):
        with trio.fail_after(30):
            await deliver(worker, receiver_id, signed_batch(identity), attempts=3, first_backoff_s=0.05)
    assert worker.scores.rejections["unanswered"] == 3 and worker.scores.rejections["truncated"] == 0
    assert worker.scores.penalty(receiver_id) <= 3.0 and not worker.scores.is_banned(receiver_id)
    assert inbox.pending() == []


async def test_a_reply_cut_after_its_first_byte_is_truncated():
    """Unanswered is only for nothing at all: a frame cut after one byte is ``truncated``."""
    class Scripted:
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        async def read(self, n: int) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

    with pytest.raises(Unanswered):
        await read_frame(Scripted([]), 1024, 5)
    for chunks in ([HEADER.pack(8)[:1]], [HEADER.pack(8), b"abc"]):
        with pytest.raises(Truncated) as raised:
            await read_frame(Scripted(chunks), 1024, 5)
        assert type(raised.value) is Truncated
    assert await read_frame(Scripted([HEADER.pack(3), b"abc"]), 1024, 5) == b"abc"


def _envelope(identity: Identity, body: bytes = b"batch") -> bytes:
    return seal(identity, "rollout_batch", 1, body, lifetime_s=60)


def test_inbox_removes_half_written_files_on_start(tmp_path):
    inbox = RolloutInbox(tmp_path)
    envelope = _envelope(Identity.generate())
    digest, new = inbox.store(envelope)
    assert new and inbox.store(envelope) == (digest, False)
    (tmp_path / f"{'0' * 64}.batch.tmp-123").write_bytes(b"half")
    reopened = RolloutInbox(tmp_path)
    assert reopened.pending() == [digest]
    assert not list(tmp_path.glob("*.tmp-*"))
    with pytest.raises(ValueError):
        reopened.load("../../etc/passwd")


def test_inbox_bounds_each_worker_and_the_total(tmp_path):
    """A flooding worker fills only its own share; the others still get in; a judged batch frees
    its room; the accounting survives a restart."""
    limits = InboxLimits(per_worker_batches=3, per_worker_bytes=10_000, total_batches=5, total_bytes=1 << 20)
    inbox = RolloutInbox(tmp_path, limits)
    flooder, honest, third = Identity.generate(), Identity.generate(), Identity.generate()
    stored = [inbox.store(_envelope(flooder, bytes([i])))[0] for i in range(3)]
    with pytest.raises(InboxFull, match="batches of this worker"):
        inbox.store(_envelope(flooder, b"more"))
    with pytest.raises(InboxFull, match="bytes of this worker"):
        inbox.store(_envelope(honest, b"x" * 10_000))
    inbox.store(_envelope(honest, b"a"))
    inbox.store(_envelope(honest, b"b"))
    with pytest.raises(InboxFull, match="batches wait"):
        inbox.store(_envelope(third))
    inbox.remove(stored[0])
    assert inbox.store(_envelope(third))[1]
    reopened = RolloutInbox(tmp_path, limits)
    assert reopened.held_by(flooder.peer_id) == 2 and reopened.held_by(third.peer_id) == 1
    with pytest.raises(InboxFull):
        reopened.store(_envelope(third, b"again"))
    assert len(reopened.pending()) == 5


def test_a_batch_being_written_is_not_pending_but_its_room_is_taken(tmp_path, monkeypatch):
    """The judge lists only whole files: a batch listed while it was written had no file yet, was
    dropped as missing, and the worker's later counters waited behind that gap for good (seen on
    the real-model swarm). Its room is taken from the start, and a second delivery of it meanwhile
    is a duplicate; a failed write gives the room back and leaves nothing held."""
    import intellect_node.node.rollouts.inbox as inbox_module

    limits = InboxLimits(per_worker_batches=1)
    inbox = RolloutInbox(tmp_path, limits)
    identity = Identity.generate()
    envelope = _envelope(identity)
    writing, release = threading.Event(), threading.Event()
    real_write = inbox_module.write_durably

    def paused_write(*args, **kwargs):
        writing.set()
        assert release.wait(10)
        real_write(*args, **kwargs)

    monkeypatch.setattr(inbox_module, "write_durably", paused_write)
    storing = threading.Thread(target=inbox.store, args=(envelope,))
    storing.start()
    try:
        assert writing.wait(10)
        assert inbox.pending() == []
        assert inbox.store(envelope)[1] is False  # the same envelope again: a duplicate, not a second write
        with pytest.raises(InboxFull, match="batches of this worker"):
            inbox.store(_envelope(identity, b"other"))
    finally:
        release.set()
        storing.join(10)
    digest = inbox.pending()[0]
    assert inbox.load(digest) == envelope

    def failing_write(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(inbox_module, "write_durably", failing_write)
    other = Identity.generate()
    with pytest.raises(OSError):
        inbox.store(_envelope(other))
    assert inbox.pending() == [digest] and inbox.held_by(other.peer_id) == 0


async def test_work_commitments_are_answered_by_the_judges_book(pair):
    """The same protocol carries work commitments: the book's answer is the reply; too_many_groups
    is charged, late and duplicate are not; a receiver that judges nothing answers not_judging."""
    receiver, worker, identity, inbox, _ = pair
    (rollouts,) = [s for s in receiver.services if isinstance(s, RolloutReceiver)]

    def commitment(step: int, groups: int = 4, run_id: str = RUN) -> bytes:
        return codec.encode(WorkCommitment(run_id=run_id, worker=identity.peer_id, step=step, groups=groups),
                            identity, lifetime_s=600)

    assert await deliver(worker, receiver.peer_id, commitment(1)) == "not_judging"
    book = CommitmentBook(None, max_groups=8)
    offered = []

    def offer(signed):
        offered.append(signed.message)
        return book.offer(signed.message, newest_known_step=0)

    rollouts.on_commitment = offer
    answers = [await deliver(worker, receiver.peer_id, commitment(step, groups))
               for step, groups in ((1, 4), (1, 8), (0, 4), (3, 4), (2, 9))]
    assert answers == ["stored", "duplicate", "late", "early", "too_many_groups"]
    assert book.groups(identity.peer_id, 1) == 4 and inbox.pending() == []  # no batch stored
    assert rollouts.commitments["too_many_groups"] == 1 and receiver.scores.rejections["invalid_value"] == 1
    with pytest.raises(DeliveryRejected, match="invalid_value"):
        await deliver(worker, receiver.peer_id, commitment(2, run_id="another-run"))
    assert len(offered) == 5  # the other run's never reached the book
