"""Membership bench: an N-node swarm on 127.0.0.1 (default 20), against hivemind's DHT in the same run.

Ours: a LocalSwarm (real ``intellect-node`` processes) with one bootstrap node, then N-1 members
launched at once, all with short advert timings (TIMING below). Measured:
- convergence: from the moment the last node printed its address (all joined) until every node
  lists all N nodes as members (``LocalSwarm.converged()``); also from the first launch;
- DHT get latency: an in-process libp2p client (KadDHT in CLIENT mode, so it stores nothing for
  others) that knows only the bootstrap node gets every node's signed advert the way a node does,
  with ``intellect_node.node.swarm.dht_get.bounded_get`` (the advert's owner and the 3 closest known \
peers at once,
  libp2p's ``get_value`` as the fallback), for several rounds. Its value store is emptied before every \
get (libp2p's fallback
  caches what it fetched), so each get is a real remote lookup.
Peer: bench/_hivemind_side.py in its own process (hivemind and libp2p cannot share one), which
does the same with N hivemind.DHT peers and ``dht.get(key, latest=True)`` from a client-mode peer.

    python bench/membership.py            # 20 nodes, 5 rounds of gets (a few minutes at most)
    python bench/membership.py --quick    # 8 nodes, 3 rounds (under a minute)

The last line reads ``membership: ours=<ms> peer=<ms> ratio=<x> target=3.0 ok|short``: ok when the
median get latency is within 3x of hivemind's and our convergence is within 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from intellect_node.node.demo.local_swarm import LocalSwarm, NodeProcess  # noqa: E402

RUN_ID = "bench-membership"
TIMING = {
    "INTELLECT_NODE_HEARTBEAT_S": "1",
    "INTELLECT_NODE_ADVERT_REFRESH_S": "2",
    "INTELLECT_NODE_ADVERT_LIFETIME_S": "10",
    "INTELLECT_NODE_DISCOVERY_S": "2",
}
ROLES = ("inference", "validator", "trainer")
CONVERGENCE_TARGET_S = 5.0
RATIO_TARGET = 3.0
CONVERGENCE_TIMEOUT_S = 60.0
IDLE_SAMPLE_S = 3.0
GET_TIMEOUT_S = 30.0
VARIANT_DEADLINE_S = 40.0  # per variant
GETS_DEADLINE_S = 150.0  # stop issuing gets after this long (a loaded machine); the output says so


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# ---- ours: convergence -----------------------------------------------------------------------


def member_counts(nodes: list[NodeProcess], pool: ThreadPoolExecutor) -> list[set[str]]:
    return list(pool.map(lambda n: n.member_ids(), nodes))


def start_swarm(swarm: LocalSwarm, n: int) -> dict[str, Any]:
    """Bootstrap first (members need its address), then n-1 members launched at once."""
    t_first = time.monotonic()
    boot = swarm.start_bootstrap()
    t_boot = time.monotonic()
    joined_at: dict[str, float] = {}

    def launch(i: int) -> None:
        name = f"m{i:02d}"
        swarm.start_member(name, ROLES[i % len(ROLES)], [boot.addr])
        joined_at[name] = time.monotonic()

    with ThreadPoolExecutor(max_workers=max(1, n - 1)) as pool:
        list(pool.map(launch, range(n - 1)))
    t_all = max([t_boot, *joined_at.values()])
    return {"t_first": t_first, "t_boot": t_boot, "t_all": t_all, "boot": boot,
            "join_s": sorted(round(t - t_boot, 3) for t in joined_at.values())}


def measure_convergence(swarm: LocalSwarm, t_all: float, poll_s: float = 0.05) -> dict[str, Any]:
    """Poll every node's control socket (in parallel) until every node lists every node."""
    nodes = list(swarm.nodes.values())
    expected = {node.peer_id for node in nodes}
    full_at: dict[str, float] = {}
    trace: list[tuple[float, int]] = []  # (s after all joined, smallest view) per poll
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        while True:
            views = member_counts(nodes, pool)
            now = time.monotonic()
            trace.append((round(now - t_all, 3), min(len(v & expected) for v in views)))
            for node, view in zip(nodes, views, strict=True):
                if expected <= view:
                    full_at.setdefault(node.name, now)
            if all(expected <= view for view in views):
                t_conv = now
                break
            if now - t_all > CONVERGENCE_TIMEOUT_S:
                t_conv = None
                break
            time.sleep(poll_s)
    return {"t_conv": t_conv, "final_view_sizes": sorted(len(v & expected) for v in views), "polls": len(trace),
            "trace": trace, "per_node_full_view_s": sorted(round(t - t_all, 3) for t in full_at.values())}


