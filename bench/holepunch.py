"""Hole-punch success by NAT kind: how often two homes that meet through a relay end up directly
connected, and why they did not when they did not (issue 33).

Why: a NATed node's connections go through a relay (bounded in bytes and time, specs/reachability.md)
until DCUtR punches a direct one; whether that works decides whether homes can feed each other
checkpoints. iroh reports direct connections in about 90% of cases on NATs that allow punching;
this bench measures ours on the NATs iptables can build.

How: in the namespace internet of tests/support/netns.py (as root; `ip`, `iptables`, `ss`), a
try is one pair of homes, each behind its own router of one kind, and a public bootstrap that is
also their relay. Fresh namespaces, identities and listen ports every round; several pairs run
at once, in separate swarms (one bootstrap each). Nothing is arranged between the homes: they
join, learn they are private, reserve on the relay, find each other's relayed address in the
members exchange, connect through the relay, and DCUtR (both sides drive it every 2 s) tries to
replace that connection with a direct one. A try ends:

- **direct after punch**: a home's `status` lists the other under `relay.peers_direct` after it was
  connected through the relay, and the home's kernel (`ss`) holds an established TCP connection to
  the other home's router; the routers' conntrack entries show the ports the punch used;
- **relayed only**: connected through the relay, no direct connection within `--bound-s` of that;
- **failed**: not even connected through the relay within `CONNECT_BOUND_S` (or a node died).

Each try that is not direct is explained from the routers (conntrack: which source port the
punch's SYN left from; counters: unsolicited SYNs from the other home's router dropped or reset),
the homes' `relay.hole_punches` counters and what their DCUtR and TCP dials logged (py-libp2p's
`LIBP2P_DEBUG`, into a file in each home; `--logs DIR` keeps the homes).

The NAT kinds (every router masquerades the home's private address out of its WAN address):

| kind | mapping | unsolicited inbound | allows punching here |
|---|---|---|---|
| `eim-drop` | endpoint-independent (MASQUERADE keeps the source port when free) | dropped | yes |
| `eim-reset` | endpoint-independent | answered with a TCP reset (`REJECT ... tcp-reset`) | no, at zero link delay |
| `symmetric` | address-and-port-dependent (`MASQUERADE --random-fully`: a new port per connection) | dropped | no |
| `drop+reset` | one home's router `eim-drop`, the other's `eim-reset` | | yes |
| `drop+symmetric` | one home's router `eim-drop`, the other's `symmetric` | | no |

The default run has the first three; the mixed pairs are for `--kinds`.

`eim-reset` has the mapping punching needs, but the first SYN to reach the other router before
that router's own SYN left is reset, which fails the dial and, passing back, deletes the mapping
the SYN had opened (conntrack drops an unreplied entry whose only reply is a reset), so the
peer's SYN is reset too. Only SYNs that cross in flight get through: |skew between the two
dials| < one-way delay. Links between namespaces have next to no delay (netem is not available
here, tbf adds none), so this kind is punched here only when the dials happen to cross; on the
internet, with tens of ms one way, a punch timed to RTT/2 can be. RFC 5382 REQ-4 asks NATs not
to answer an unsolicited SYN for 6 s for this reason. It is measured and reported, and kept out
of the headline, whose share is over the kinds marked "yes"; the share over every
endpoint-independent try (reset included) is printed on the line before it. `symmetric` defeats
TCP punching without port prediction: the peer dials the port the home listens on, the router
sends the home's SYN from another; one such router in a pair is enough. In `drop+reset` the
dropping router keeps the punch alive: the SYN it drops leaves the other side's mapping open, and
its own home, whose first SYN may have been reset, dials again (the swarm retries a refused dial
after 0.1-0.4 s) into that mapping.

The last line: `holepunch: ours=<direct share on the kinds that allow punching> peer=0.90
ratio=<ours/0.90> target=0.90 ok|short`.

    sudo .venv/bin/python bench/holepunch.py --quick          # 1 try per kind, under a minute
    sudo .venv/bin/python bench/holepunch.py                  # 10 tries per kind, about 11 minutes
    sudo .venv/bin/python bench/holepunch.py --kinds eim-drop --tries 20
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from intellect_node.node.demo.local_swarm import LocalSwarm, NodeProcess  # noqa: E402
from tests.support.netns import MAX_HOSTS, SmallInternet, unavailable_reason  # noqa: E402

PEER = 0.90  # iroh's reported share of direct connections
TARGET = 0.90
CONNECT_BOUND_S = 60.0  # from the second home's start until the homes are connected through the relay
POLL_S = 0.25
# py-libp2p's own switch (libp2p/utils/logging.py): DCUtR's steps and the TCP transport's dials
# (refused, address in use) into a file of each home, nothing else of libp2p
LIBP2P_DEBUG = "relay.circuit_v2.dcutr:DEBUG,transport.tcp:DEBUG,network.swarm:DEBUG"
LIBP2P_LOG = "libp2p-debug.log"
TELLING = ("Successfully established", "Failed to establish", "Failed to open TCP stream", "Timeout",
           "Unexpected error opening TCP stream", "Error in DCUtR", "Error initiating", "Maximum hole punch",
           "Concurrent hole punch", "Hole punch already", "No direct addresses", "Unilateral direct upgrade",
           "failed to upgrade", "fail to upgrade")


# --- NAT kinds -------------------------------------------------------------------------------------------

Router = Callable[[SmallInternet, str], None]  # turns one of SmallInternet's routers into a kind


@dataclass(frozen=True)
class NatKind:
    name: str
    allows: bool  # does this kind allow a TCP hole punch in these namespaces
    what: str
    sides: tuple[Router, Router]  # the first home's router, the second's
    eim: bool = True  # both mappings endpoint-independent


def _as_built(net: SmallInternet, router: str) -> None:
    """SmallInternet's router: MASQUERADE, unsolicited inbound dropped."""


