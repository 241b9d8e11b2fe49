"""Admission under pressure (specs/connections.md): when the inbound table is full, a newcomer from
an under-represented address range evicts the oldest idle unproven connection of the most
represented range; proven and protected peers are never evicted. Real libp2p hosts on 127.x.y.z:
every such address is local on Linux, and 127.1.1.z and 127.2.2.z are different /24s and /16s."""

import pytest
import trio

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.churn import can_connect, flood, fresh_peer, serving
from intellect_node.node.swarm.connections import ConnectionManager, ConnectionPolicy, address_keys
from intellect_node.node.swarm.host import build_host
from intellect_node.node.swarm.settings import SwarmSettings
from tests.support.waiting import poll_until, poll_up_to

HOLD_PROTOCOL = "/test/hold/1.0.0"


def test_address_keys_name_the_host_its_24_and_its_16():
    assert address_keys("127.1.1.2") == ("127.1.1.2/32", "127.1.1.0/24", "127.1.0.0/16")
    assert address_keys("127.2.2.2")[1:] != address_keys("127.1.1.2")[1:]
    assert address_keys("2001:db8:0:1::1") == ("2001:db8:0:1::1/128", "2001:db8:0:1::/64", "2001:db8::/48")
    assert address_keys("unknown") == ("unknown", "unknown", "unknown")


def test_settings_bound_the_admission_fields(tmp_path):
    settings = SwarmSettings(home=tmp_path, run_id="r", max_inbound=50, unproven_per_16=160, evict_unproven=False)
    assert settings.connection_policy.max_inbound == 50 and not settings.connection_policy.evict
    with pytest.raises(ValueError, match="max_inbound"):
        SwarmSettings(home=tmp_path, run_id="r", max_inbound=1000)
    with pytest.raises(ValueError, match="unproven_per_24"):
        SwarmSettings(home=tmp_path, run_id="r", unproven_per_24=200, unproven_per_16=100)
    with pytest.raises(TypeError, match="evict_unproven"):
        SwarmSettings(home=tmp_path, run_id="r", evict_unproven="yes")


@pytest.mark.parametrize("evict", [True, False], ids=["evict", "refuse-only"])
def test_an_honest_newcomer_gets_in_while_a_few_ranges_hold_and_remake_every_slot(evict):
    """24 attackers from 4 addresses in 2 /24s keep a 12-slot table full, remaking each
    connection the node closes or refuses; a newcomer from a third range is admitted when the
    node evicts, and refused (``inbound_full``) when it only refuses, as before."""

    async def main() -> tuple[bool, dict]:
        server = build_host(Identity.generate())
        manager = ConnectionManager(server, ConnectionPolicy(max_inbound=12, unproven_per_ip=12, unproven_per_24=12,
                                                             unproven_per_16=12, evict=evict))
        sources = ["127.1.1.1", "127.1.1.2", "127.2.2.1", "127.2.2.2"]
        stop = trio.Event()
        async with serving(server) as target, trio.open_nursery() as nursery:
            nursery.start_soon(flood, target, sources, 24, stop, 0.05)
            # full, the flood knocking
            await poll_until(lambda: manager.accepted >= 12 and manager.refused["inbound_full"] >= 12, 60)
            admitted = await can_connect(target, "127.3.3.1")
            counts = manager.status()
            stop.set()
        return admitted, counts

    admitted, counts = trio.run(main)
    assert admitted is evict
    if evict:
        assert counts["evicted"] >= 1
    else:
        assert counts["evicted"] == 0 and counts["refused"]["inbound_full"] >= 13


