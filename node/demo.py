"""``intellect-node demo``: a local swarm (a bootstrap node and a few nodes), then its status."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.local_swarm import LocalSwarm

ROLES = ("inference", "validator", "trainer")


def run_demo(nodes: int, out: Path | None, keep: bool, log: Callable[[str], None]) -> dict[str, Any]:
    root = out or Path(tempfile.mkdtemp(prefix="intellect-demo-"))
    swarm = LocalSwarm(root)
    try:
        bootstrap = swarm.start_bootstrap()
        log(f"bootstrap node {bootstrap.addr}")
        for index in range(nodes):
            role = ROLES[index % len(ROLES)]
            node = swarm.start_member(f"node{index}", role, [bootstrap.addr])
            log(f"{role} node {node.peer_id}")
        seconds = swarm.wait_until(swarm.converged, timeout_s=60)
        log(f"all {nodes + 1} nodes see each other after {seconds:.1f} s; homes and logs in {root}")
        data = bootstrap.status()
        if keep:
            log("swarm running; Ctrl-C to stop")
            try:
                while True:
                    swarm.wait_until(lambda: False, timeout_s=3600)
            except (KeyboardInterrupt, TimeoutError):
                pass
        return data
    finally:
        swarm.stop_all()
