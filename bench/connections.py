"""Connections bench: inbound connections accepted per second, and a node's fds and RSS around a
long churn, ours against plain py-libp2p 0.8.1 (the same host without our inbound path).

Each side is a host in its own process (``--serve ours|plain``) on 127.0.0.1, sharing the
machine's 2 cores with the client process. The client (node/demo/churn.py) runs cycles of a fresh
identity that connects (noise + yamux), opens an identify stream, reads, and leaves, 32 at a time
from 8 source addresses 127.0.0.10-17.
- speed: accepted connections per second over 200 cycles on a fresh server (inside plain 0.8.1's
  250 lifetime slots, so both sides do the same work), 3 rounds alternating sides, median;
- churn: CYCLES more cycles (2,000; --quick 400): how many got in, and the server's open file
  descriptors and RSS before and after (2 s after the last cycle).

    python bench/connections.py           # about 2 minutes on an idle 2-core machine
    python bench/connections.py --quick   # under a minute

The last line reads ``connections: ours=<n> peer=<n> ratio=<x> target=0.9 ok|short`` (n: inbound
connections accepted per second, median round): ok when ours accepts at least 0.9x plain's rate
and every churn cycle got in.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio
from libp2p.peer.peerinfo import PeerInfo

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.churn import can_connect, churn, peer_info, serving
from intellect_node.node.swarm.connections import ConnectionManager
from intellect_node.node.swarm.host import build_host, quiet_libp2p_logs

SPEED_CYCLES = 200
ROUNDS = 3
CONCURRENCY = 32
TARGET = 0.9


def fds_and_rss(pid: int) -> tuple[int, int]:
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    with open(f"/proc/{pid}/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return fds, rss_kib << 10


async def serve(side: str) -> None:
    host = build_host(Identity.generate())
    if side == "ours":
        ConnectionManager(host)
    async with serving(host) as info:
        print(f"{info.addrs[0]}/p2p/{info.peer_id}", flush=True)
        await trio.sleep_forever()


@contextmanager
def server(side: str) -> Iterator[tuple[int, PeerInfo]]:
    """A fresh ``--serve`` process: (pid, its PeerInfo)."""
    process = subprocess.Popen([sys.executable, __file__, "--serve", side], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        target = peer_info(process.stdout.readline().strip())
        time.sleep(1.0)
        yield process.pid, target
    finally:
        process.kill()
        process.wait()


def run_cycles(target: PeerInfo, cycles: int) -> tuple[int, float]:
    sources = itertools.cycle(f"127.0.0.{i}" for i in range(10, 18))
    return trio.run(churn, lambda: can_connect(target, next(sources)), cycles, CONCURRENCY)


def accepts_per_s(side: str) -> float:
    with server(side) as (_, target):
        accepted, seconds = run_cycles(target, SPEED_CYCLES)
        return accepted / seconds


def soak(side: str, cycles: int) -> dict[str, float]:
    with server(side) as (pid, target):
        fds0, rss0 = fds_and_rss(pid)
        accepted, _ = run_cycles(target, cycles)
        time.sleep(2.0)
        fds1, rss1 = fds_and_rss(pid)
    return {"accepted": accepted, "fds_before": fds0, "fds_after": fds1,
            "rss_before_mib": rss0 / 2**20, "rss_after_mib": rss1 / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="400 churn cycles instead of 2,000")
    parser.add_argument("--serve", choices=["ours", "plain"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_libp2p_logs(False)
    if args.serve:
        trio.run(serve, args.serve)
        return 0
    cycles = 400 if args.quick else 2000
    print(f"# connections bench: {ROUNDS} alternating rounds of {SPEED_CYCLES} cycles on a fresh server per side, "
          f"then {cycles} churn cycles per side; {CONCURRENCY} in flight", flush=True)
    rates: dict[str, list[float]] = {"plain": [], "ours": []}
    for _ in range(ROUNDS):
        for side in rates:
            rates[side].append(accepts_per_s(side))
    for side in rates:
        print(f"{side}: accepts/s per round {', '.join(f'{r:.1f}' for r in rates[side])}", flush=True)
    churned = {}
    for side in rates:
        r = churned[side] = soak(side, cycles)
        print(f"{side}: churn {r['accepted']}/{cycles} got in; fds {r['fds_before']} -> {r['fds_after']}; "
              f"RSS {r['rss_before_mib']:.1f} -> {r['rss_after_mib']:.1f} MiB", flush=True)
    ours, peer = statistics.median(rates["ours"]), statistics.median(rates["plain"])
    ratio = ours / peer
    ok = ratio >= TARGET and churned["ours"]["accepted"] == cycles
    print(f"connections: ours={ours:.1f} peer={peer:.1f} ratio={ratio:.2f} target={TARGET} {'ok' if ok else 'short'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