def _reset_unsolicited(net: SmallInternet, router: str) -> None:
    """Answer an unsolicited inbound TCP SYN with a reset instead of dropping it."""
    drop = ["INPUT", "-i", "up0", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"]
    net.sh(router, "iptables", "-D", *drop)
    net.sh(router, "iptables", "-A", "INPUT", "-i", "up0", "-p", "tcp", "-m", "conntrack", "--ctstate", "NEW",
           "-j", "REJECT", "--reject-with", "tcp-reset")
    net.sh(router, "iptables", "-A", *drop)


def _random_ports(net: SmallInternet, router: str) -> None:
    """A new random source port for every connection (address-and-port-dependent mapping)."""
    masquerade = ["POSTROUTING", "-o", "up0", "-j", "MASQUERADE"]
    net.sh(router, "iptables", "-t", "nat", "-D", *masquerade)
    net.sh(router, "iptables", "-t", "nat", "-A", *masquerade, "--random-fully")


KINDS = {kind.name: kind for kind in (
    NatKind("eim-drop", True, "endpoint-independent mapping, unsolicited inbound dropped", (_as_built, _as_built)),
    NatKind("eim-reset", False, "endpoint-independent mapping, unsolicited inbound SYN answered with a reset",
            (_reset_unsolicited, _reset_unsolicited)),
    NatKind("symmetric", False, "a new random port per connection (MASQUERADE --random-fully), inbound dropped",
            (_random_ports, _random_ports), eim=False),
    NatKind("drop+reset", True, "one home's router as eim-drop, the other's as eim-reset",
            (_as_built, _reset_unsolicited)),
    NatKind("drop+symmetric", False, "one home's router as eim-drop, the other's as symmetric",
            (_as_built, _random_ports), eim=False),
)}
DEFAULT_KINDS = ("eim-drop", "eim-reset", "symmetric")


def _count_from(net: SmallInternet, router: str, peer_wan: str) -> None:
    """Counting rules (no target) first in INPUT: unsolicited TCP from the other home's router, by
    conntrack state. What the router then does with them is its kind's rule further down."""
    for state in ("NEW", "INVALID"):
        net.sh(router, "iptables", "-I", "INPUT", "1", "-i", "up0", "-s", peer_wan, "-p", "tcp",
               "-m", "conntrack", "--ctstate", state)


def _unsolicited(net: SmallInternet, router: str, peer_wan: str) -> dict[str, int]:
    """Packets the counting rules saw: {"NEW": n, "INVALID": m}."""
    counts = {}
    for line in net.sh(router, "iptables", "-nvxL", "INPUT").splitlines():
        fields = line.split()  # pkts bytes [target] prot opt in out source destination ...: no target here
        if len(fields) > 3 and fields[0].isdigit() and fields[2] in ("tcp", "6") and peer_wan in fields:
            counts[fields[-1]] = int(fields[0])
    return counts


# --- topology: pairs of homes, each pair with its own relay ------------------------------------------------

@dataclass
class Slot:
    """Pair ``index`` of a round: relay/bootstrap in ``pub{index}``, homes ``2*index+1`` and ``+2``."""

    index: int

    @property
    def public(self) -> str:
        return f"pub{self.index}"

    @property
    def public_ip(self) -> str:
        return f"198.18.0.{2 + self.index}"

    @property
    def homes(self) -> tuple[int, int]:
        return 2 * self.index + 1, 2 * self.index + 2


def home_ip(n: int) -> str:
    return f"198.19.{n}.2"


def wan_ip(n: int) -> str:
    return f"198.18.0.{10 + n}"


@dataclass
class Try:
    number: int
    kind: NatKind
    slot: Slot
    ports: tuple[int, int] = (0, 0)
    swarm: LocalSwarm | None = None
    homes: list[NodeProcess] = field(default_factory=list)
    started_at: float = 0.0  # monotonic, when both homes were running
    relayed_at: float | None = None
    direct_at: float | None = None
    outcome: str = ""  # direct | relayed-only | failed
    detail: str = ""  # how it went direct, or why not
    reason: str = ""  # a short category of why not (explained failures), "" when direct

    def seconds(self, at: float | None) -> str:
        return "-" if at is None else f"{at - self.started_at:.1f} s"


def _start_or_fail(attempt: Try, net: SmallInternet, root: Path) -> None:
    """``_start_pair``; a node that does not start fails the try (its reason), not the round."""
    try:
        _start_pair(attempt, net, root)
    except (RuntimeError, OSError) as exc:
        attempt.outcome, attempt.reason = "failed", "a node did not start"
        attempt.detail = str(exc)[-500:]


def _start_pair(attempt: Try, net: SmallInternet, root: Path) -> None:
    """The pair's bootstrap (its relay) and both homes, fresh identities, random listen ports."""
    slot = attempt.slot
    swarm = LocalSwarm(root / f"try{attempt.number}", run_id=f"holepunch-{attempt.number}-{random.getrandbits(32):x}")
    attempt.swarm = swarm
    boot = swarm.start("boot", ["bootstrap"], prefix=net.exec_prefix(net.name(slot.public)),
                       listen=f"/ip4/{slot.public_ip}/tcp/4001")
    attempt.ports = (random.randint(20000, 60999), random.randint(20000, 60999))
    for n, port in zip(slot.homes, attempt.ports, strict=True):
        debug = {"LIBP2P_DEBUG": LIBP2P_DEBUG, "LIBP2P_DEBUG_FILE": str(swarm.root / f"home{n}" / LIBP2P_LOG)}
        attempt.homes.append(swarm.start(f"home{n}", ["join", "--role", "validator", "--bootstrap", boot.addr],
                                         debug, prefix=net.exec_prefix(net.name(f"home{n}")),
                                         listen=f"/ip4/{home_ip(n)}/tcp/{port}"))
    attempt.started_at = time.monotonic()


def _paths(attempt: Try) -> tuple[set[str], set[str]]:
    """Which homes list the other as connected through a relay, and as directly connected."""
    relayed, direct = set(), set()
    for me, other in ((0, 1), (1, 0)):
        relay = attempt.homes[me].status_or_empty().get("relay") or {}
        peer = attempt.homes[other].peer_id
        if peer in relay.get("peers_through_relay", []):
            relayed.add(attempt.homes[me].name)
        if peer in relay.get("peers_direct", []):
            direct.add(attempt.homes[me].name)
    return relayed, direct


def _poll(attempt: Try, bound_s: float) -> bool:
    """One look at a running try; True once it is decided (its outcome is then set)."""
    now = time.monotonic()
    relayed, direct = _paths(attempt)
    if (relayed or direct) and attempt.relayed_at is None:
        attempt.relayed_at = now
    if direct:
        attempt.direct_at = now
        attempt.outcome = "direct"
        return True
    if any(home.process.poll() is not None for home in attempt.homes):
        attempt.outcome = "failed"
        return True
    if attempt.relayed_at is None and now - attempt.started_at > CONNECT_BOUND_S:
        attempt.outcome = "failed"
        return True
    if attempt.relayed_at is not None and now - attempt.relayed_at > bound_s:
        attempt.outcome = "relayed-only"
        return True
    return False


def _stop_soon(attempt: Try) -> None:
    """SIGTERM the pair's nodes without waiting (the round reaps them): frees the CPU for the others."""
    for node in (attempt.swarm.nodes.values() if attempt.swarm else []):
        if node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)


