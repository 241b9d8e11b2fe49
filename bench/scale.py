"""Scale bench: what a connected node costs as the swarm grows, N = 10, 25, 50, 100 real processes.

Each swarm: a bootstrap node, a trainer that publishes what is written to its ``--publish-dir`` (no
model: the light mode), and light members (``join --role seeder``) for the rest, all with the
node's default timings. Where the nodes live:

- ``--netns`` (the default when a size is 50 or more, and this runs as root with ``ip``): each node
  in a network namespace of its own behind one router, at 10.(1+i).1.2 (``SwarmNet``), so every node
  dials from its own address and the per-IP admission caps and stream slots apply at their
  defaults, as between hosts on the internet;
- ``--loopback`` (the default below that, or without root): every node on 127.0.0.1, one source
  address, with the admission caps raised for the bench (``LOOPBACK_ADMISSION``); the stream
  guard's per-IP slots still refuse the swarm's own DHT and gossip streams from N=25 on.

For each N it measures:

- converged view: seconds from the last node's start until every node lists every node;
- idle cost: each process's CPU (psutil ``cpu_times``) and TCP bytes sent + received (``ss -tin``)
  over an idle window after a settle;
- connections per node (``status``'s ``connected_peers``);
- checkpoint to all: a ``CHECKPOINT_MIB`` checkpoint dropped in the trainer's publish directory
  until every node's overlay holds it complete, with the CPU, bytes and gossip messages of that window;
- a newcomer's DHT get latency (p90): bench/membership.py's in-process client, which knows only the
  bootstrap node, fetching a sample of the members' signed adverts with the node's bounded get
  (with --netns from a namespace of its own).

Then each figure's growth from the smallest N to the largest as a ratio. The headline is the
light members' median idle CPU at the largest N over the same at the smallest (target <= 1.2x, and
<= 1% of one core per light member at the largest N).

    python bench/scale.py              # N = 10, 25, 50, 100 in namespaces (memory permitting; ~40 min on 2 cores)
    python bench/scale.py --quick      # N = 6 and 12 on 127.0.0.1, short windows (under a minute)
    python bench/scale.py --sizes 10,50 --netns

Memory: every node is ~120 MB RSS. Before each N the bench reads MemAvailable and stops (saying
why) if N nodes would not fit beside a reserve for the rest of the machine. The namespaces (N + 2)
are removed on exit, on a failure, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import membership  # noqa: E402  (bench/membership.py: the newcomer's DHT client, CPU meter, convergence poll)

from intellect_node.node.demo.local_swarm import LocalSwarm, NodeProcess  # noqa: E402
from tests.support.netns import Namespaces, NetnsUnavailable, enter, unavailable_reason  # noqa: E402
from tests.support.shards_swarm import holds, make_checkpoint  # noqa: E402

RUN_ID = membership.RUN_ID  # the DHT client builds advert keys for this run
LOAD_GATE = 4.0 * (os.cpu_count() or 1)  # a seeder starts once the 1-min load is below this ...
LOAD_GATE_WAIT_S = 120.0  # ... or after this long
START_TIMEOUT_S = 300.0  # a node's address within this (a Python start alone took ~50 s at load 80)
NODE_RSS_MB = 130  # measured ~120 MB per idle node; a margin for the overlay's buffers
RESERVE_MB = 4096  # left for the rest of the machine (other work shares it)
CHECKPOINT_MIB = 4
LAUNCH_WIDTH = 4  # nodes started at once: a 100-node start storm on 2 cores times out handshakes
QUICK_LAUNCH_WIDTH = 12  # --quick's few nodes all at once: on cores shared with other work, more at once get more
IDLE_CORE_TARGET = 0.01
RATIO_TARGET = 1.2
GET_SAMPLE = 20  # adverts the newcomer fetches per N
CHURN_EVERY_S = 60.0  # --churn: a tenth of the light members leave this often
CHURN_AWAY_S = 10.0  # and rejoin this long after they left
CHURN_POLL_S = 10.0  # every running node's control socket is asked this often
STALL_POLLS = 3  # a node that answers none of this many polls in a row stalled
# On 127.0.0.1 every node dials from one address: the inbound admission caps on unproven peers
# per IP (32) refused the 35th joiner's connection to the bootstrap node at N=50. Raised for the
# loopback bench only (specs/connections.md keeps them for public nodes); the stream guard's per-IP
# slots (node/swarm/guard.py) still apply, which public nodes with their own addresses do not meet:
# from N=25 they refuse the swarm's own DHT and gossip streams. --netns gives each node its address.
LOOPBACK_ADMISSION = {"INTELLECT_NODE_UNPROVEN_PER_IP": "250", "INTELLECT_NODE_UNPROVEN_PER_24": "250",
                      "INTELLECT_NODE_UNPROVEN_PER_16": "250", "INTELLECT_NODE_MAX_INBOUND": "250"}
NETNS_FROM_N = 50  # by default, a run with a size this large puts every size's nodes in namespaces
MAX_NETNS_NODES = 250  # node i at 10.(1+i).1.2: one /16 each (and the namespaces a run may make)


class Window:
    """CPU seconds and TCP bytes (sent + received) of each process between construction and ``take``.

    Each node's CPU is divided by the time between its own two readings, and the bytes by the time
    between the starts of the two ``ss`` reads: at N=100 on 2 cores (load 100) one ``ss`` pass over
    the namespaces took tens of seconds, and a single clock for all of it read a node at 5.6% of a
    core and the swarm at 5.7 cores on 2 CPUs."""

    def __init__(self, nodes: dict[str, NodeProcess], net: Loopback | SwarmNet) -> None:
        self.nodes = dict(nodes)
        self.net = net
        self.bytes_at = time.monotonic()
        self.bytes_before = net.socket_bytes(self.nodes)
        self.before = {name: (_cpu_s(node), time.monotonic()) for name, node in self.nodes.items()}

    def take(self) -> dict[str, dict[str, float]]:
        after = {name: (_cpu_s(node), time.monotonic()) for name, node in self.nodes.items()}
        bytes_wall = time.monotonic() - self.bytes_at
        bytes_after = self.net.socket_bytes(self.nodes)
        out = {}
        for name, node in self.nodes.items():
            (cpu_after, at_after), (cpu_before, at_before) = after[name], self.before[name]
            if cpu_after is None or cpu_before is None:
                continue
            pid = node.process.pid
            moved = bytes_after.get(pid, 0) - self.bytes_before.get(pid, 0)
            out[name] = {"cores": (cpu_after - cpu_before) / (at_after - at_before),
                         "bytes_per_s": max(0, moved) / bytes_wall}
        return out


def _cpu_s(node: NodeProcess) -> float | None:
    """User + system CPU seconds of a node's process so far; None once it has exited."""
    import psutil

    try:
        times = psutil.Process(node.process.pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def socket_bytes(namespace: str | None = None) -> dict[int, int]:
    """Bytes sent + received so far on every process's open TCP sockets (``ss -tinp``'s tcp_info),
    in the host's network namespace or ``namespace``'s: a socket closed inside a window loses its
    bytes, so a window's figure is a lower bound."""
    where = ["-N", namespace] if namespace else []
    try:
        text = subprocess.run(["ss", *where, "-tinpH"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    totals: dict[int, int] = {}
    owners: list[int] = []
    for line in text.splitlines():
        pids = [int(pid) for pid in re.findall(r"pid=(\d+)", line)]
        if pids:
            owners = pids
        moved = sum(int(v) for v in re.findall(r"bytes_(?:sent|received):(\d+)", line))
        for pid in owners if moved else ():
            totals[pid] = totals.get(pid, 0) + moved
    return totals


class Loopback:
    """Every node on 127.0.0.1: one source address, so the admission caps are raised for the bench
    (``LOOPBACK_ADMISSION``) and the stream guard's per-IP slots refuse streams from N=25 on."""

    label = "127.0.0.1, admission caps raised"
    env = LOOPBACK_ADMISSION

    def start(self, swarm: LocalSwarm, name: str, args: list[str]) -> NodeProcess:
        return swarm.start(name, args)

    def socket_bytes(self, nodes: dict[str, NodeProcess]) -> dict[int, int]:
        return socket_bytes()

    def as_newcomer(self, job: Callable[[], Any]) -> Any:
        """Run ``job`` (the DHT client) where a newcomer to the swarm would be: here, anywhere."""
        return job()

    def reset(self) -> None:
        """Between sizes: nothing to forget on 127.0.0.1."""


@dataclass
class SwarmNet(Namespaces):
    """A network namespace per node, each linked to one router: every node dials from its own
    address, so the per-IP admission caps (specs/connections.md) and the stream guard's per-IP slots
    meet each node as they would on the internet, at their defaults.

    ``rt``: a namespace that routes between all the others (none has a link to the host's
    namespace, so nothing leaves the machine); node i (in start order): namespace ``n<i>``, ``eth0``
    at 10.(1+i).1.2/24 behind the router's 10.(1+i).1.1, so each node is in a /16 and a /24 of its
    own, as unrelated hosts are (the admission caps also count per /24 and per /16); ``new``: the
    bench's newcomer, the DHT client, at 10.255.1.2. Routed, not bridged: the kernel's ARP table is
    one for all namespaces (gc_thresh3, 1,024 entries), and on one bridge every node holds an entry
    for every node it talks to, N squared in all: at 35 nodes it overflowed and joins timed out; here
    a node holds one (its router) and the router N. Built with ``ip -batch`` (one command for the
    namespaces and links, one per namespace): 3 commands per node took seconds per node on 2
    loaded cores. Removed on exit, on a failure and on Ctrl-C or SIGTERM (``Namespaces``); a run
    killed outright leaves them to the next run's ``cleanup_stale``."""

    nodes: int = 2
    ips: dict[str, tuple[str, str]] = field(default_factory=dict)  # node name -> (namespace, address)
    TOOLS: ClassVar[tuple[str, ...]] = ("ip",)
    env: ClassVar[dict[str, str]] = {}  # the node's own admission caps

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NETNS_NODES:
            raise ValueError(f"from 1 to {MAX_NETNS_NODES} nodes in namespaces")

    @property
    def label(self) -> str:
        return "a network namespace per node (10.x.1.2), the node's own admission caps"

    def _build(self) -> None:
        router, newcomer = self.name("rt"), self.name("new")
        hosts = [self.name(f"n{i}") for i in range(self.nodes)]
        self.created.extend([router, *hosts, newcomer])  # before they exist: close() removes what was made
        _ip_batch([f"netns add {name}" for name in self.created]
                  + [f"link add eth0 netns {host} type veth peer name p{i} netns {router}"
                     for i, host in enumerate([*hosts, newcomer])])
        nets = [*_addresses(len(hosts)), "10.255.1.2"]
        _ip_batch(["link set lo up"] + [line for i, address in enumerate(nets) for line in
                                        (f"addr add {_gateway(address)}/24 dev p{i}", f"link set p{i} up")], router)
        self.sh(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for host, address in zip([*hosts, newcomer], nets, strict=True):
            _ip_batch(["link set lo up", f"addr add {address}/24 dev eth0", "link set eth0 up",
                       f"route add default via {_gateway(address)}"], host)

    def close(self) -> None:
        """Every namespace this run made, in one command (their veths go with them)."""
        if self.created:
            _ip_batch([f"netns delete {name}" for name in self.created], force=True)
        self.created.clear()

    def host(self, node: str) -> tuple[str, str]:
        """The namespace and address of ``node``: the next free one at its first start, the same after."""
        if node not in self.ips:
            i = len(self.ips)
            if i >= self.nodes:
                raise ValueError(f"only {self.nodes} node namespaces were made")
            self.ips[node] = (self.name(f"n{i}"), _addresses(i + 1)[i])
        return self.ips[node]

    def start(self, swarm: LocalSwarm, name: str, args: list[str]) -> NodeProcess:
        namespace, address = self.host(name)
        return swarm.start(name, args, prefix=self.exec_prefix(namespace), listen=f"/ip4/{address}/tcp/0")

    def socket_bytes(self, nodes: dict[str, NodeProcess]) -> dict[int, int]:
        """Per node, its namespace's TCP bytes (one node per namespace)."""
        def one(name: str) -> tuple[int, int]:
            return nodes[name].process.pid, sum(socket_bytes(self.ips[name][0]).values())

        with ThreadPoolExecutor(max_workers=8) as pool:
            return dict(pool.map(one, [name for name in nodes if name in self.ips]))

    def as_newcomer(self, job: Callable[[], Any]) -> Any:
        """Run ``job`` in a thread that entered the newcomer's namespace (a thread's sockets live
        in its namespace; the bench's own thread stays in the host's)."""
        def inside() -> Any:
            enter(self.name("new"))
            return job()

        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(inside).result()

    def reset(self) -> None:
        """Forget which node had which namespace (the next size starts again from n0)."""
        self.ips.clear()


def _addresses(count: int) -> list[str]:
    return [f"10.{1 + i}.1.2" for i in range(count)]


def _gateway(address: str) -> str:
    """The router's side of a node's link: 10.x.1.1 for 10.x.1.2."""
    return address.rsplit(".", 1)[0] + ".1"


def _ip_batch(lines: list[str], namespace: str | None = None, force: bool = False) -> None:
    """``ip -batch``: many commands for one process start; ``force`` goes on past a failed line."""
    command = ["ip", *(["-n", namespace] if namespace else []), *(["-force"] if force else []), "-batch", "-"]
    result = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
                            check=False)
    if result.returncode != 0 and not force:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")


def available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def launch(swarm: LocalSwarm, net: Loopback | SwarmNet, n: int, publish_dir: Path, width: int) -> dict[str, Any]:
    """Bootstrap, trainer (publisher, no model), then n-2 seeders, ``width`` at a time."""
    boot = net.start(swarm, "bootstrap", ["bootstrap"])
    trainer = net.start(swarm, "trainer", ["join", "--role", "trainer", "--bootstrap", boot.addr,
                                           "--publish-dir", str(publish_dir)])
    args = ["join", "--role", "seeder", "--bootstrap", boot.addr, "--trainer", trainer.peer_id]
    failed: list[str] = []

    def start(i: int) -> None:
        """Once more if the first start fails: under load a join's handshake with the bootstrap can
        time out (seen at N=50, load 26), which is a start-up figure, not a reason to lose the size.
        Each start first waits (up to ``LOAD_GATE_WAIT_S``) for the load to fall under
        ``LOAD_GATE``: a forming swarm costs each node ~4% of a core, and at N=100 on 2 cores the
        starts outran the joins (bench/HISTORY.md "the mesh stops churning")."""
        name = f"s{i:03d}"
        gate_until = time.monotonic() + LOAD_GATE_WAIT_S
        while os.getloadavg()[0] > LOAD_GATE and time.monotonic() < gate_until:
            time.sleep(1.0)
        try:
            net.start(swarm, name, args)
        except RuntimeError:
            failed.append(name)
            net.start(swarm, name, args)

    pool = ThreadPoolExecutor(max_workers=width)
    try:
        list(pool.map(start, range(n - 2)))
    finally:  # on Ctrl-C, the starts not begun are dropped (the caller stops the started nodes)
        pool.shutdown(cancel_futures=True)
    return {"boot": boot, "trainer": trainer, "t_all": time.monotonic(), "start_retries": failed, "seeder_args": args}


def statuses(nodes: list[NodeProcess]) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda node: node.status_or_empty(), nodes))


def run_size(n: int, net: Loopback | SwarmNet, windows: dict[str, float], keep: Path | None) -> dict[str, Any]:
    import trio

    root = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-", dir=keep))
    swarm = LocalSwarm(root, run_id=RUN_ID, timing=dict(net.env),  # the node's default timings
                       startup_timeout_s=START_TIMEOUT_S)
    publish_dir = root / "publish"
    out: dict[str, Any] = {"nodes": n, "load_before": round(os.getloadavg()[0], 1)}
    t0 = time.monotonic()
    try:
        started = launch(swarm, net, n, publish_dir, int(windows["launch_width"]))
        out["start_s"] = round(started["t_all"] - t0, 1)
        out["start_retries"] = started["start_retries"]
        conv = membership.measure_convergence(swarm, started["t_all"], poll_s=1.0)
        out["converged"] = conv["t_conv"] is not None
        out["convergence_s"] = round(conv["t_conv"] - started["t_all"], 1) if out["converged"] else None
        out["view_sizes"] = [min(conv["final_view_sizes"]), max(conv["final_view_sizes"])]
        out["forming"] = forming_rates(list(swarm.nodes), statuses(list(swarm.nodes.values())))
        time.sleep(windows["settle"])
        names = list(swarm.nodes)
        gossip_before, since = statuses(list(swarm.nodes.values())), time.monotonic()
        idle = Window(swarm.nodes, net)
        time.sleep(windows["idle"])
        out["idle"] = summarize(idle.take())
        status = statuses(list(swarm.nodes.values()))
        out["idle"]["gossip"] = gossip_rates(names, gossip_before, status, time.monotonic() - since)
        conns = [s["connected_peers"] for s in status if s]
        out["connections"] = {"median": statistics.median(conns), "max": max(conns)} if conns else {}
        out["rejections"] = membership.sum_rejections(list(swarm.nodes.values()))
        out["broadcast"] = broadcast(swarm, net, publish_dir, windows["broadcast_timeout"])
        pids = [node.process.pid for node in swarm.nodes.values()]
        sample = [node.peer_id for node in list(swarm.nodes.values())[:GET_SAMPLE]]
        gets = net.as_newcomer(lambda: trio.run(membership.client_gets, started["boot"].addr, sample, 1, pids))
        out["dht_get"] = {"p90_ms": gets["get_p90_ms"], "median_ms": gets["get_median_ms"],
                          "misses": gets["get_misses"], "gets": gets["gets"]}
        out["rss_mb_median"] = round(statistics.median(_rss_mb(node) for node in swarm.nodes.values()), 1)
    finally:
        _tear_down(swarm, net, root, keep)
    out["load_after"] = round(os.getloadavg()[0], 1)
    return out


def run_churn(n: int, net: Loopback | SwarmNet, minutes: float, keep: Path | None) -> dict[str, Any]:
    """N nodes started and converged, then every CHURN_EVERY_S a tenth of the light members leave
    (SIGTERM) and rejoin CHURN_AWAY_S later with the same home (so the same peer id); a checkpoint
    is published after the first round. Between rounds every running node's control socket is
    polled: a node silent STALL_POLLS polls in a row stalled, a node that exited unasked crashed.
    At the end: seconds until every node lists every node again, and how many hold the checkpoint."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-churn-{n}-", dir=keep))
    swarm = LocalSwarm(root, run_id=RUN_ID, timing=dict(net.env))
    publish_dir = root / "publish"
    rng = random.Random(51)
    out: dict[str, Any] = {"nodes": n, "minutes": minutes, "load_before": round(os.getloadavg()[0], 1)}
    try:
        started = launch(swarm, net, n, publish_dir, LAUNCH_WIDTH)
        conv = membership.measure_convergence(swarm, started["t_all"], poll_s=1.0)
        out["converged_before_s"] = round(conv["t_conv"] - started["t_all"], 1) if conv["t_conv"] else None
        seeders = [name for name in swarm.nodes if name.startswith("s")]
        leaving_per_round = max(1, len(seeders) // 10)
        silent: dict[str, int] = {}
        stalled: set[str] = set()
        crashed: dict[str, int | None] = {}
        exits: list[int | None] = []  # exit codes of the nodes asked to leave
        rejoin_s: list[float] = []
        rejoin_failures: list[str] = []
        published = False
        began = time.monotonic()
        next_round = began
        rounds = 0
        while time.monotonic() - began < minutes * 60:
            if time.monotonic() >= next_round:
                leaving = rng.sample([name for name in seeders if name in swarm.nodes], leaving_per_round)
                with ThreadPoolExecutor(max_workers=8) as pool:
                    exits += list(pool.map(swarm.stop, leaving))
                time.sleep(CHURN_AWAY_S)
                for name in leaving:
                    t0 = time.monotonic()
                    try:
                        net.start(swarm, name, started["seeder_args"])
                        rejoin_s.append(time.monotonic() - t0)
                    except RuntimeError:
                        rejoin_failures.append(name)
                rounds += 1
                next_round += CHURN_EVERY_S
                if not published:  # a checkpoint while members come and go: the overlay must keep serving
                    stage(publish_dir, 2)()
                    published = True
            for name, node in list(swarm.nodes.items()):
                if node.process.poll() is not None and name not in crashed:
                    crashed[name] = node.process.returncode
            answers = dict(zip(swarm.nodes, statuses(list(swarm.nodes.values())), strict=True))
            for name, status in answers.items():
                silent[name] = 0 if status else silent.get(name, 0) + 1
                if silent[name] >= STALL_POLLS:
                    stalled.add(name)
            time.sleep(CHURN_POLL_S)
        out.update({"rounds": rounds, "left_per_round": leaving_per_round, "stalled": sorted(stalled),
                    "crashed": crashed, "leave_exit_codes": sorted({str(code) for code in exits}),
                    "rejoin_s_median": round(statistics.median(rejoin_s), 1) if rejoin_s else None,
                    "rejoin_s_max": round(max(rejoin_s), 1) if rejoin_s else None,
                    "rejoin_failures": rejoin_failures})
        end = time.monotonic()
        running = {name: node for name, node in swarm.nodes.items() if node.process.poll() is None}
        conv = membership.measure_convergence(LocalSwarm(root, nodes=running), end, poll_s=1.0)
        out["converged_after_s"] = round(conv["t_conv"] - end, 1) if conv["t_conv"] else None
        out["view_sizes_after"] = [min(conv["final_view_sizes"]), max(conv["final_view_sizes"])]
        followers = [node for name, node in running.items() if name not in ("bootstrap", "trainer")]
        out["checkpoint_held_by"] = sum(holds(node, 2) for node in followers)
        out["followers"] = len(followers)
        out["rejections"] = membership.sum_rejections(list(running.values()))
    finally:
        _tear_down(swarm, net, root, keep)
    out["load_after"] = round(os.getloadavg()[0], 1)
    return out


def churn_failures(result: dict[str, Any]) -> int:
    """Stalled and crashed nodes, failed rejoins, nodes not converged at the end, followers without the checkpoint."""
    unconverged = 0 if result["converged_after_s"] is not None else result["nodes"] - result["view_sizes_after"][0]
    return (len(result["stalled"]) + len(result["crashed"]) + len(result["rejoin_failures"]) + unconverged
            + result["followers"] - result["checkpoint_held_by"])


def _tear_down(swarm, net, root: Path, keep) -> None:
    """Stop every node (8 at once), remove the namespaces, and the run's files unless kept."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(swarm.stop, list(swarm.nodes)))
    net.reset()
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)