# ---- ours: DHT get latency -------------------------------------------------------------------


class PhaseTimer:
    """Wraps a few KadDHT methods of one client instance to see where a get spends its time."""

    def __init__(self, dht: Any) -> None:
        self.calls: list[tuple[str, float]] = []
        for owner, name in ((dht.peer_routing, "find_closest_peers_network"),
                            (dht.value_store, "_get_from_peer"), (dht.value_store, "_store_at_peer")):
            self._wrap(owner, name)

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                self.calls.append((name, (time.perf_counter() - start) * 1000))

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        """lookups / lookup_ms: FIND_NODE lookups (a bounded get that fell back to libp2p's get has
        one) and their time; get_rpcs / store_rpcs: libp2p's GET_VALUE queries and entry-correction puts."""
        calls, self.calls = self.calls, []
        return {
            "lookups": sum(1 for name, _ in calls if name == "find_closest_peers_network"),
            "lookup_ms": sum(ms for name, ms in calls if name == "find_closest_peers_network"),
            "get_rpcs": sum(1 for name, _ in calls if name == "_get_from_peer"),
            "store_rpcs": sum(1 for name, _ in calls if name == "_store_at_peer"),
        }


async def variant_gets(dht: Any, peer_ids: list[str], rounds: int) -> dict[str, Any]:
    """Diagnosis (--variants): the same adverts fetched other ways, beside the headline's bounded get.

    get_value: libp2p's own get (iterative lookup, GET_VALUE to every peer found, entry-correction
    puts); quorum1: the same with quorum=1; owner: one GET_VALUE to the advert's owner (its peer id
    is in the key's name), checked like the bounded get's replies.
    """
    import trio
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import PeerInfo

    from intellect_node.node.swarm.dht_get import ask_peer
    from intellect_node.node.swarm.membership import check_advert_record
    from intellect_node.node.swarm.peer_scores import PeerScores
    from intellect_node.protocol.keys import advert_key

    scores = PeerScores()

    async def full(key: str, peer_id: str) -> bytes | None:
        return await dht.get_value(key)

    async def quorum1(key: str, peer_id: str) -> bytes | None:
        return await dht.get_value(key, quorum=1)

    async def owner(key: str, peer_id: str) -> bytes | None:
        peer = ID.from_base58(peer_id)
        try:
            if peer not in dht.host.get_connected_peers():  # the dial, if any, counts in the time
                await dht.host.connect(PeerInfo(peer, dht.host.get_peerstore().addrs(peer)))
        except Exception:  # the owner cannot be reached: not found there
            return None
        return await ask_peer(dht.host, peer, key, check_advert_record, scores)

    out: dict[str, Any] = {}
    for name, fetch in (("get_value", full), ("quorum1", quorum1), ("owner", owner)):
        times: list[float] = []
        found = 0
        began = time.monotonic()
        for _ in range(rounds):
            for peer_id in peer_ids:
                if time.monotonic() - began > VARIANT_DEADLINE_S:
                    break
                key = advert_key(RUN_ID, peer_id)
                dht.value_store.store.clear()
                start = time.perf_counter()
                value = None
                with trio.move_on_after(GET_TIMEOUT_S):
                    value = await fetch(key, peer_id)
                times.append((time.perf_counter() - start) * 1000)
                found += value is not None
        out[name] = {"gets": len(times), "found": found, "median_ms": round(statistics.median(times), 2),
                     "p90_ms": round(percentile(times, 0.9), 2)}
    return out