# --- evidence ------------------------------------------------------------------------------------------------

def _kernel_direct(net: SmallInternet, n: int, peer_n: int) -> list[str]:
    """Established TCP connections in home ``n`` to the other home's router: the punched path."""
    out = net.sh(net.name(f"home{n}"), "ss", "-Htn", "state", "established")
    return [" <-> ".join(line.split()[-2:]) for line in out.splitlines() if f"{wan_ip(peer_n)}:" in line]


def _conntrack(net: SmallInternet, n: int, peer_n: int) -> list[str]:
    """Router ``n``'s TCP conntrack entries from its home to the other router: state and the source
    port as sent by the home -> as mapped onto the WAN."""
    text = net.sh(net.name(f"nat{n}"), "cat", "/proc/net/nf_conntrack")
    found = []
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for key, value in re.findall(r"(\w+)=(\S+)", line):
            fields.setdefault(key, value)  # the first of each key: the original direction
        if " tcp " not in f" {line} " or fields.get("src") != home_ip(n) or fields.get("dst") != wan_ip(peer_n):
            continue
        reply = re.findall(r"dport=(\d+)", line)
        state = line.split()[5]
        mapped = reply[1] if len(reply) > 1 else "?"
        found.append(f"{state} :{fields['sport']}->:{mapped} to :{fields['dport']}")
    return found


