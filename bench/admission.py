"""Admission bench (issue 33): seconds until an honest newcomer from a fresh address range gets a
connection that answers identify, while a flood from a few ranges holds and remakes every inbound
slot; ours (eviction, per-/24 and per-/16 caps) against the same node with eviction off and
today's caps (per IP 32, per /24 128, no /16 cap): the node as it was before.

Each side is a node host in its own process (``--serve ours|refuse``, the connection manager and
its trimming task running) on 127.0.0.1; the flood is a second process (``--flood``) and the
newcomer a third (this one), so the newcomer's handshake is not queued behind the flood's in one
event loop; all share the machine's 2 cores. The flood holds --connections idle connections
(fresh identities) from --addresses source addresses spread over --ranges /24s, each in its own
/16 (127.1x.1x.z), each remade RETRY_S after the node closes or refuses it (node/demo/churn.py
``flood``). Once the node's table is full (its status shows a refusal) the newcomer tries from
127.20k.1.1 every TRY_EVERY_S until identify answers, up to --limit seconds; --trials newcomers
per side, one after another, each from its own range and each once the flood has taken every
slot again, at least HELD of them established (waited for up to --refill seconds; a trial that started
without is marked * and left out of the median unless every trial was).

    python bench/admission.py                   # 1,000 connections from 50 addresses
    python bench/admission.py --quick           # 260 from 12 addresses in 3 /24s (the issue's case)
    python bench/admission.py --connections 600 --addresses 30

The last line reads ``admission: ours=<s> peer=<s> ratio=<peer/ours> target=2.0 ok|short`` (s:
median seconds to admit; a newcomer never admitted counts as LIMIT_S): ok when ours <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio
from libp2p.peer.peerinfo import PeerInfo

from intellect_node.crypto.identity import Identity
from intellect_node.node.demo.churn import can_connect, flood, peer_info, serving
from intellect_node.node.swarm.connections import ConnectionManager, ConnectionPolicy
from intellect_node.node.swarm.host import build_host, quiet_libp2p_logs

TARGET_S = 2.0
RETRY_S = 1.0  # an attacker remakes a closed or refused connection after this long
TRY_EVERY_S = 0.5  # the newcomer's own retry interval
FILL_LIMIT_S = 120.0
HELD = 0.5
MAX_INBOUND = ConnectionPolicy().max_inbound
POLICIES = {
    "ours": ConnectionPolicy(),
    # the node before issue 33: no eviction, no /16 cap, 128 per /24
    "refuse": ConnectionPolicy(evict=False, unproven_per_24=128, unproven_per_16=1_000_000),
}


async def serve(side: str, status_file: Path) -> None:
    """A node host with the side's connection manager; writes its status every 0.25 s."""
    host = build_host(Identity.generate())
    manager = ConnectionManager(host, POLICIES[side])
    async with serving(host) as info, trio.open_nursery() as nursery:
        nursery.start_soon(manager.run)
        print(f"{info.addrs[0]}/p2p/{info.peer_id}", flush=True)
        while True:
            status_file.with_suffix(".tmp").write_text(json.dumps(manager.status()))
            status_file.with_suffix(".tmp").replace(status_file)
            await trio.sleep(0.25)


