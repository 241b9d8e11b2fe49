"""Nodes behind NAT in the namespace internet (tests/support/netns.py): they join through a public
bootstrap, everyone sees everyone, each node learns from dial-backs whether it is publicly
dialable, and a NATed node advertises no address while still serving streams a public peer opens
on its outbound connection."""

from __future__ import annotations

import time

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm, wait_until
from tests.support.netns import SmallInternet, unavailable_reason
from tests.support.shards_swarm import FAST, ShardSwarm, file_sha256, holds

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]
BOUND_S = 60.0
ADVERT_PROPAGATION_S = 10.0  # a re-signed advert reaches the members (gossip, at once)


def _state(node) -> str:  # type: ignore[no-untyped-def]
    try:
        return node.status()["reachability"]["state"]
    except OSError:
        return "no answer"


def test_nated_nodes_join_see_everyone_and_know_they_are_not_dialable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with SmallInternet(publics=2, homes=2) as net:
        swarm = LocalSwarm(tmp_path, run_id="nat-test")
        try:
            started = {}
            boot = swarm.start("boot", ["bootstrap"], prefix=net.exec_prefix(net.name("pub0")),
                               listen="/ip4/198.18.0.2/tcp/4001")
            for name, namespace, ip in (("pub", "pub1", "198.18.0.3"), ("home1", "home1", "198.19.1.2"),
                                        ("home2", "home2", "198.19.2.2")):
                started[name] = time.monotonic()
                swarm.start(name, ["join", "--role", "validator", "--bootstrap", boot.addr],
                            prefix=net.exec_prefix(net.name(namespace)), listen=f"/ip4/{ip}/tcp/4001")
            converged = {}
            everyone = {node.peer_id for node in swarm.nodes.values()}
            deadline = time.monotonic() + BOUND_S
            while len(converged) < len(started) and time.monotonic() < deadline:
                for name in started:
                    if name not in converged and everyone <= swarm.nodes[name].member_ids():
                        converged[name] = time.monotonic() - started[name]
                time.sleep(0.1)
            assert set(converged) == set(started), \
                f"not converged within {BOUND_S:g} s: {set(started) - set(converged)}"

            decided_in = wait_until(lambda: all(_state(n) != "unknown" for n in swarm.nodes.values()), BOUND_S)
            status = {name: node.status() for name, node in swarm.nodes.items()}
            print(f"\nconverged after start (s): {converged}; all reachability decided {decided_in:.1f} s after that")
            assert status["boot"]["reachability"]["state"] == "public"
            assert status["pub"]["reachability"]["state"] == "public"
            for n in (1, 2):
                mine = status[f"home{n}"]["reachability"]
                assert mine["state"] == "private", mine
                assert mine["observed_ip"] == f"198.18.0.{10 + n}"  # its router's address, as the NAT rewrote it
            # What a public node knows of a NATed one: no address to dial, once the home's re-signed
            # advert (signed the moment it learned it is private) has reached it; of a public one:
            # the proven address.
            homes = [swarm.nodes[f"home{n}"].peer_id for n in (1, 2)]

            def homes_undialable() -> bool:
                members = {m["peer_id"]: m for m in swarm.nodes["pub"].status()["members"]}
                return not [a for home in homes for a in members[home]["addrs"]
                            if "/p2p/" in a and "/p2p-circuit/" not in a]  # at most relayed ones (test_relay.py)

            wait_until(homes_undialable, ADVERT_PROPAGATION_S)
            seen = {m["peer_id"]: m for m in status["pub"]["members"]}
            assert any(a.startswith("/ip4/198.18.0.2/tcp/4001/p2p/") for a in seen[boot.peer_id]["addrs"])
            served = [status[name]["reachability"]["dialbacks_served"] for name in ("boot", "pub")]
            assert sum(s.get("unreachable", 0) for s in served) >= 2  # both homes were dialed and not reached
        finally:
            swarm.stop_all()