def _dcutr_log(node: NodeProcess) -> Counter[str]:
    """What the home's DCUtR and TCP dials said (LIBP2P_DEBUG's file), by message, peer ids left out:
    outcomes, and why dials failed."""
    try:
        text = (node.home / LIBP2P_LOG).read_text(errors="replace")
    except OSError:
        return Counter()
    lines: Counter[str] = Counter()
    for line in text.splitlines():
        parts = line.split(" - ", 3)  # time - logger - level - message
        if len(parts) < 4 or not parts[3].startswith(TELLING):
            continue
        message = re.sub(r"(?:/p2p/)?\b12D3Koo[1-9A-HJ-NP-Za-km-z]{20,}", "<peer>", parts[3])
        lines[message.replace("Unexpected error opening TCP stream: ", "")] += 1
    return lines


def _why(counts: dict[str, dict[str, int]], conntrack: dict[str, list[str]], ports: dict[str, int],
         punches: dict[str, dict[str, Any]], logs: dict[str, Counter[str]]) -> str:
    """A short category for a try that did not go direct, from what the routers and homes saw."""
    remapped = [entry for name, entries in conntrack.items() for entry in entries
                if f":{ports[name]}->" in entry and f":{ports[name]}->:{ports[name]} " not in entry]
    said = " ".join(message for log in logs.values() for message in log)
    if remapped:
        return "mapping: the punch's SYN left its router from another port than the one the peer dials"
    if "Connection refused" in said:
        return "reset: the other router answered punch SYNs with a reset before its own home's SYN passed"
    if "upgrade" in said:
        return "handshake: a punched TCP connection failed its security or muxer upgrade"
    if "Cannot assign requested address" in said:
        return "collision: concurrent DCUtR sessions dialed the same address from the same port"
    if not any(p.get("attempted") or p.get("answered") for p in punches.values()):
        return "no DCUtR exchange ran within the bound"
    if sum(c.get("NEW", 0) for c in counts.values()):
        return "dropped: punch SYNs met no mapping on the other router (timing)"
    return "unexplained"


