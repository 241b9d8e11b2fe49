"""A meshsub stream from a peer whose slots are all held replaces that peer's oldest (which is reset),
where any other protocol's is refused: a peer that reconnected keeps its gossip."""

from __future__ import annotations

import trio

from intellect_node.node.swarm.guard import StreamGuard
from intellect_node.node.swarm.peer_scores import PeerScores


class FakeStream:
    """What the guard reads of a stream: its peer, its remote address, and reset()."""

    def __init__(self, peer: str) -> None:
        self.muxed_conn = type("Conn", (), {"peer_id": type("Id", (), {"to_base58": lambda _self: peer})()})()
        self.was_reset = trio.Event()

    def get_remote_address(self) -> tuple[str, int]:
        return ("127.0.0.1", 4001)

    async def reset(self) -> None:
        self.was_reset.set()


async def run_streams(protocol: str) -> tuple[list[bool], PeerScores]:
    """Three streams of ``protocol`` from one peer, each served by a handler that lives until reset;
    which were reset once the third arrived, and the peer's charges."""
    scores = PeerScores()
    guard = StreamGuard(scores)

    async def handler(stream: FakeStream) -> None:
        await stream.was_reset.wait()  # a long-lived reader: it ends when its stream is reset

    guarded = guard.wrap(protocol, handler)
    streams = [FakeStream("peer-a") for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for stream in streams:
            nursery.start_soon(guarded, stream)
            await trio.sleep(0.01)
        await trio.sleep(0.05)
        reset = [stream.was_reset.is_set() for stream in streams]
        for stream in streams:
            stream.was_reset.set()
    return reset, scores


def test_a_new_meshsub_stream_replaces_the_peers_oldest() -> None:
    reset, scores = trio.run(run_streams, "/meshsub/1.1.0")
    assert reset == [True, False, False] and scores.rejections["no_slot"] == 0


def test_another_protocols_third_stream_is_refused() -> None:
    reset, scores = trio.run(run_streams, "/ipfs/id/push/1.0.0")
    assert reset == [False, False, True] and scores.rejections["no_slot"] == 1  # the newcomer is refused
