"""A worker's batches reach a fast receiver while a slow one keeps it waiting at most
``BATCH_WAIT_S`` (node/roles/inference/dispatch.py): real libp2p hosts on 127.0.0.1, each receiver
answering ``/ina/rollouts/1.0.0`` as a node does, one of them only after a long while."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import PeerInfo

from intellect_node.crypto.identity import Identity
from intellect_node.node.roles.inference import dispatch as dispatch_module
from intellect_node.node.roles.inference.dispatch import MAX_PENDING_PER_RECEIVER, Dispatch
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol.framing import ROLLOUTS_PROTOCOL, encode_delivery_reply

LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
SLOW_S = 6.0


@dataclass
class Sender:
    """What ``deliver`` uses of a node: its host and its scores."""

    host: IHost
    scores: PeerScores


def receiver(host: IHost, received: list[bytes], delay_s: float) -> None:
    async def handle(stream: INetStream) -> None:
        try:
            received.append(await read_frame(stream, 1 << 20, 10.0))
            await trio.sleep(delay_s)
            await write_frame(stream, encode_delivery_reply("stored"))
        finally:
            await close_quietly(stream)

    host.set_stream_handler(TProtocol(ROLLOUTS_PROTOCOL), handle)


async def test_a_slow_receiver_holds_the_worker_back_only_briefly_and_gets_its_batches_later(monkeypatch) -> None:
    monkeypatch.setattr(dispatch_module, "BATCH_WAIT_S", 1.0)
    worker, fast, slow = (build_host(Identity.generate()) for _ in range(3))
    at_fast: list[bytes] = []
    at_slow: list[bytes] = []
    async with AsyncExitStack() as stack:
        for host in (worker, fast, slow):
            await stack.enter_async_context(host.run(LISTEN))
        receiver(fast, at_fast, 0.0)
        receiver(slow, at_slow, SLOW_S)
        for other in (fast, slow):
            await worker.connect(PeerInfo(other.get_id(), other.get_addrs()))
        names = [fast.get_id().to_base58(), slow.get_id().to_base58()]
        delivered: dict[str, int] = {"stored": 0, "duplicate": 0, "rejected": 0, "failed": 0}
        dispatch = Dispatch(Sender(worker, PeerScores()), lambda: names, lambda: 0, delivered)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(dispatch.run)
            batches = [f"batch {i}".encode() for i in range(MAX_PENDING_PER_RECEIVER + 1)]
            began = trio.current_time()
            for envelope in batches:
                await dispatch.batch(envelope, step=1)
            took = trio.current_time() - began
            # each batch waited the 1 s bound for the slow receiver (the last one not at all: its
            # two deliveries before were still running, so it went to the outbox for that one)
            assert took < len(batches) * 1.0 + 2.0 < SLOW_S * len(batches), took
            assert at_fast == batches
            assert at_slow == batches[:MAX_PENDING_PER_RECEIVER]
            assert dispatch.status()["in_background"] == MAX_PENDING_PER_RECEIVER
            assert dispatch.outbox.waiting and dispatch.outbox.waiting[0].receivers == {names[1]}
            await trio.sleep(SLOW_S + 0.5)  # the background deliveries' answers are in
            assert delivered["stored"] >= len(batches) + MAX_PENDING_PER_RECEIVER
            assert dispatch.status()["in_background"] == 0
            assert dispatch.status()["backgrounded"] == MAX_PENDING_PER_RECEIVER
            nursery.cancel_scope.cancel()
        assert delivered["failed"] == 0