def _rss_mb(node: NodeProcess) -> float:
    import psutil

    try:
        return psutil.Process(node.process.pid).memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


def broadcast(swarm: LocalSwarm, net: Loopback | SwarmNet, publish_dir: Path, timeout_s: float) -> dict[str, Any]:
    """A checkpoint into the trainer's publish directory; seconds until every node holds it."""
    publish = stage(publish_dir, 1)
    followers = [node for name, node in swarm.nodes.items() if name not in ("bootstrap", "trainer")]
    window = Window(swarm.nodes, net)
    gossip_before = statuses(followers)
    began = time.monotonic()
    publish()
    done: dict[str, float] = {}
    while time.monotonic() - began < timeout_s and len(done) < len(followers):
        for node in followers:
            if node.name not in done and holds(node, 1):
                done[node.name] = time.monotonic() - began
        time.sleep(0.2)
    figures = summarize(window.take())
    sent = [gossip_sent(old, new) for old, new in zip(gossip_before, statuses(followers), strict=True)]
    sent = [n for n in sent if n is not None]
    return {"to_all_s": round(max(done.values()), 1) if len(done) == len(followers) else None,
            # each member's own gossip (adverts of its new step, forwards) while the step spread
            "gossip_messages_per_member": statistics.median(sent) if sent else None,
            "held_by": len(done), "followers": len(followers),
            "median_s": round(statistics.median(done.values()), 1) if done else None,
            "cores_per_node": figures["member_cores_median"],
            "bytes_per_s_per_node": figures["member_bytes_per_s_median"],
            "trainer_cores": figures["trainer_cores"]}


