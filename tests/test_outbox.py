"""The worker's outbox: a batch a receiver could not take waits for it, with backoff, until taken,
refused or stale; the outbox never grows past its bound."""

from __future__ import annotations

from intellect_node.node.roles.inference.outbox import MAX_WAITING, RETRY_FIRST_S, RETRY_MAX_S, Outbox


def test_a_batch_nobody_missed_is_not_kept() -> None:
    outbox = Outbox()
    outbox.keep(3, b"batch", [], now=0.0)
    assert outbox.waiting == [] and outbox.status() == {"waiting": 0}


def test_a_failed_receiver_is_offered_the_batch_again_after_a_growing_wait_until_it_takes_it() -> None:
    outbox = Outbox()
    outbox.keep(3, b"batch", ["trainer", "validator"], now=0.0)
    assert outbox.due(RETRY_FIRST_S - 0.1, oldest_useful_step=1) == []
    [(entry, receivers)] = outbox.due(RETRY_FIRST_S, oldest_useful_step=1)
    assert receivers == ["trainer", "validator"] and entry.envelope == b"batch"

    outbox.settle(entry, {"trainer": "stored", "validator": "failed"}, now=RETRY_FIRST_S)
    assert outbox.due(RETRY_FIRST_S * 2.9, oldest_useful_step=1) == []  # the wait doubled
    [(entry, receivers)] = outbox.due(RETRY_FIRST_S * 3, oldest_useful_step=1)
    assert receivers == ["validator"]  # the trainer has it

    outbox.settle(entry, {"validator": "duplicate"}, now=RETRY_FIRST_S * 3)
    assert outbox.waiting == []
    assert outbox.status() == {"waiting": 0, "kept": 1, "redelivered_stored": 1, "redelivered_duplicate": 1}


def test_the_wait_between_tries_stops_growing_at_its_cap() -> None:
    outbox = Outbox()
    outbox.keep(0, b"batch", ["trainer"], now=0.0)
    now = 0.0
    for _ in range(20):
        [(entry, _)] = outbox.due(now + RETRY_MAX_S, oldest_useful_step=0)
        now += RETRY_MAX_S
        outbox.settle(entry, {"trainer": "failed"}, now=now)
    assert entry.delay == RETRY_MAX_S and entry.next_try == now + RETRY_MAX_S


def test_a_refusal_is_final() -> None:
    outbox = Outbox()
    outbox.keep(2, b"batch", ["trainer"], now=0.0)
    [(entry, _)] = outbox.due(RETRY_FIRST_S, oldest_useful_step=0)
    outbox.settle(entry, {"trainer": "rejected"}, now=RETRY_FIRST_S)
    assert outbox.waiting == [] and outbox.due(1e9, oldest_useful_step=0) == []


def test_batches_of_steps_past_the_async_window_are_dropped_not_sent() -> None:
    outbox = Outbox()
    outbox.keep(1, b"old", ["trainer"], now=0.0)
    outbox.keep(4, b"new", ["trainer"], now=0.0)
    due = outbox.due(RETRY_FIRST_S, oldest_useful_step=2)
    assert [entry.envelope for entry, _ in due] == [b"new"]
    assert outbox.status()["dropped_stale"] == 1 and len(outbox.waiting) == 1


def test_the_outbox_is_bounded_and_drops_its_oldest_batch_first() -> None:
    outbox = Outbox()
    for i in range(MAX_WAITING + 5):
        outbox.keep(7, i.to_bytes(2, "big"), ["gone-for-good"], now=float(i))
    assert len(outbox.waiting) == MAX_WAITING
    assert outbox.waiting[0].envelope == (5).to_bytes(2, "big")
    assert outbox.status()["dropped_full"] == 5