def test_nated_fetchers_get_the_checkpoint_and_advertise_no_data_address(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The data plane across NAT: two NATed nodes fetch a checkpoint from the public trainer (and
    from each other only over connections they open), end byte-identical, and once their dial-back
    says private their adverts carry no HTTP address, so no peer wastes a parent slot on them."""
    with SmallInternet(publics=2, homes=2) as net:
        swarm = LocalSwarm(tmp_path, run_id="nat-shards", timing=FAST)
        publisher = ShardSwarm(tmp_path, "nat-shards", {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(1 << 20)})
        try:
            boot = swarm.start("boot", ["bootstrap"], prefix=net.exec_prefix(net.name("pub0")),
                               listen="/ip4/198.18.0.2/tcp/4001")
            origin = swarm.start("origin", ["join", "--role", "trainer", "--bootstrap", boot.addr,
                                            "--publish-dir", str(publisher.publish_dir)],
                                 publisher.env, prefix=net.exec_prefix(net.name("pub1")),
                                 listen="/ip4/198.18.0.3/tcp/4001")
            homes = [swarm.start(f"home{n}", ["join", "--role", "inference", "--bootstrap", boot.addr,
                                               "--trainer", origin.peer_id], publisher.env,
                                 prefix=net.exec_prefix(net.name(f"home{n}")), listen=f"/ip4/198.19.{n}.2/tcp/4001")
                     for n in (1, 2)]
            wait_until(lambda: all(_state(h) == "private" for h in homes), BOUND_S)
            digest = publisher.publish(1, 8, seed=7)
            took = wait_until(lambda: all(holds(h, 1) for h in homes), BOUND_S)
            print(f"\nboth NATed fetchers verified the 8 MiB checkpoint {took:.1f} s after it was published")
            assert all(file_sha256(h, 1) == digest for h in homes)

            def home_addrs() -> list[list[str]]:
                seen = {m["peer_id"]: m["addrs"] for m in origin.status()["members"]}
                return [seen.get(h.peer_id, ["missing"]) for h in homes]

            def direct(addrs: list[str]) -> list[str]:
                return [a for a in addrs if "/p2p-circuit/" not in a]  # relayed addresses are tests/test_relay.py's

            wait_until(lambda: not any(direct(addrs) for addrs in home_addrs()), BOUND_S)
            assert [direct(addrs) for addrs in home_addrs()] == [[], []]  # neither a direct libp2p nor an HTTP address
        finally:
            swarm.stop_all()


@pytest.mark.timeout(900, func_only=True)  # the body only: demo_model is built before
def test_a_nated_worker_delivers_rollouts_the_public_trainer_trains_on(tmp_path, demo_model) -> None:  # type: ignore[no-untyped-def]
    """Rollouts across the NAT: an inference node in a home fetches the trainer's checkpoint from
    the public side, generates, and delivers its batches over its own outbound connection; the
    trainer verifies them (no rejection) and trains."""
    from tests.support.trainer_runs import TASKS, trained_steps

    model = demo_model
    with SmallInternet(publics=2, homes=1) as net:
        swarm = LocalSwarm(tmp_path, run_id="nat-rollouts", timing=FAST)
        try:
            boot = swarm.start("boot", ["bootstrap"], prefix=net.exec_prefix(net.name("pub0")),
                               listen="/ip4/198.18.0.2/tcp/4001")
            trainer = swarm.start("trainer", ["join", "--role", "trainer", "--bootstrap", boot.addr,
                                              "--model", str(model), "--tasks", TASKS, "--batch-groups", "4"],
                                  {"OMP_NUM_THREADS": "1"},
                                  prefix=net.exec_prefix(net.name("pub1")), listen="/ip4/198.18.0.3/tcp/4001")
            swarm.start("home1", ["join", "--role", "inference", "--bootstrap", boot.addr, "--trainer",
                                           trainer.peer_id, "--model", str(model), "--tasks", TASKS],
                                 {"OMP_NUM_THREADS": "1"}, prefix=net.exec_prefix(net.name("home1")),
                                 listen="/ip4/198.19.1.2/tcp/4001")
            took = wait_until(lambda: len(trained_steps(trainer.home)) >= 1, 240)
            print(f"\nthe public trainer trained on the NATed worker's rollouts {took:.1f} s after it started")
            # the worker sits behind its router by construction; whether its own dial-back check has
            # answered yet does not matter to delivery (it rides on its outbound connections)
            trainer_status = trainer.status()["services"]["trainer"]
            assert trainer_status["step"] >= 1
            verification = trainer_status["verification"]  # the trainer's own checks of the worker's batches
            assert verification["accepted_groups"] >= 4
            assert not {r for r in verification["rejected_groups"] if r != "stale_step"}, verification
        finally:
            swarm.stop_all()