def stage(publish_dir: Path, step: int) -> Callable[[], None]:
    """A ``CHECKPOINT_MIB`` checkpoint of ``step`` written beside the trainer's publish directory;
    call the result to publish it, whole at once (a rename)."""
    publish_dir.mkdir(parents=True, exist_ok=True)
    staging = publish_dir / f".writing-{step}"
    make_checkpoint(staging, CHECKPOINT_MIB, seed=step)
    return lambda: os.rename(staging, publish_dir / f"step-{step}.safetensors")


def summarize(per_node: dict[str, dict[str, float]]) -> dict[str, Any]:
    members = [v for name, v in per_node.items() if name.startswith("s")]
    cores = [v["cores"] for v in members]
    return {
        "member_cores_median": round(statistics.median(cores), 4) if cores else None,
        "member_cores_max": round(max(cores), 4) if cores else None,
        "member_bytes_per_s_median": round(statistics.median(v["bytes_per_s"] for v in members)) if members else None,
        "bootstrap_cores": round(per_node.get("bootstrap", {}).get("cores", 0.0), 4),
        "trainer_cores": round(per_node.get("trainer", {}).get("cores", 0.0), 4),
        "swarm_cores": round(sum(v["cores"] for v in per_node.values()), 2),
    }


def gossip_rates(names: list[str], before: list[dict[str, Any]], after: list[dict[str, Any]],
                 elapsed_s: float) -> dict[str, float | None]:
    """The light members' gossip sent per second over the idle window (``status``'s
    ``gossip_rpcs``, node/swarm/mesh_router.py), medians: RPCs, mesh changes (GRAFT + PRUNE), IHAVE."""
    rates: dict[str, list[float]] = {"rpcs": [], "graft_prune": [], "ihave": []}
    for name, old, new in zip(names, before, after, strict=True):
        sent_old, sent_new = (s.get("gossip_rpcs", {}).get("sent") for s in (old, new))
        if not name.startswith("s") or sent_old is None or sent_new is None:
            continue
        per_s = {k: (sent_new.get(k, 0) - sent_old.get(k, 0)) / elapsed_s for k in ("rpcs", "graft", "prune", "ihave")}
        rates["rpcs"].append(per_s["rpcs"])
        rates["graft_prune"].append(per_s["graft"] + per_s["prune"])
        rates["ihave"].append(per_s["ihave"])
    return {f"{kind}_per_s_median": round(statistics.median(v), 2) if v else None for kind, v in rates.items()}


