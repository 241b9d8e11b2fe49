"""Running a node as a process: identity, hardware, the role services, logging, a clean stop on
SIGINT/SIGTERM, and on SIGUSR1 every task's await stack in the log (``node.app.task_dump``)."""

from __future__ import annotations

import gc
import logging
import signal
import sys
from collections.abc import Callable

import trio

from intellect_node.crypto.identity import load_or_create_identity
from intellect_node.node.app.config import NodeConfig
from intellect_node.node.app.roles import RoleOptions, assemble
from intellect_node.node.app.task_dump import dump_on_signal
from intellect_node.node.swarm.bootstrap import config_line
from intellect_node.node.swarm.hardware import detect_hardware
from intellect_node.node.swarm.host import quiet_libp2p_logs

log = logging.getLogger(__name__)


def setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=numeric, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    quiet_libp2p_logs(verbose=numeric <= logging.DEBUG)


async def _until_signal(cancel: Callable[[], None]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            cancel()
            return


def run_node(config: NodeConfig, on_ready: Callable[[list[str]], None], roles: RoleOptions) -> None:
    """Run a node until SIGINT or SIGTERM; ``on_ready`` receives its listen multiaddrs.

    Which services run for which roles is decided in one table (``node.app.roles``).
    """
    from intellect_node.node.swarm.runtime import (
        Node,  # libp2p is imported only by commands that run a node
    )

    config.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    identity, created = load_or_create_identity(config.layout.identity_key)
    if created:
        log.info("created a new identity %s at %s", identity.peer_id, config.layout.identity_key)
    node = Node(config.swarm, identity, detect_hardware(config.home))
    node.services.extend(assemble(node, config, roles))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_signal, nursery.cancel_scope.cancel)
            nursery.start_soon(dump_on_signal)  # kill -USR1: what every task waits on, in the log
            addrs = await nursery.start(node.run)
            on_ready(addrs)

    trio.run(main)
    log.info("node %s stopped", identity.peer_id)


def serve(config: NodeConfig, roles: RoleOptions) -> None:
    """What ``join`` and ``bootstrap`` run once the configuration is loaded, and what rank 0 of a
    sharded trainer runs (node/roles/trainer/launch.py): logging, the node, its addresses printed."""
    setup_logging(config.log_level)
    try:
        run_node(config, print_addresses, roles)
    finally:
        # Everything the node owns is closed by now. The interpreter's last garbage collection would
        # walk the node's whole heap (libp2p, torch): 2-3 s measured at exit, the bulk of a SIGTERM's
        # stop time, which a supervisor's patience (systemd, a test) may not grant.
        gc.freeze()


def print_addresses(addrs: list[str]) -> None:
    """One listen multiaddr per line on stdout (for scripts), the config line for people on stderr."""
    for addr in addrs:
        print(addr, flush=True)
    print(f"add this line to the [node] section of each joining node's config.toml:\n{config_line(addrs)}",
          file=sys.stderr, flush=True)
