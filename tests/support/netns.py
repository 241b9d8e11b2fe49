"""Network namespaces for tests and benches: a small internet of nodes behind NAT, and a switch
of rate-limited links.

Every address is in 198.18.0.0/15, the benchmarking range no real network routes, and no
namespace gets a link to the host's own namespace, so nothing can leave the machine. Names carry
a prefix with the creating process id; ``cleanup_stale`` removes namespaces of dead creators, and
``close`` removes this run's, also after a failure (use them as context managers).

``SmallInternet`` (NAT tests, bench/nat.py):

    wan:    a bridge, the "public internet" segment 198.18.0.0/24 (no address of its own)
    public hosts (``public``): 198.18.0.2, 198.18.0.3, ... on the bridge
    NAT routers (``natN``): 198.18.0.(10+N) uplink on the bridge, 198.19.N.1 downlink,
            MASQUERADE out of the uplink; nothing is forwarded inward except replies
    homes (``homeN``): 198.19.N.2, default route via its router
    ``mbit``: when set, every uplink to the bridge (public hosts', routers') is limited to that
            rate each way by ``tc ... tbf``, as a server's or a home's line is

``LimitedSwitch`` (bench/diloco.py): hosts ``hostI`` at 198.18.0.(2+I)/24 on one bridge, each
through its own link limited to a rate in both directions by ``tc ... tbf`` (netem, which would
add delay, is not in every kernel; tbf is), and no default route.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import ClassVar, Self

PREFIX = "innt"
COMMAND_TIMEOUT_S = 10.0
MAX_HOSTS = 8  # each kind; a bound on what one test may build
CLONE_NEWNET = 0x40000000  # <sched.h>: setns's namespace type


class NetnsUnavailable(Exception):
    """This machine cannot build namespaces (not root, or a tool is missing); the reason says which."""


PACKAGES = {"ip": "iproute2", "tc": "iproute2", "iptables": "iptables"}


def unavailable_reason(tools: tuple[str, ...] = ("ip", "iptables")) -> str | None:
    """Why namespaces using ``tools`` (the small internet's by default) cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y {PACKAGES[tool]})"
    return None


def enter(namespace: str) -> None:
    """Move the calling thread into ``namespace``: every socket it opens and every thread and
    process it starts afterwards live there. For a worker process that must run Python code
    (torch.distributed, a hivemind child) inside a namespace rather than a command under
    ``ip netns exec``; call it first thing in the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {namespace}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _run(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete namespaces left by an earlier run whose process is gone; returns their names."""
    removed = []
    for name in _namespaces():
        match = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if match and not _alive(int(match[1])):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
            removed.append(name)
    return removed


@dataclass
class Namespaces:
    """What every topology shares: named namespaces made by this process, veth pairs between
    them, and their removal on exit, on a failure while building, or on KeyboardInterrupt."""

    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}", kw_only=True)
    created: list[str] = field(default_factory=list, kw_only=True)
    TOOLS: ClassVar[tuple[str, ...]] = ("ip", "iptables")

    def name(self, short: str) -> str:
        return f"{self.tag}-{short}"

    def __enter__(self) -> Self:
        reason = unavailable_reason(self.TOOLS)
        if reason:
            raise NetnsUnavailable(reason)
        cleanup_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        """Make the topology's namespaces (each through ``_add``, so ``close`` finds it)."""
        raise NotImplementedError

    def close(self) -> None:
        """Delete every namespace this run made (their veths and rules go with them)."""
        for name in reversed(self.created):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
        self.created.clear()

    def exec_prefix(self, namespace: str) -> list[str]:
        """Prepend to a command to run it inside ``namespace``."""
        return ["ip", "netns", "exec", namespace]

    def sh(self, namespace: str, *args: str) -> str:
        return _run(*self.exec_prefix(namespace), *args)

    def _add(self, short: str) -> str:
        name = self.name(short)
        _run("ip", "netns", "add", name)
        self.created.append(name)
        self.sh(name, "ip", "link", "set", "lo", "up")
        return name

    def _veth(self, a: str, a_if: str, b: str, b_if: str) -> None:
        """A veth pair made directly between two namespaces: it never appears in the host's."""
        _run("ip", "link", "add", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b)
        self.sh(a, "ip", "link", "set", a_if, "up")
        self.sh(b, "ip", "link", "set", b_if, "up")

    def _bridge(self, short: str) -> str:
        """A namespace holding one bridge, ``br0``: the shared segment hosts are plugged into."""
        name = self._add(short)
        self.sh(name, "ip", "link", "add", "br0", "type", "bridge")
        self.sh(name, "ip", "link", "set", "br0", "up")
        return name

    def _plug(self, bridge: str, port: str, namespace: str, device: str, ip: str) -> None:
        """``namespace``'s ``device`` on ``bridge``'s ``br0`` through port ``port``, at ``ip``/24."""
        self._veth(bridge, port, namespace, device)
        self.sh(bridge, "ip", "link", "set", port, "master", "br0")
        self.sh(namespace, "ip", "addr", "add", f"{ip}/24", "dev", device)

    def _limit(self, namespace: str, device: str, mbit: float) -> None:
        """``device``'s egress in ``namespace`` limited to ``mbit`` by tbf: the bucket holds 10 ms at the
        rate (at least 16 KiB, so a GSO burst of veth is segmented, never dropped whole), the queue
        at most 100 ms."""
        burst = max(16 * 1024, int(mbit * 1e6 / 8 * 0.010))
        self.sh(namespace, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{mbit}mbit",
                "burst", str(burst), "latency", "100ms")