def gossip_sent(before: dict[str, Any], after: dict[str, Any]) -> int | None:
    """Gossip messages a node sent between two ``status`` readings (None: a reading is missing)."""
    old, new = (s.get("gossip_rpcs", {}).get("sent") for s in (before, after))
    return None if old is None or new is None else new.get("messages", 0) - old.get("messages", 0)


def forming_rates(names: list[str], status: list[dict[str, Any]]) -> dict[str, float | None]:
    """The light members' gossip from their start until the view converged, medians: RPCs and
    messages sent per second of their uptime, and their own advert's signings and publishes
    (``status``'s ``gossip_rpcs`` and ``adverts``; a node without ``adverts`` predates the count)."""
    rates: dict[str, list[float]] = {"rpcs_per_s": [], "messages_per_s": [], "advert_published": [],
                                     "advert_signed": []}
    for name, one in zip(names, status, strict=True):
        sent, uptime = one.get("gossip_rpcs", {}).get("sent"), one.get("uptime_s")
        if not name.startswith("s") or sent is None or not uptime:
            continue
        rates["rpcs_per_s"].append(sent.get("rpcs", 0) / uptime)
        rates["messages_per_s"].append(sent.get("messages", 0) / uptime)
        for kind in ("published", "signed"):
            if kind in one.get("adverts", {}):
                rates[f"advert_{kind}"].append(one["adverts"][kind])
    return {f"{kind}_median": round(statistics.median(v), 2) if v else None for kind, v in rates.items()}