async def client_gets(boot_addr: str, peer_ids: list[str], rounds: int, node_pids: list[int],
                      variants: bool = False) -> dict[str, Any]:
    import multiaddr
    import trio
    from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
    from libp2p.peer.id import ID
    from libp2p.tools.anyio_service import background_trio_service

    from intellect_node.crypto.identity import Identity
    from intellect_node.node.swarm.dht_get import bounded_get
    from intellect_node.node.swarm.host import build_host, parse_peer_addr, quiet_libp2p_logs
    from intellect_node.node.swarm.membership import AdvertRecordValidator, check_advert_record
    from intellect_node.node.swarm.peer_scores import PeerScores
    from intellect_node.protocol import codec
    from intellect_node.protocol.errors import Rejected
    from intellect_node.protocol.keys import DHT_NAMESPACE, advert_key
    from intellect_node.protocol.messages import NodeAdvert

    quiet_libp2p_logs(bool(os.environ.get("BENCH_DEBUG")))
    host = build_host(Identity.generate())
    boot = parse_peer_addr(boot_addr)
    times: list[list[float]] = []
    phases: list[dict[str, float]] = []
    misses = 0  # no value within GET_TIMEOUT_S
    stale = 0  # a value that no longer verifies when the get returns (expired meanwhile)
    deadline_hit = False
    foreign_values = 0  # values in the client's store it did not fetch itself (should stay 0)
    scores = PeerScores()  # what the bounded get charged to the swarm's nodes (should stay empty)
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        dht = KadDHT(host, DHTMode.CLIENT)
        dht.register_validator(DHT_NAMESPACE, AdvertRecordValidator(PeerScores()))
        async with background_trio_service(dht):
            t0 = time.perf_counter()
            host.get_peerstore().add_addrs(boot.peer_id, boot.addrs, 3600)
            await host.connect(boot)
            await dht.routing_table.add_peer(boot.peer_id)
            connect_ms = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            with trio.move_on_after(15):
                await dht.peer_routing.find_closest_peers_network(host.get_id().to_bytes())  # fill the routing table
            fill_ms = (time.perf_counter() - t0) * 1000
            table_size = dht.get_routing_table_size()
            timer = PhaseTimer(dht)
            cpu = CpuMeter(node_pids)
            own = CpuMeter([os.getpid()], children=False)  # the bench process: this client only
            t_gets = time.monotonic()
            fetched: set[bytes] = set()
            for _ in range(rounds):
                round_times: list[float] = []
                for peer_id in peer_ids:
                    if time.monotonic() - t_gets > GETS_DEADLINE_S:
                        deadline_hit = True
                        break
                    key = advert_key(RUN_ID, peer_id)
                    foreign_values += len(set(dht.value_store.store) - fetched)
                    dht.value_store.store.clear()  # so the get cannot be answered locally
                    timer.take()
                    start = time.perf_counter()
                    value = None
                    with trio.move_on_after(GET_TIMEOUT_S):  # a guard: the bounded get has its own 10 s
                        value = await bounded_get(dht, key, check_advert_record, scores, owner=ID.from_base58(peer_id))
                    elapsed = (time.perf_counter() - start) * 1000
                    phases.append(timer.take())
                    fetched = {key.encode()}
                    if value is None:
                        misses += 1
                        continue
                    try:
                        if codec.decode(value, NodeAdvert).message.peer_id != peer_id:
                            raise ValueError("advert of another peer")
                    except (Rejected, ValueError):  # e.g. expired while the get was running
                        stale += 1
                        continue
                    round_times.append(elapsed)
                times.append(round_times)
                if deadline_hit:
                    break
            swarm_cores = cpu.cores()
            client_cores = own.cores()
            gets_wall_s = time.monotonic() - t_gets
            variant_figures = await variant_gets(dht, peer_ids, max(1, rounds // 2)) if variants else {}
            connected = len(host.get_connected_peers())
    every = [t for r in times for t in r]
    warm = [t for r in times[1:] for t in r]
    return {
        "connect_bootstrap_ms": round(connect_ms, 1), "routing_fill_ms": round(fill_ms, 1),
        "routing_table_size": table_size, "connected_after": connected,
        "get_rounds": rounds, "gets": len(every), "get_misses": misses, "get_stale": stale,
        "gets_deadline_hit": deadline_hit, "foreign_values_in_client_store": foreign_values,
        "get_median_ms": round(statistics.median(every), 2) if every else None,
        "get_p90_ms": round(percentile(every, 0.9), 2) if every else None,
        "get_first_round_median_ms": round(statistics.median(times[0]), 2) if times and times[0] else None,
        "get_warm_median_ms": round(statistics.median(warm), 2) if warm else None,
        "get_warm_p90_ms": round(percentile(warm, 0.9), 2) if warm else None,
        "get_fallbacks": sum(1 for p in phases if p["lookups"]),
        "get_rejected_replies": dict(scores.rejections),
        "get_lookup_phase_median_ms": round(statistics.median(p["lookup_ms"] for p in phases), 2) if phases else None,
        "get_rpcs_per_get_median": statistics.median(p["get_rpcs"] for p in phases) if phases else None,
        "store_rpcs_per_get_median": statistics.median(p["store_rpcs"] for p in phases) if phases else None,
        "swarm_cores_during_gets": swarm_cores,
        "client_cores_during_gets": client_cores,
        "gets_wall_s": round(gets_wall_s, 3),
        "get_count_all": len(phases),
        "get_ms": [[round(t, 2) for t in r] for r in times],
        "variants": variant_figures,
    }


class CpuMeter:
    """CPU used by a set of processes and their children, in cores, since creation."""

    def __init__(self, pids: list[int], children: bool = True) -> None:
        self.pids = pids
        self.children = children
        self.start_wall = time.monotonic()
        self.start_cpu = self._total()

    def _total(self) -> float:
        import psutil

        total = 0.0
        for pid in self.pids:
            try:
                proc = psutil.Process(pid)
                for p in [proc, *(proc.children(recursive=True) if self.children else [])]:
                    times = p.cpu_times()
                    total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def cores(self) -> float:
        return round((self._total() - self.start_cpu) / max(1e-9, time.monotonic() - self.start_wall), 2)


def add_cpu_per_get(figures: dict[str, Any], idle_cores: float) -> None:
    """CPU milliseconds per get on the client side: less sensitive than wall time to a machine
    shared with other work, so it says what a get costs."""
    count = max(1, figures["get_count_all"])
    wall = figures["gets_wall_s"]
    figures["swarm_cores_idle"] = idle_cores
    figures["client_cpu_ms_per_get"] = round(figures["client_cores_during_gets"] * wall * 1000 / count, 2)


def sum_rejections(nodes: list[NodeProcess]) -> dict[str, int]:
    total: dict[str, int] = {}
    for node in nodes:
        try:
            for reason, count in node.status()["rejections"].items():
                total[reason] = total.get(reason, 0) + count
        except OSError:
            continue
    return total


def run_ours(n: int, rounds: int, keep: Path | None, variants: bool = False) -> dict[str, Any]:
    import trio

    root = keep or Path(tempfile.mkdtemp(prefix="bench-membership-"))
    swarm = LocalSwarm(root, run_id=RUN_ID, timing=dict(TIMING))
    try:
        started = start_swarm(swarm, n)
        pids = [node.process.pid for node in swarm.nodes.values()]
        cpu = CpuMeter(pids)
        conv = measure_convergence(swarm, started["t_all"])
        conv_cores = cpu.cores()
        idle = CpuMeter(pids)
        time.sleep(IDLE_SAMPLE_S)
        idle_cores = idle.cores()
        peer_ids = [node.peer_id for node in swarm.nodes.values()]
        gets = trio.run(client_gets, started["boot"].addr, peer_ids, rounds, pids, variants)
        rejections = sum_rejections(list(swarm.nodes.values()))
        add_cpu_per_get(gets, idle_cores)
    finally:
        with ThreadPoolExecutor(max_workers=max(1, len(swarm.nodes))) as pool:
            list(pool.map(swarm.stop, list(swarm.nodes)))
    t_first, t_all, t_conv = started["t_first"], started["t_all"], conv["t_conv"]
    converged = t_conv is not None
    return {
        "side": "ours", "nodes": n, "home": str(root),
        "bootstrap_ready_s": round(started["t_boot"] - t_first, 3),
        "start_all_joined_s": round(t_all - t_first, 3),
        "member_join_s_after_bootstrap": started["join_s"],
        "converged": converged,
        "convergence_s": round(t_conv - t_all, 3) if converged else None,
        "convergence_from_first_launch_s": round(t_conv - t_first, 3) if converged else None,
        "view_sizes_at_end_of_polling": conv["final_view_sizes"],
        "convergence_polls": conv["polls"],
        "per_node_full_view_s": conv["per_node_full_view_s"],
        "min_view_trace": conv["trace"],
        "swarm_cores_during_convergence": conv_cores,
        "swarm_cores_idle": idle_cores,
        "rejections_at_end": rejections,
        **gets,
    }


def run_hivemind(n: int, rounds: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).with_name("_hivemind_side.py")), "--nodes", str(n),
               "--rounds", str(rounds)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"hivemind side failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---- report ----------------------------------------------------------------------------------


def fmt(value: Any) -> str:
    return "-" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))