def test_eviction_takes_the_oldest_idle_unproven_of_the_most_represented_range_and_never_a_proven_peer():
    """An 8-slot table: a protected and a proven peer from 127.4.4.1, four unproven from 127.1.1.x
    (the second one busy with an open stream), two from 127.2.2.x. Newcomers from fresh ranges
    evict 127.1's idle ones oldest first, then the busy one's range-mates, never the protected or
    proven peer; once every unproven range holds one slot, the next newcomer is refused."""

    async def main() -> None:
        server = build_host(Identity.generate())
        manager = ConnectionManager(server, ConnectionPolicy(max_inbound=8, unproven_per_ip=8, unproven_per_24=8,
                                                             unproven_per_16=8, trim_every_s=3600))

        async def held(handler_stream) -> None:  # a stream the client keeps open: a busy connection
            await trio.sleep_forever()

        server.set_stream_handler(HOLD_PROTOCOL, held)
        release = trio.Event()
        async with serving(server) as target, trio.open_nursery() as nursery:
            async def connect(source: str, busy: bool = False, task_status=trio.TASK_STATUS_IGNORED) -> None:
                async with fresh_peer(target, source) as host:
                    if busy:
                        await host.new_stream(target.peer_id, [HOLD_PROTOCOL])
                    task_status.started(host.get_id().to_base58())
                    await release.wait()

            async def start(source: str, busy: bool = False) -> str:
                """Connect; return once the server has it and the victim, if any, is gone (so
                this slot is older than the next one's)."""
                peer = await nursery.start(connect, source, busy)
                await poll_until(lambda: peer in connected() and len(connected()) <= 8, 10, poll_s=0.01)
                return peer

            def connected() -> set[str]:
                return {p.to_base58() for p in server.get_connected_peers()}

            protected, proven = await start("127.4.4.1"), await start("127.4.4.1")
            manager.protect(protected, "bootstrap")
            manager.mark_proven(proven)
            crowd = [await start("127.1.1.1"), await start("127.1.1.2", busy=True),
                     await start("127.1.1.3"), await start("127.1.1.4")]
            pair = [await start("127.2.2.1"), await start("127.2.2.2")]
            # identify's streams end; only the held one stays open
            await poll_up_to(lambda: sum(bool(c.get_streams()) for c in server.get_network().get_connections()) <= 1, 5)

            await start("127.3.3.1")  # 127.1 holds 4 unproven, the newcomer's range 0: evict
            assert crowd[0] not in connected() and crowd[1] in connected()
            await start("127.5.5.1")  # 127.1 still the most represented (3)
            assert crowd[2] not in connected() and crowd[1] in connected()
            await start("127.6.6.1")  # 127.1 and 127.2 hold 2 each: an idle one goes first
            await start("127.7.7.1")  # the range still holding 2 loses one
            assert manager.evicted == 4
            still = connected()
            assert {protected, proven} <= still
            assert len([p for p in crowd if p in still]) == 1 and len([p for p in pair if p in still]) == 1
            assert crowd[1] in still  # the busy one outlived every idle one of its range
            assert not await can_connect(target, "127.8.8.1")  # every unproven range holds 1 now
            assert manager.refused["inbound_full"] == 1 and manager.evicted == 4
            assert {protected, proven} <= connected()
            release.set()

    trio.run(main)


def test_a_newcomer_from_the_crowded_range_evicts_nobody():
    """The table is full of one /24's connections; another address of that same /24 is refused,
    an address of a fresh /24 in the same /16 is admitted (the /24 decides when the /16 is shared)."""

    async def main() -> None:
        server = build_host(Identity.generate())
        manager = ConnectionManager(server, ConnectionPolicy(max_inbound=4, unproven_per_ip=4, unproven_per_24=4,
                                                             unproven_per_16=4))
        release = trio.Event()
        async with serving(server) as target, trio.open_nursery() as nursery:
            async def connect(source: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
                async with fresh_peer(target, source):
                    task_status.started()
                    await release.wait()

            for i in range(4):
                await nursery.start(connect, f"127.9.9.{i + 1}")
            await poll_until(lambda: len(server.get_connected_peers()) >= 4, 10, poll_s=0.01)
            assert not await can_connect(target, "127.9.9.9")
            assert manager.refused["per_24"] == 1 and manager.evicted == 0  # its /24 is at its cap
            manager.policy = ConnectionPolicy(max_inbound=4, unproven_per_ip=4, unproven_per_24=8, unproven_per_16=8)
            assert not await can_connect(target, "127.9.9.9")  # same /24: it would only trade places
            assert manager.refused["inbound_full"] == 1 and manager.evicted == 0
            assert await can_connect(target, "127.9.10.1")  # same /16, fresh /24: 0 + 1 < 4
            assert manager.evicted == 1
            release.set()

    trio.run(main)