@dataclass
class SmallInternet(Namespaces):
    """Public hosts on one bridge and homes each behind its own MASQUERADE router."""

    publics: int = 1
    homes: int = 1
    public_ips: dict[str, str] = field(default_factory=dict)  # namespace -> address
    home_ips: dict[str, str] = field(default_factory=dict)
    mbit: float | None = None  # every public host's and router's link to the bridge, each way; None: unlimited

    def __post_init__(self) -> None:
        if not (1 <= self.publics <= MAX_HOSTS and 0 <= self.homes <= MAX_HOSTS):
            raise ValueError(f"between 1 and {MAX_HOSTS} public hosts and at most {MAX_HOSTS} homes")
        if self.mbit is not None and not 0.1 <= self.mbit <= 10_000:
            raise ValueError("a link rate of 0.1 to 10000 Mbit/s")

    def _uplink(self, wan: str, port: str, namespace: str, ip: str) -> None:
        """``namespace`` on the wan bridge at ``ip``, its link limited both ways when ``mbit`` is set."""
        self._plug(wan, port, namespace, "up0", ip)
        if self.mbit is not None:
            self._limit(namespace, "up0", self.mbit)
            self._limit(wan, port, self.mbit)

    def _build(self) -> None:
        wan = self._bridge("wan")
        for i in range(self.publics):
            namespace = self._add(f"pub{i}")
            ip = f"198.18.0.{2 + i}"
            self._uplink(wan, f"p{i}", namespace, ip)
            self.public_ips[namespace] = ip
        for n in range(1, self.homes + 1):
            router, home = self._add(f"nat{n}"), self._add(f"home{n}")
            self._uplink(wan, f"p{100 + n}", router, f"198.18.0.{10 + n}")
            self._veth(router, "down0", home, "eth0")
            self.sh(router, "ip", "addr", "add", f"198.19.{n}.1/24", "dev", "down0")
            self.sh(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self.sh(router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "up0", "-j", "MASQUERADE")
            # a home router: replies come in, new connections from outside do not
            self.sh(router, "iptables", "-A", "FORWARD", "-i", "up0", "-m", "conntrack",
                    "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
            self.sh(router, "iptables", "-A", "FORWARD", "-i", "up0", "-j", "DROP")
            # and, like a home router, it drops what is sent to itself unasked rather than answer
            # with a reset (a reset would end a hole punch's first SYN before the peer's opens the way)
            self.sh(router, "iptables", "-A", "INPUT", "-i", "up0", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP")
            ip = f"198.19.{n}.2"
            self.sh(home, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
            self.sh(home, "ip", "route", "add", "default", "via", f"198.19.{n}.1")
            self.home_ips[home] = ip


@dataclass
class LimitedSwitch(Namespaces):
    """``hosts`` namespaces on one bridge, each through a link of ``mbit`` Mbit/s each way.

    A host's traffic crosses two tbf queues (its own uplink's egress, and the bridge port's egress
    towards the other host), so a transfer between two hosts runs at ``mbit`` (``Namespaces._limit``);
    no delay is added."""

    hosts: int = 2
    mbit: float = 100.0
    ips: dict[str, str] = field(default_factory=dict)  # namespace -> address
    TOOLS: ClassVar[tuple[str, ...]] = ("ip", "tc")

    def __post_init__(self) -> None:
        if not (2 <= self.hosts <= MAX_HOSTS and 0.1 <= self.mbit <= 10_000):
            raise ValueError(f"between 2 and {MAX_HOSTS} hosts and a rate of 0.1 to 10000 Mbit/s")

    def _build(self) -> None:
        switch = self._bridge("switch")
        for i in range(self.hosts):
            host = self._add(f"host{i}")
            ip = f"198.18.0.{2 + i}"
            self._plug(switch, f"p{i}", host, "eth0", ip)
            self._limit(host, "eth0", self.mbit)
            self._limit(switch, f"p{i}", self.mbit)
            self.ips[host] = ip
