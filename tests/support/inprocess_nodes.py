"""Real nodes inside the test process (real libp2p hosts on 127.0.0.1), for tests that need to
reach into a node's state, which the process-level tests cannot."""

from pathlib import Path

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.runtime import Node
from intellect_node.node.swarm.settings import SwarmSettings
from tests.support.protocol_samples import CPU_HARDWARE


def make_node(root: Path, name: str, run_id: str, identity: Identity | None = None, bootstrap=(), services=(),
              roles=("trainer",), **timing) -> Node:
    config = SwarmSettings(home=root / name, run_id=run_id, roles=tuple(roles), listen=("/ip4/127.0.0.1/tcp/0",),
                           bootstrap=tuple(bootstrap), new_swarm=not bootstrap,
                           **{"heartbeat_s": 1.0, "discovery_s": 2.0, **timing})
    config.home.mkdir(parents=True, exist_ok=True)
    return Node(config, identity or Identity.generate(), CPU_HARDWARE, services=services)
