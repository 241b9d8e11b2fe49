"""Yamux receive credit goes back in batches (node/swarm/host.py): py-libp2p 0.8.1 sent a
WINDOW_UPDATE frame for every read, so each small gossip message a node received cost it a frame
back; flow control must still let a sender push far more than one window through."""

from __future__ import annotations

from contextlib import AsyncExitStack

import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.stream_muxer.yamux.yamux import YamuxStream

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.host import build_host

LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
PROTOCOL = TProtocol("/test/window/1.0.0")


async def exchange(monkeypatch, messages: list[bytes]) -> tuple[int, bytes]:
    """Send ``messages`` one write each from one real host to another; returns the receiver's
    WINDOW_UPDATE frames and the bytes it read."""
    updates = {"receiver": 0}
    original = YamuxStream.send_window_update
    receiving: set[int] = set()

    async def counted(self, *args, **kwargs):
        if id(self) in receiving:
            updates["receiver"] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(YamuxStream, "send_window_update", counted)
    received = bytearray()
    total = sum(map(len, messages))
    done = trio.Event()

    async def handler(stream) -> None:
        receiving.add(id(stream.muxed_stream))
        while len(received) < total:
            received.extend(await stream.read(1 << 16))
        done.set()

    sender, receiver = build_host(Identity.generate()), build_host(Identity.generate())
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(receiver.run(LISTEN))
        await stack.enter_async_context(sender.run(LISTEN))
        receiver.set_stream_handler(PROTOCOL, handler)
        sender.get_peerstore().add_addrs(receiver.get_id(), receiver.get_addrs(), 3600)
        stream = await sender.new_stream(receiver.get_id(), [PROTOCOL])
        for message in messages:
            await stream.write(message)
            await trio.sleep(0.002)  # each its own frame and read, as gossip messages arrive
        with trio.fail_after(30):
            await done.wait()
        await stream.close()
    return updates["receiver"], bytes(received)


async def test_small_messages_cost_the_receiver_no_frame_each(monkeypatch) -> None:
    messages = [bytes([i]) * 700 for i in range(100)]  # 100 adverts' worth, 70 KB: under half a window
    frames, received = await exchange(monkeypatch, messages)
    assert received == b"".join(messages)
    assert frames <= 1, f"{frames} WINDOW_UPDATE frames for 100 reads"


async def test_a_stream_far_larger_than_the_window_still_flows(monkeypatch) -> None:
    messages = [bytes([i % 251]) * 65536 for i in range(64)]  # 4 MiB: 16 windows of 256 KiB
    frames, received = await exchange(monkeypatch, messages)
    assert received == b"".join(messages)
    assert frames >= 8  # credit went back in batches, enough to carry it all
