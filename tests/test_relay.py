"""Circuit relay v2 and hole punching in the namespace internet (tests/support/netns.py): a public
bootstrap that is also the relay, two homes each behind its own MASQUERADE NAT. Each home learns
it is private, reserves a slot on the relay and advertises its relayed address; the other home
dials that address and the members exchange runs across the circuit (counted by the relay); DCUtR
is attempted over the relayed connection and its outcome printed; then the relay is killed and a
direct connection that came out of a punch, if any, must survive it."""

from __future__ import annotations

import time

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm, wait_until
from tests.support.netns import SmallInternet, unavailable_reason

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]
BOUND_S = 90.0
PUNCH_BOUND_S = 40.0


def _status(node) -> dict:  # type: ignore[no-untyped-def]
    try:
        return node.status()
    except OSError:
        return {}


def _relay(node) -> dict:  # type: ignore[no-untyped-def]
    return _status(node).get("relay", {})


def test_homes_reach_each_other_through_the_relay_and_try_to_punch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with SmallInternet(publics=1, homes=2) as net:
        swarm = LocalSwarm(tmp_path, run_id="relay-test")
        try:
            boot = swarm.start("boot", ["bootstrap"], prefix=net.exec_prefix(net.name("pub0")),
                               listen="/ip4/198.18.0.2/tcp/4001")
            homes = [swarm.start(f"home{n}", ["join", "--role", "validator", "--bootstrap", boot.addr],
                                 prefix=net.exec_prefix(net.name(f"home{n}")), listen=f"/ip4/198.19.{n}.2/tcp/4001")
                     for n in (1, 2)]
            started = time.monotonic()
            # each home reserves on the relay and advertises /ip4/198.18.0.2/tcp/4001/p2p/<relay>/p2p-circuit/p2p/<home>
            wait_until(lambda: all(_relay(h).get("relayed_addrs") for h in homes), BOUND_S)
            reserved_in = time.monotonic() - started
            for home in homes:
                assert _relay(home)["relayed_addrs"] == [f"/ip4/198.18.0.2/tcp/4001/p2p/{boot.peer_id}"
                                                         f"/p2p-circuit/p2p/{home.peer_id}"]
                assert _status(home)["reachability"]["state"] == "private"
            assert _relay(boot)["hop"] and _relay(boot)["reservations_served"] == 2

            def advertised(viewer, subject) -> list[str]:  # type: ignore[no-untyped-def]
                seen = {m["peer_id"]: m["addrs"] for m in _status(viewer).get("members", [])}
                return seen.get(subject.peer_id, [])

            # the other home and the public node see the relayed address in the signed advert
            wait_until(lambda: all("/p2p-circuit/" in " ".join(advertised(v, s))
                                   for v, s in ((homes[0], homes[1]), (homes[1], homes[0]), (boot, homes[0]))), BOUND_S)
            # one home dialed the other through the relay (its discovery loop), and the members
            # exchange that follows every dial crossed the circuit: the relay carried it
            wait_until(lambda: sum(_relay(h)["relayed_dials"]["ok"] for h in homes) >= 1, BOUND_S)
            wait_until(lambda: _relay(boot)["circuits"].get("opened", 0) >= 1 and _relay(boot)["bytes_relayed"] > 0,
                       BOUND_S)
            connected_in = time.monotonic() - started
            relay_after_connect = _relay(boot)
            print(f"\nreserved after {reserved_in:.1f} s, homes connected through the relay after "
                  f"{connected_in:.1f} s; "
                  f"relay: circuits {relay_after_connect['circuits']}, {relay_after_connect['bytes_relayed']} bytes")

            # DCUtR: both sides drive it every 2 s over a relayed connection; report what happened
            try:
                wait_until(lambda: sum(_relay(h)["hole_punches"]["attempted"] + _relay(h)["hole_punches"]["direct_dial"]
                                       for h in homes) >= 1, PUNCH_BOUND_S)
                time.sleep(12.0)  # let an attempt in progress end (its dials are bounded at 10 s)
            except TimeoutError:
                pass
            punches = {h.name: _relay(h)["hole_punches"] for h in homes}
            print(f"hole punches: {punches}")
            direct = {h.name: homes[1 - i].peer_id in _relay(h)["peers_direct"] for i, h in enumerate(homes)}

            swarm.kill("boot")  # the relay dies; circuits through it end
            time.sleep(5.0)
            for i, home in enumerate(homes):
                other = homes[1 - i].peer_id
                if direct[home.name]:
                    assert other in _relay(home)["peers_direct"], f"{home.name} lost its direct connection"
            print(f"home-to-home direct connection before the relay was killed: {direct}; after: "
                  f"{ {h.name: homes[1 - i].peer_id in _relay(h)['peers_direct'] for i, h in enumerate(homes)} }")
        finally:
            swarm.stop_all()