def _explain(attempt: Try, net: SmallInternet) -> None:
    """Fill ``detail`` (and ``reason`` when not direct) from the routers, the homes' status and logs."""
    a, b = attempt.slot.homes
    names = {a: f"home{a}", b: f"home{b}"}
    ports = {names[a]: attempt.ports[0], names[b]: attempt.ports[1]}
    counts = {names[n]: _unsolicited(net, net.name(f"nat{n}"), wan_ip(m)) for n, m in ((a, b), (b, a))}
    conntrack = {names[n]: _conntrack(net, n, m) for n, m in ((a, b), (b, a))}
    kernel = {names[n]: _kernel_direct(net, n, m) for n, m in ((a, b), (b, a))}
    statuses = {home.name: home.status_or_empty() for home in attempt.homes}
    punches = {name: {k: v for k, v in ((s.get("relay") or {}).get("hole_punches") or {}).items() if v}
               for name, s in statuses.items()}
    logs = {home.name: _dcutr_log(home) for home in attempt.homes}
    facts = [f"routers saw unsolicited SYNs from the other router {counts}",
             f"conntrack (home port -> WAN port) {conntrack}", f"DCUtR {punches}"]
    if attempt.outcome == "direct":
        if not any(kernel.values()):
            attempt.outcome, attempt.reason = "relayed-only", "status said direct, the kernel showed no such TCP"
        attempt.detail = "; ".join([f"kernel {kernel}", *facts])
        return
    reached = {name: {"state": (s.get("reachability") or {}).get("state"),
                      "relayed_addrs": len((s.get("relay") or {}).get("relayed_addrs", [])),
                      "relayed_dials": (s.get("relay") or {}).get("relayed_dials")} for name, s in statuses.items()}
    if attempt.outcome == "failed":
        dead = [home.name for home in attempt.homes if home.process.poll() is not None]
        attempt.reason = f"node died: {dead}" if dead else "never connected through the relay"
        facts.insert(0, f"homes {reached}")
    else:
        attempt.reason = _why(counts, conntrack, ports, punches, logs)
    top = {name: dict(log.most_common(4)) for name, log in logs.items() if log}
    attempt.detail = "; ".join([*facts, f"DCUtR log {top}"])


# --- rounds ------------------------------------------------------------------------------------------------

@contextmanager
def _homes_root(logs: Path | None) -> Iterator[Path]:
    """Where a round's nodes keep their homes: a folder under ``logs``, kept; else a temporary one."""
    if logs is None:
        with tempfile.TemporaryDirectory(prefix="ina-holepunch-") as tmp:
            yield Path(tmp)
        return
    logs.mkdir(parents=True, exist_ok=True)
    yield Path(tempfile.mkdtemp(prefix="round-", dir=logs))


def run_round(tries: list[Try], bound_s: float, logs: Path | None) -> None:
    """One namespace internet holding every pair of this round; each try decided and explained.
    The nodes' homes (logs included) go under ``logs`` when given, else into a temporary folder."""
    with SmallInternet(publics=len(tries), homes=2 * len(tries)) as net, \
            _homes_root(logs) as root:
        for attempt in tries:
            a, b = attempt.slot.homes
            for (n, m), side in zip(((a, b), (b, a)), attempt.kind.sides, strict=True):
                side(net, net.name(f"nat{n}"))
                _count_from(net, net.name(f"nat{n}"), wan_ip(m))
        try:
            with ThreadPoolExecutor(len(tries)) as pool:
                list(pool.map(lambda t: _start_or_fail(t, net, root), tries))
            running = [attempt for attempt in tries if not attempt.outcome]
            while running:
                time.sleep(POLL_S)
                for attempt in list(running):
                    if _poll(attempt, bound_s):
                        running.remove(attempt)
                        _explain(attempt, net)
                        _stop_soon(attempt)
        finally:
            for attempt in tries:
                if attempt.swarm:
                    _stop_soon(attempt)
                    attempt.swarm.stop_all()


def report_try(attempt: Try) -> None:
    head = (f"try {attempt.number} {attempt.kind.name}: {attempt.outcome}; relayed at "
            f"{attempt.seconds(attempt.relayed_at)}, direct at {attempt.seconds(attempt.direct_at)}")
    if attempt.outcome == "direct" and attempt.relayed_at is not None and attempt.direct_at is not None:
        head += f" (+{attempt.direct_at - attempt.relayed_at:.1f} s after the relay)"
    if attempt.reason:
        head += f"\n    why: {attempt.reason}"
    print(f"{head}\n    {attempt.detail}", flush=True)


