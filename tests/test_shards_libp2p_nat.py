"""A trainer behind NAT feeds the swarm (issue 33): in the namespace internet (tests/support/netns.py)
the trainer sits in a home, so it advertises no HTTP address, only its relayed one; a public
worker and a worker in another home still get its checkpoint, byte-identical, over libp2p streams
(``/ina/shards/1.0.0``) on the connections their hosts hold to it."""

from __future__ import annotations

import pytest

from intellect_node.node.demo.local_swarm import LocalSwarm, wait_until
from tests.support.netns import SmallInternet, unavailable_reason
from tests.support.shards_swarm import FAST, ShardSwarm, file_sha256, holds, shard_status

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]
BOUND_S = 120.0


def _state(node) -> str:  # type: ignore[no-untyped-def]
    try:
        return node.status()["reachability"]["state"]
    except OSError:
        return "no answer"


def test_a_nated_trainer_delivers_its_checkpoint_to_public_and_nated_workers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with SmallInternet(publics=2, homes=2) as net:
        swarm = LocalSwarm(tmp_path, run_id="nat-trainer", timing=FAST)
        publisher = ShardSwarm(tmp_path, "nat-trainer", {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(1 << 20)})
        try:
            boot = swarm.start("boot", ["bootstrap"], prefix=net.exec_prefix(net.name("pub0")),
                               listen="/ip4/198.18.0.2/tcp/4001")
            trainer = swarm.start("trainer", ["join", "--role", "trainer", "--bootstrap", boot.addr,
                                              "--publish-dir", str(publisher.publish_dir)],
                                  publisher.env, prefix=net.exec_prefix(net.name("home1")),
                                  listen="/ip4/198.19.1.2/tcp/4001")
            workers = [swarm.start("pub", ["join", "--role", "inference", "--bootstrap", boot.addr,
                                           "--trainer", trainer.peer_id], publisher.env,
                                   prefix=net.exec_prefix(net.name("pub1")), listen="/ip4/198.18.0.3/tcp/4001"),
                       swarm.start("home2", ["join", "--role", "inference", "--bootstrap", boot.addr,
                                             "--trainer", trainer.peer_id], publisher.env,
                                   prefix=net.exec_prefix(net.name("home2")), listen="/ip4/198.19.2.2/tcp/4001")]
            wait_until(lambda: _state(trainer) == "private", BOUND_S)
            digest = publisher.publish(1, 8, seed=11)
            took = wait_until(lambda: all(holds(w, 1) for w in workers), BOUND_S)
            print(f"\nboth workers verified the NATed trainer's 8 MiB checkpoint {took:.1f} s after publication")
            assert all(file_sha256(w, 1) == digest for w in workers)
            # over libp2p (it has no HTTP address); status.json is rewritten at most every 0.5 s
            wait_until(lambda: shard_status(trainer).get("stream_requests", {}).get("answered", 0) > 0, 10.0)
            assert shard_status(trainer)["uploaded_shards"] >= 1
            seen = {m["peer_id"]: m["addrs"] for m in workers[0].status()["members"]}
            assert not [a for a in seen[trainer.peer_id] if a.endswith("/http")]
        finally:
            swarm.stop_all()