def fmt1(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(ours: dict[str, Any], peer: dict[str, Any]) -> None:
    rows = [
        ("nodes", "nodes"),
        ("all joined after first launch (s)", "start_all_joined_s"),
        ("convergence after all joined (s)", "convergence_s"),
        ("convergence after first launch (s)", "convergence_from_first_launch_s"),
        ("gets (rounds)", "gets"),
        ("get misses (no value in 30 s)", "get_misses"),
        ("get stale (expired on arrival)", "get_stale"),
        ("get median (ms)", "get_median_ms"),
        ("get p90 (ms)", "get_p90_ms"),
        ("get median, first round (ms)", "get_first_round_median_ms"),
        ("get median, later rounds (ms)", "get_warm_median_ms"),
        ("get p90, later rounds (ms)", "get_warm_p90_ms"),
        ("swarm CPU idle (cores)", "swarm_cores_idle"),
        ("swarm CPU during gets (cores)", "swarm_cores_during_gets"),
        ("client CPU per get (ms)", "client_cpu_ms_per_get"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'':{width}}  {'ours (libp2p)':>14}  {'hivemind':>14}")
    for label, key in rows:
        print(f"{label:{width}}  {fmt(ours.get(key)):>14}  {fmt(peer.get(key)):>14}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 nodes, 3 rounds (under a minute)")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write all figures to this file")
    parser.add_argument("--keep", type=Path, default=None, help="node homes (logs) here instead of a temp dir")
    parser.add_argument("--timing", action="append", default=[], metavar="NAME=VALUE",
                        help="override an advert timing, e.g. ADVERT_REFRESH_S=5 (for diagnosis)")
    parser.add_argument("--variants", action="store_true",
                        help="diagnosis: also time libp2p's get_value, quorum=1 and owner-only gets (not the headline)")
    parser.add_argument("--skip-peer", action="store_true", help="ours only (no ratio; the last line says so)")
    args = parser.parse_args()
    for item in args.timing:
        name, _, value = item.partition("=")
        TIMING["INTELLECT_NODE_" + name.upper().removeprefix("INTELLECT_NODE_")] = value
    n = args.nodes or (8 if args.quick else 20)
    rounds = args.rounds or (3 if args.quick else 5)
    timing = " ".join(f"{k.removeprefix('INTELLECT_NODE_')}={v}" for k, v in TIMING.items())
    print(f"# membership bench: {n} nodes on 127.0.0.1, {rounds} rounds of gets; advert timing {timing}", flush=True)
    load_before = os.getloadavg()

    ours = run_ours(n, rounds, args.keep, args.variants)
    print(f"# ours: converged {fmt(ours['convergence_s'])} s after all joined; "
          f"get median {fmt(ours['get_median_ms'])} ms", flush=True)
    peer: dict[str, Any] = {}
    if not args.skip_peer:
        try:
            peer = run_hivemind(n, rounds)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            print(f"hivemind side failed: {exc}", flush=True)
    load_after = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps({"ours": ours, "hivemind": peer, "timing": TIMING,
                                         "loadavg": [load_before, load_after]}, indent=1))

    print_table(ours, peer)
    print(f"machine: {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"ours: per-node full view (s after all joined): {ours['per_node_full_view_s']}")
    if not ours["converged"]:
        print(f"ours: no convergence within {CONVERGENCE_TIMEOUT_S:g} s; view sizes at the end: "
              f"{ours['view_sizes_at_end_of_polling']}")
    print(f"ours: member join times (s after bootstrap ready): {ours['member_join_s_after_bootstrap']}")
    if ours["gets_deadline_hit"]:
        print(f"ours: stopped issuing gets after {GETS_DEADLINE_S:g} s ({ours['get_count_all']} done)")
    print(f"ours: client connect {ours['connect_bootstrap_ms']} ms, routing fill {ours['routing_fill_ms']} ms "
          f"({ours['routing_table_size']} peers), foreign values in client store "
          f"{ours['foreign_values_in_client_store']}")
    print(f"ours: bounded gets that fell back to libp2p's get: {ours['get_fallbacks']} of {ours['get_count_all']}; "
          f"replies rejected: {ours['get_rejected_replies']}")
    print(f"ours: per get (median): lookup phase {ours['get_lookup_phase_median_ms']} ms, "
          f"{ours['get_rpcs_per_get_median']} GET_VALUE RPCs, {ours['store_rpcs_per_get_median']} "
          f"entry-correction puts; swarm CPU during convergence {ours['swarm_cores_during_convergence']} cores; "
          f"rejections {ours['rejections_at_end']}")
    for name, figures in ours["variants"].items():
        print(f"ours, variant {name}: median {figures['median_ms']} ms, p90 {figures['p90_ms']} ms, "
              f"found {figures['found']}/{figures['gets']}")
    if peer:
        print(f"hivemind: stores done {peer['stores_done_after_all_ready_s']} s after all ready; "
              f"converged={peer['converged']} in {peer['convergence_polls']} polls")
    conv_ok = ours["converged"] and ours["convergence_s"] <= CONVERGENCE_TARGET_S
    print(f"convergence: ours={fmt(ours['convergence_s'])}s "
          f"(from first launch {fmt(ours['convergence_from_first_launch_s'])}s) "
          f"peer={fmt(peer.get('convergence_s'))}s target={CONVERGENCE_TARGET_S:.1f}s {'ok' if conv_ok else 'short'}")
    ours_ms, peer_ms = ours["get_median_ms"], peer.get("get_median_ms")
    ratio = ours_ms / peer_ms if ours_ms and peer_ms else None
    ok = ratio is not None and ratio <= RATIO_TARGET and conv_ok
    print(f"membership: ours={fmt1(ours_ms)} peer={fmt1(peer_ms)} ratio={'-' if ratio is None else f'{ratio:.2f}'} "
          f"target={RATIO_TARGET:.1f} {'ok' if ok else 'short'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