FIGURES = (  # (label, path into a size's result)
    ("start (s)", ("start_s",)),
    ("converged view after last start (s)", ("convergence_s",)),
    ("light member idle CPU, median (% core)", ("idle", "member_cores_median")),
    ("light member idle CPU, max (% core)", ("idle", "member_cores_max")),
    ("light member idle bytes/s, median", ("idle", "member_bytes_per_s_median")),
    ("bootstrap idle CPU (% core)", ("idle", "bootstrap_cores")),
    ("trainer idle CPU (% core)", ("idle", "trainer_cores")),
    ("whole swarm idle (cores)", ("idle", "swarm_cores")),
    ("light member gossip RPCs sent/s forming", ("forming", "rpcs_per_s_median")),
    ("light member gossip messages sent/s forming", ("forming", "messages_per_s_median")),
    ("light member advert publishes forming", ("forming", "advert_published_median")),
    ("light member gossip RPCs sent/s idle", ("idle", "gossip", "rpcs_per_s_median")),
    ("light member GRAFT+PRUNE sent/s idle", ("idle", "gossip", "graft_prune_per_s_median")),
    ("light member IHAVE sent/s idle", ("idle", "gossip", "ihave_per_s_median")),
    ("connections per node, median", ("connections", "median")),
    ("connections per node, max", ("connections", "max")),
    ("checkpoint to all (s)", ("broadcast", "to_all_s")),
    ("light member CPU in broadcast (% core)", ("broadcast", "cores_per_node")),
    ("light member bytes/s in broadcast", ("broadcast", "bytes_per_s_per_node")),
    ("gossip messages sent per member in broadcast", ("broadcast", "gossip_messages_per_member")),
    ("newcomer DHT get p90 (ms)", ("dht_get", "p90_ms")),
    ("RSS per node, median (MB)", ("rss_mb_median",)),
)
PERCENT = {("idle", "member_cores_median"), ("idle", "member_cores_max"), ("idle", "bootstrap_cores"),
           ("idle", "trainer_cores"), ("broadcast", "cores_per_node")}


