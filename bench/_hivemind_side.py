"""The hivemind half of bench/membership.py, run in its own process (hivemind and py-libp2p cannot
share one: both register the protobuf symbol crypto.pb.KeyType).

N hivemind.DHT peers on 127.0.0.1 (each its own process plus its p2pd daemon): the first starts
alone, the other N-1 are launched at once with the first as initial peer. Each peer stores a value
of ``--value-bytes`` random bytes under its own key (expiration now + 60 s) as soon as it is ready.
Measured:
- convergence: from the moment the last peer is ready until every peer can get every peer's key
  (polled from every peer, the analogue of "every node sees every advert");
- get latency: a fresh client-mode peer (cache_locally=False, so no answer comes from its own cache)
  bootstrapped from the first peer runs ``dht.get(key, latest=True)`` for every peer's key, for
  ``--rounds`` rounds; per-get wall time in ms.
Prints one JSON document on stdout (everything else goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:  # the DHT process and its p2pd daemon
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


class CpuMeter:
    def __init__(self, pids: list[int]) -> None:
        self.pids, self.wall, self.cpu = pids, time.monotonic(), _cpu_seconds(pids)

    def cores(self) -> float:
        return round((_cpu_seconds(self.pids) - self.cpu) / max(1e-9, time.monotonic() - self.wall), 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--value-bytes", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()

    import hivemind
    from hivemind.utils import get_dht_time

    out: dict[str, Any] = {"side": "hivemind", "hivemind_version": hivemind.__version__, "nodes": args.nodes}
    peers: list[Any] = []
    client = None
    try:
        t_first = time.monotonic()
        first = hivemind.DHT(start=True)
        peers.append(first)
        initial = [str(a) for a in first.get_visible_maddrs()]
        for _ in range(args.nodes - 1):
            peers.append(hivemind.DHT(initial_peers=initial, start=True, await_ready=False))
        keys = [f"bench-membership/{i}" for i in range(args.nodes)]
        values = [os.urandom(args.value_bytes) for _ in range(args.nodes)]
        ready_at: list[float] = []
        store_futures = []
        for i, peer in enumerate(peers):
            peer.wait_until_ready(args.timeout)
            ready_at.append(time.monotonic())
            store_futures.append(peer.store(keys[i], values[i], get_dht_time() + 60, return_future=True))
        t_all = max(ready_at)
        stored = [f.result(args.timeout) for f in store_futures]
        t_stored = time.monotonic()

        # Convergence: poll from every peer for every key it has not got yet.
        missing = {i: set(range(args.nodes)) for i in range(args.nodes)}
        full_at: dict[int, float] = {}
        polls = 0
        while any(missing.values()):
            if time.monotonic() - t_all > args.timeout:
                break
            polls += 1
            pending = [(i, j, peers[i].get(keys[j], return_future=True)) for i in missing for j in missing[i]]
            for i, j, future in pending:
                result = future.result(args.timeout)
                if result is not None and result.value == values[j]:
                    missing[i].discard(j)
            now = time.monotonic()
            for i in missing:
                if not missing[i] and i not in full_at:
                    full_at[i] = now
            if any(missing.values()):
                time.sleep(0.05)
        converged = not any(missing.values())
        t_conv = max(full_at.values()) if converged else float("nan")

        pids = [peer.pid for peer in peers]
        idle = CpuMeter(pids)
        time.sleep(3.0)
        idle_cores = idle.cores()

        # Get latency from a fresh client-mode peer.
        client = hivemind.DHT(initial_peers=initial, start=True, client_mode=True, cache_locally=False)
        rounds: list[list[float]] = []
        misses = 0
        during_gets = CpuMeter(pids)
        client_meter = CpuMeter([client.pid])
        t_gets = time.monotonic()
        for _ in range(args.rounds):
            times: list[float] = []
            for j in range(args.nodes):
                start = time.perf_counter()
                result = client.get(keys[j], latest=True)
                elapsed = (time.perf_counter() - start) * 1000
                if result is None or result.value != values[j]:
                    misses += 1
                    continue
                times.append(elapsed)
            rounds.append(times)
        gets_cores = during_gets.cores()
        client_cores = client_meter.cores()
        gets_wall = time.monotonic() - t_gets
        count = max(1, args.rounds * args.nodes)
        every = [t for r in rounds for t in r]
        warm = [t for r in rounds[1:] for t in r]
        out.update({
            "start_all_ready_s": round(t_all - t_first, 3),
            "stores_ok": sum(bool(s) for s in stored),
            "stores_done_after_all_ready_s": round(t_stored - t_all, 3),
            "converged": converged,
            "convergence_s": round(t_conv - t_all, 3),
            "convergence_from_first_launch_s": round(t_conv - t_first, 3),
            "convergence_polls": polls,
            "per_peer_full_view_s": sorted(round(v - t_all, 3) for v in full_at.values()),
            "swarm_cores_idle": idle_cores,
            "swarm_cores_during_gets": gets_cores,
            "client_cores_during_gets": client_cores,
            "gets_wall_s": round(gets_wall, 3),
            "client_cpu_ms_per_get": round(client_cores * gets_wall * 1000 / count, 2),
            "get_rounds": args.rounds,
            "gets": len(every),
            "get_misses": misses,
            "get_median_ms": round(statistics.median(every), 2) if every else None,
            "get_p90_ms": round(_percentile(every, 0.9), 2) if every else None,
            "get_first_round_median_ms": round(statistics.median(rounds[0]), 2) if rounds and rounds[0] else None,
            "get_warm_median_ms": round(statistics.median(warm), 2) if warm else None,
            "get_warm_p90_ms": round(_percentile(warm, 0.9), 2) if warm else None,
            "get_ms": [[round(t, 2) for t in r] for r in rounds],
        })
    finally:
        everyone = ([client] if client is not None else []) + peers
        with ThreadPoolExecutor(max_workers=max(1, len(everyone))) as pool:
            list(pool.map(lambda p: p.shutdown(), everyone))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