def _span(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):.1f} [{min(seconds):.1f}-{max(seconds):.1f}]" if seconds else "-"


def summarize(done: list[Try], kinds: list[NatKind]) -> None:
    """Per kind: outcomes, time to direct, the reasons of every try that was not direct; the headline."""
    print("\nkind           allows  direct  relayed-only  failed  to direct (s): from start | from relayed, "
          "median [min-max]  reasons")
    for kind in kinds:
        mine = [t for t in done if t.kind is kind]
        outcome = Counter(t.outcome for t in mine)
        to_direct = [(t.direct_at - t.started_at, t.direct_at - (t.relayed_at or t.started_at))
                     for t in mine if t.outcome == "direct" and t.direct_at is not None]
        spans = [_span([start for start, _ in to_direct]), _span([relayed for _, relayed in to_direct])]
        reasons = dict(Counter(t.reason for t in mine if t.reason))
        print(f"{kind.name:<14} {'yes' if kind.allows else 'no':<7} {outcome['direct']:>3}/{len(mine):<3} "
              f"{outcome['relayed-only']:>6}/{len(mine):<6} {outcome['failed']:>3}/{len(mine):<3} "
              f"{' | '.join(spans):<44} {reasons or ''}")
    unexplained = [t.number for t in done if t.reason == "unexplained"]
    print(f"tries not direct: {sum(t.outcome != 'direct' for t in done)}, unexplained: {unexplained or 'none'}")
    eim = [t for t in done if t.kind.eim]
    if eim:
        print(f"direct share over every try with endpoint-independent mappings (reset routers included): "
              f"{sum(t.outcome == 'direct' for t in eim) / len(eim):.2f} of {len(eim)}")
    allowing = [t for t in done if t.kind.allows]
    if not allowing:
        print("holepunch: skipped: no kind that allows punching was run")
        return
    ours = sum(t.outcome == "direct" for t in allowing) / len(allowing)
    print(f"holepunch: ours={ours:.2f} peer={PEER:.2f} ratio={ours / PEER:.2f} target={TARGET:.2f} "
          f"{'ok' if ours >= TARGET else 'short'}")


def plan(kinds: list[NatKind], tries: int, pairs: int) -> list[list[Try]]:
    """Tries interleaved by kind, cut into rounds of ``pairs`` pairs running at once."""
    order = [kind for _ in range(tries) for kind in kinds]
    everyone = [Try(number=i + 1, kind=kind, slot=Slot(i % pairs)) for i, kind in enumerate(order)]
    return [everyone[i:i + pairs] for i in range(0, len(everyone), pairs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 try per kind, all at once (under a minute)")
    parser.add_argument("--tries", type=int, default=None, help="tries per kind (default 10; 1 with --quick)")
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--pairs", type=int, default=3, help=f"pairs at once (1-{MAX_HOSTS // 2})")
    parser.add_argument("--bound-s", type=float, default=None,
                        help="after the relayed connection, how long to wait for a direct one (default 40; 20 quick)")
    parser.add_argument("--logs", type=Path, default=None, help="keep the nodes' homes and logs in this folder")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        print(f"holepunch: skipped: {reason}")
        sys.exit(2)
    kinds = [KINDS[name] for name in args.kinds.split(",")]
    tries = args.tries or (1 if args.quick else 10)
    bound_s = args.bound_s or (20.0 if args.quick else 40.0)
    pairs = max(1, min(args.pairs, MAX_HOSTS // 2))
    for kind in kinds:
        print(f"{kind.name}: {kind.what}; allows punching here: {'yes' if kind.allows else 'no'}")
    started = time.monotonic()
    done: list[Try] = []
    for round_tries in plan(kinds, tries, pairs):
        run_round(round_tries, bound_s, args.logs)
        for attempt in round_tries:
            report_try(attempt)
        done.extend(round_tries)
    print(f"\n{len(done)} tries in {time.monotonic() - started:.0f} s, {pairs} pairs at once, "
          f"bound {bound_s:g} s after the relayed connection")
    summarize(done, kinds)


if __name__ == "__main__":
    main()