@contextmanager
def server(side: str, status_file: Path) -> Iterator[PeerInfo]:
    process = subprocess.Popen([sys.executable, __file__, "--serve", side, "--status", str(status_file)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        target = peer_info(process.stdout.readline().strip())
        yield target
    finally:
        process.kill()
        process.wait()


def read_status(status_file: Path) -> dict:
    try:
        return json.loads(status_file.read_text())
    except (OSError, ValueError):
        return {}


def sources(addresses: int, ranges: int) -> list[str]:
    """``addresses`` source IPs over ``ranges`` /24s, each in its own /16: 127.1x.1x.z."""
    return [f"127.{10 + i % ranges}.{10 + i % ranges}.{1 + i // ranges}" for i in range(addresses)]


async def refilled(status_file: Path, refill_s: float) -> bool:
    """Wait (up to ``refill_s``) until the flood holds HELD of the inbound slots established (and the
    rest at least handshaking); whether it did. A newcomer that arrives at a free slot, or while
    the flood's own handshakes are failing on a starved machine, measures nothing."""
    with trio.move_on_after(refill_s):
        while True:
            status = read_status(status_file)
            established = status.get("inbound", 0)
            if established >= HELD * MAX_INBOUND and established + status.get("handshaking", 0) >= MAX_INBOUND:
                return True
            await trio.sleep(0.1)
    return False


async def newcomer(target: PeerInfo, source_ip: str, limit_s: float) -> float:
    """Seconds until ``source_ip`` gets in (``limit_s`` if it never does)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if await can_connect(target, source_ip):
            return time.perf_counter() - started
        await trio.sleep(TRY_EVERY_S)
    return limit_s


def run_flood(target: str, connections: int, addrs: list[str]) -> None:
    """The ``--flood`` process: holds and remakes connections until killed."""
    trio.run(flood, peer_info(target), addrs, connections, trio.Event(), RETRY_S)


@contextmanager
def flooding(target: PeerInfo, connections: int, addresses: int, ranges: int) -> Iterator[None]:
    addr = f"{target.addrs[0]}/p2p/{target.peer_id}"
    process = subprocess.Popen([sys.executable, __file__, "--flood", addr, "--connections", str(connections),
                                "--addresses", str(addresses), "--ranges", str(ranges)])
    try:
        yield
    finally:
        process.kill()
        process.wait()


def measure(side: str, connections: int, addresses: int, ranges: int, trials: int, limit_s: float,
            refill_s: float) -> dict:
    with (tempfile.TemporaryDirectory() as tmp, server(side, Path(tmp) / "status.json") as target,
          flooding(target, connections, addresses, ranges)):
        status_file = Path(tmp) / "status.json"

        async def main() -> dict:
            started = time.perf_counter()
            # a poll: the server is another process, and its status file is all it tells
            while (not read_status(status_file).get("refused")  # noqa: ASYNC110
                   and time.perf_counter() - started < FILL_LIMIT_S):
                await trio.sleep(0.25)
            fill_s = time.perf_counter() - started
            full = read_status(status_file)
            times, held = [], []
            for k in range(trials):
                held.append(await refilled(status_file, refill_s))
                times.append(await newcomer(target, f"127.{200 + k}.1.1", limit_s))
            return {"fill_s": fill_s, "full": full, "times": times, "held": held, "final": read_status(status_file)}

        return trio.run(main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="260 connections from 12 addresses in 3 /24s")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--addresses", type=int, default=50)
    parser.add_argument("--ranges", type=int, default=5, help="/24s (each in its own /16) the addresses span")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--limit", type=float, default=30.0, help="seconds a newcomer keeps trying")
    parser.add_argument("--refill", type=float, default=30.0, help="seconds a trial waits for the flood to hold")
    parser.add_argument("--serve", choices=sorted(POLICIES), help=argparse.SUPPRESS)
    parser.add_argument("--status", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--flood", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_libp2p_logs(False)
    if args.serve:
        trio.run(serve, args.serve, args.status)
        return 0
    if args.flood:
        run_flood(args.flood, args.connections, sources(args.addresses, args.ranges))
        return 0
    if args.quick:
        args.connections, args.addresses, args.ranges, args.trials, args.limit, args.refill = 260, 12, 3, 3, 8.0, 3.0
    print(f"# admission bench: {args.connections} connections from {args.addresses} addresses in {args.ranges} "
          f"/24s held and remade ({RETRY_S:g} s after a close or refusal); {args.trials} newcomers per side, "
          f"each retrying every {TRY_EVERY_S:g} s for up to {args.limit:g} s", flush=True)
    medians = {}
    for side in ("refuse", "ours"):
        r = measure(side, args.connections, args.addresses, args.ranges, args.trials, args.limit, args.refill)
        counted = [t for t, held in zip(r["times"], r["held"], strict=True) if held] or r["times"]
        medians[side] = statistics.median(counted)
        full, final = r["full"], r["final"]
        print(f"{side}: full after {r['fill_s']:.1f} s (inbound {full.get('inbound')}, handshaking "
              f"{full.get('handshaking')}); newcomer admitted after "
              f"{', '.join(f'{t:.2f}' + ('' if h else '*') for t, h in zip(r['times'], r['held'], strict=True))} s "
              f"(limit {args.limit:g}); node: evicted {final.get('evicted')}, trimmed {final.get('trimmed')}, "
              f"refused {final.get('refused')}", flush=True)
    ours, peer = medians["ours"], medians["refuse"]
    ok = ours <= TARGET_S
    verdict = "ok" if ok else "short"
    print(f"admission: ours={ours:.2f} peer={peer:.2f} ratio={peer / ours:.1f} target={TARGET_S} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