def pick(result: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = result
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def print_table(results: list[dict[str, Any]]) -> None:
    width = max(len(label) for label, _ in FIGURES)
    print(f"{'N':>{width}}  " + "  ".join(f"{r['nodes']:>9}" for r in results) + "  growth")
    for label, path in FIGURES:
        values = [pick(r, path) for r in results]
        shown = [v * 100 if v is not None and path in PERCENT else v for v in values]
        cells = "  ".join(f"{'-' if v is None else f'{v:.2f}' if isinstance(v, float) else v:>9}" for v in shown)
        first, last = values[0], values[-1]
        growth = f"{last / first:.2f}x" if isinstance(first, int | float) and isinstance(last, int | float) and first \
            else "-"
        print(f"{label:>{width}}  {cells}  {growth}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 6 and 12, short windows (under a minute)")
    parser.add_argument("--sizes", default=None, help="comma-separated swarm sizes [10,25,50,100]")
    parser.add_argument("--idle-s", type=float, default=None, help="idle window per size [30; --quick 5]")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the node homes (logs) under this folder")
    parser.add_argument("--churn", type=float, default=None, metavar="MINUTES",
                        help="instead: churn at the largest size for MINUTES (a tenth of the light members "
                             "leave and rejoin every minute)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--netns", action="store_true", default=None,
                       help=f"a network namespace per node (root; the default when a size is >= {NETNS_FROM_N})")
    where.add_argument("--loopback", dest="netns", action="store_false",
                       help="every node on 127.0.0.1 with the admission caps raised (the default below that)")
    args = parser.parse_args()
    sizes = [int(s) for s in (args.sizes or ("6,12" if args.quick else "10,25,50,100")).split(",")]
    use_netns = args.netns if args.netns is not None else max(sizes) >= NETNS_FROM_N
    reason = unavailable_reason(SwarmNet.TOOLS) if use_netns else None
    if reason and args.netns:
        print(f"--netns: {reason}", file=sys.stderr)
        return 2
    if reason:
        print(f"# namespaces unavailable ({reason}): every node on 127.0.0.1, the admission caps raised", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # so the namespaces and the nodes are removed as on Ctrl-C
    try:
        net = SwarmNet(nodes=max(sizes)) if use_netns and not reason else Loopback()
        with net if isinstance(net, SwarmNet) else contextlib.nullcontext():
            return measure(args, sizes, net) if args.churn is None else churn(args, max(sizes), net)
    except NetnsUnavailable as exc:
        print(f"--netns: {exc}", file=sys.stderr)
        return 2


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def churn(args: argparse.Namespace, n: int, net: Loopback | SwarmNet) -> int:
    """``--churn``: one size, its figures, and a headline that counts what went wrong (target 0)."""
    membership.CONVERGENCE_TIMEOUT_S = 300.0
    print(f"# churn bench: N={n} for {args.churn:g} min, {net.label}; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    result = run_churn(n, net, args.churn, args.keep)
    print(f"# N={n}: " + json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"churn": result, "network": net.label}, indent=1))
    failures = churn_failures(result)
    print(f"churn: ours={failures} peer=0 ratio=- target=0 (stalled, crashed, failed rejoins, unconverged, "
          f"without the checkpoint at N={n}) {'ok' if failures == 0 else 'short'}")
    return 0


def measure(args: argparse.Namespace, sizes: list[int], net: Loopback | SwarmNet) -> int:
    """Every size in turn on ``net``, then the table and the headline."""
    windows = {"settle": 3.0 if args.quick else 20.0, "idle": args.idle_s or (5.0 if args.quick else 30.0),
               "broadcast_timeout": 60.0 if args.quick else 180.0,
               "launch_width": QUICK_LAUNCH_WIDTH if args.quick else LAUNCH_WIDTH}
    membership.CONVERGENCE_TIMEOUT_S = 60.0 if args.quick else 180.0
    print(f"# scale bench: sizes {sizes}, windows {windows}; node default timings; {net.label}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    stopped = None
    for n in sizes:
        need, have = n * NODE_RSS_MB + RESERVE_MB, available_mb()
        if need > have:
            stopped = f"N={n} needs ~{need} MB ({n} x {NODE_RSS_MB} + {RESERVE_MB} reserve), {have} MB available"
            print(f"# stopping before {stopped}", flush=True)
            break
        result = run_size(n, net, windows, args.keep)
        results.append(result)
        print(f"# N={n}: " + json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "stopped": stopped, "windows": windows,
                                         "network": net.label}, indent=1))
    if not results:
        print("scale: ours=- peer=- ratio=- target=1.2 short")
        return 1
    print_table(results)
    if stopped:
        print(f"stopped: {stopped}")
    first, last = results[0]["idle"]["member_cores_median"], results[-1]["idle"]["member_cores_median"]
    ratio = last / first if first else None
    ok = ratio is not None and ratio <= RATIO_TARGET and last <= IDLE_CORE_TARGET and len(results) > 1
    print(f"scale: ours={last * 100:.2f}%@N={results[-1]['nodes']} peer={first * 100:.2f}%@N={results[0]['nodes']} "
          f"ratio={'-' if ratio is None else f'{ratio:.2f}'} target={RATIO_TARGET} (and <= 1% core) "
          f"{'ok' if ok else 'short'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
