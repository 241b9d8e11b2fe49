"""`intellect-node doctor`: what a contributor needs to know before joining, in seconds.

Each check returns one line, OK / WARN / FAIL, and for anything but OK the fix. The checks touch
only this machine and, bounded in time, the configured bootstrap peers; nothing is written
(a missing key is reported as "will be created", not created).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import ipaddress
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p.custom_types import TProtocol

from intellect_node.crypto.envelope import MAX_CLOCK_SKEW_S, open_envelope
from intellect_node.crypto.identity import Identity, IdentityError, load_identity
from intellect_node.node.app.config import (
    ConfigError,
    NodeConfig,
    default_swarm,
    load_config,
)
from intellect_node.node.swarm.bootstrap import Attempt, config_line, dial
from intellect_node.node.swarm.host import (
    PortInUse,
    build_host,
    claim_listen_addrs,
    dialable_hosts,
)
from intellect_node.node.swarm.nat.reachability import REACHABLE, REFUSED, ask, tcp_port
from intellect_node.node.swarm.settings import DEFAULT_LISTEN
from intellect_node.node.swarm.streams import read_frame, write_frame
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.framing import (
    MAX_MEMBERS_RESPONSE,
    MEMBERS_PROTOCOL,
    decode_envelope_list,
    encode_members_request,
)
from intellect_node.protocol.messages import NodeAdvert

OK, WARN, FAIL = "OK", "WARN", "FAIL"
DIAL_TIMEOUT_S = 5.0
DISK_FAIL_BYTES = 2 * 2**30  # below this a node cannot hold the newest few checkpoint shards of a small model
DISK_WARN_BYTES = 20 * 2**30
SKEW_WARN_S = 5.0
ANY_TIME_S = float(2**40)  # a skew bound no timestamp exceeds: freshness is what the clock check measures


@dataclass(frozen=True)
class Check:
    name: str
    level: str  # OK, WARN or FAIL
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def check_config(flags: dict[str, Any], config_file: Path | None) -> tuple[Check, NodeConfig]:
    """The merged configuration; on a mistake FAIL and the defaults, so the other checks still run."""
    try:
        config = load_config(flags, config_file=config_file)
    except ConfigError as exc:
        home = flags.get("home")
        fallback = NodeConfig(default_swarm(Path(home)) if home else default_swarm())
        return Check("config", FAIL, str(exc), "fix the named key or file"), fallback
    source = config_file or config.layout.config_file
    detail = f"{source} parses" if Path(source).exists() else f"no {source}: defaults (and environment, flags) apply"
    return Check("config", OK, detail), config


def check_identity(path: Path) -> Check:
    if not path.exists():
        return Check("identity", OK, f"no key at {path} yet: it is created (mode 0600) on first start")
    try:
        identity = load_identity(path)
    except IdentityError as exc:
        return Check("identity", FAIL, str(exc), f"`chmod 600 {path}`, or move it away and run `intellect-node keygen`")
    return Check("identity", OK, f"{path} (mode 0600), peer id {identity.peer_id}")


def check_listen(listen: list[str]) -> Check:
    defaulted = tuple(listen) == DEFAULT_LISTEN
    try:
        claimed = claim_listen_addrs(listen, defaulted=defaulted)
    except PortInUse as exc:
        return Check("listen port", FAIL, str(exc), "stop the other node, or choose another port with --listen")
    if claimed != listen:
        return Check("listen port", WARN, f"{', '.join(listen)} is in use; the node would listen on a random port",
                     "set a fixed free port (`listen = [\"/ip4/0.0.0.0/tcp/PORT\"]`) so a forwarded port stays right")
    return Check("listen port", OK, f"{', '.join(listen)} is free")


def check_reachability(listen: list[str]) -> Check:
    """Whether peers could dial this node, judged from its addresses (the dial-back check asks a peer)."""
    hosts = [host for addr in listen if (m := re.fullmatch(r"/ip4/([0-9.]+)/tcp/[0-9]+", addr))
             for host in dialable_hosts(m[1])]
    public = [host for host in hosts if ipaddress.ip_address(host).is_global]
    if public:
        return Check("reachability", OK,
                     f"public address {', '.join(public)}: peers can dial it if the TCP port is open")
    if hosts and all(ipaddress.ip_address(host).is_loopback for host in hosts):
        return Check("reachability", WARN, "listens on loopback only: only this machine can reach it",
                     "listen on /ip4/0.0.0.0/tcp/4001 to join other machines")
    return Check("reachability", WARN,
                 f"no public address ({', '.join(hosts) or 'none'}): behind NAT, peers cannot dial this node; "
                 "it can still join, fetch checkpoints and deliver rollouts over its own outbound connections",
                 "forward the listen TCP port on your router to this machine, or run on a host with a public address")


def check_disk(home: Path, fail_below: int = DISK_FAIL_BYTES, warn_below: int = DISK_WARN_BYTES) -> Check:
    existing = next(p for p in (home, *home.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    detail = f"{free / 2**30:,.1f} GiB free under {existing}"
    if free < fail_below:
        return Check("disk", FAIL, detail + f" (need {fail_below / 2**30:g} GiB for checkpoints)",
                     "free space there, or use --home on a larger disk")
    if free < warn_below:
        return Check("disk", WARN, detail + " (large models need more)", "free space, or use --home on a larger disk")
    return Check("disk", OK, detail)


def check_gpu() -> list[Check]:
    """GPU, driver and engine: a CPU-only node is valid (validator, bootstrap), so only WARN."""
    try:
        import torch
    except ImportError as exc:
        return [Check("gpu", FAIL, f"torch does not import: {exc}", "reinstall intellect-node with its dependencies")]
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        gpu = Check("gpu", OK, f"{torch.cuda.device_count()} x {', '.join(names)}, CUDA {torch.version.cuda}")
    else:
        gpu = Check("gpu", WARN, "no CUDA GPU visible to torch: inference runs on the CPU (slow)",
                    "install the NVIDIA driver and a CUDA build of torch, or run as a validator/bootstrap node")
    return [gpu, check_vllm()]


def check_vllm() -> Check:
    """Whether the vLLM engine can run, and on the vLLM version it was run on (read from the package's
    metadata: importing vLLM takes seconds and touches the GPU)."""
    from intellect_node.node.engine import TESTED_VLLM

    install = f"pip install 'intellect-node[gpu]' (vllm=={TESTED_VLLM}; GPU nodes)"
    if importlib.util.find_spec("vllm") is None:
        return Check("engine", WARN, "vllm not installed: the torch engine generates (slower)", install)
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if version != TESTED_VLLM:
        return Check("engine", WARN, f"vllm {version} installed; the vLLM engine was run on {TESTED_VLLM} only",
                     install)
    return Check("engine", OK, f"vllm {version} installed")


def check_sandbox() -> Check:
    """Whether model-written code can be isolated here: a trivial program run through the sandbox.

    Only WARN when it cannot: a node without code tasks (toy, math) needs no sandbox, and one with
    them refuses to start, naming the same cause.
    """
    from intellect_node.node.tasks.sandbox import sandbox_problem

    sandbox_problem.cache_clear()  # doctor is asked after a fix: probe again
    problem = sandbox_problem()
    if problem is None:
        return Check("code sandbox", OK, "bubblewrap, user namespaces and the seccomp filter work (a test program ran)")
    return Check("code sandbox", WARN, f"code tasks (humaneval) will be refused: {problem}",
                 "apt-get install -y bubblewrap; allow unprivileged user namespaces (the sysctl named above)")


def check_sandbox_memory() -> Check:
    """Which memory limits a sandboxed run gets here: a cgroup limit that counts every page (tmpfs,
    shmem, kernel objects), or the caps alone. WARN without the cgroup: the caps hold every place
    a program can fill, but small kernel memory (pipe buffers, thread stacks) then goes uncounted."""
    from intellect_node.node.tasks.sandbox import memory_enforcement
    from intellect_node.node.tasks.sandbox_cgroup import hierarchy

    hierarchy.cache_clear()  # doctor is asked after a fix: probe again
    cgroup, detail = memory_enforcement()
    if cgroup:
        return Check("sandbox memory", OK, detail)
    return Check("sandbox memory", WARN, detail,
                 "run the node as root on a host with the memory cgroup controller (v2, or v1 memory), or delegate "
                 "it a cgroup v2 subtree with memory enabled (systemd: Delegate=yes)")


async def check_peers(bootstrap: list[str], timeout_s: float = DIAL_TIMEOUT_S,
                      listen: str = "/ip4/127.0.0.1/tcp/0") -> list[Check]:
    """Dial every bootstrap peer at once (bounded), read clock skew from the first that answers,
    and ask it to dial this machine back on ``listen``'s port (the node's own, when it is free:
    the answer is then the one the node would get, node/swarm/nat/reachability.py)."""
    if not bootstrap:
        return [Check("bootstrap", WARN, "no bootstrap peers configured",
                      "ask the run's operators for the line `intellect-node bootstrap` prints, e.g. "
                      + config_line(["/dns4/HOST/tcp/4001/p2p/PEER_ID"]))]
    host = build_host(Identity.generate())
    attempts: list[Attempt] = []
    skew: Check | None = None
    dialback: Check | None = None
    async with host.run(listen_addrs=[multiaddr.Multiaddr(listen)]):
        async def attempt(addr: str) -> None:
            attempts.append(await dial(host, addr, "bootstrap", timeout_s))

        async with trio.open_nursery() as nursery:
            for addr in dict.fromkeys(bootstrap):
                nursery.start_soon(attempt, addr)
        for reached in (a for a in attempts if a.ok and a.peer is not None):
            with trio.move_on_after(timeout_s):
                skew = await _clock_skew(host, reached)
            if skew is not None:
                break
        port = tcp_port([str(a) for a in host.get_addrs()])
        for reached in (a for a in attempts if a.ok and a.peer is not None):
            answer = await ask(host, reached.peer.peer_id, port) if port else None
            if answer is not None and answer[0] != REFUSED:
                dialback = dialback_check(reached.peer.peer_id.to_base58(), answer[0] == REACHABLE, answer[1], port)
                break
    answered = any(a.ok for a in attempts)
    checks = [Check("bootstrap", OK, f"{a.addr} answers") if a.ok else
              Check("bootstrap", WARN if answered else FAIL, a.line(),
                    "check the address with the run's operators; a firewall must allow outbound TCP")
              for a in sorted(attempts, key=lambda a: a.addr)]
    return checks + [skew or Check("clock", WARN, "no peer answered with its advert: clock skew unknown",
                                   "keep the clock synchronised (NTP)"),
                     dialback or Check("dial-back", WARN, "no peer answered a dial-back request: reachability unknown",
                                       "a node finds out after joining (`status` -> reachability)")]


def dialback_check(peer: str, reached: bool, observed_ip: str, port: int) -> Check:
    """What a peer's dial-back says about joining: public, or behind NAT (then relays and peers)."""
    if reached:
        return Check("dial-back", OK, f"{peer} reached this machine at {observed_ip}:{port}: publicly dialable")
    return Check("dial-back", WARN,
                 f"{peer} could not reach {observed_ip}:{port}: behind NAT or a firewall. The node still joins: it "
                 "reserves slots on public relays (circuit relay v2), fetches checkpoints from reachable peers and "
                 "delivers rollouts over its own connections",
                 f"to be dialable, forward TCP port {port} to this machine")


async def _clock_skew(host: Any, attempt: Attempt) -> Check | None:
    """Compare our clock with the timestamp of the peer's own signed advert (members protocol: a
    read-only query with an empty digest, so the answer holds every advert the peer has, its own too)."""
    assert attempt.peer is not None
    stream = await host.new_stream(attempt.peer.peer_id, [TProtocol(MEMBERS_PROTOCOL)])
    try:
        await write_frame(stream, encode_members_request(b"", []))
        envelopes = decode_envelope_list(await read_frame(stream, MAX_MEMBERS_RESPONSE, DIAL_TIMEOUT_S))
    finally:
        await stream.close()
    peer = attempt.peer.peer_id.to_base58()
    for envelope in envelopes:
        try:  # signature checked; freshness not, since freshness is what we measure
            opened = open_envelope(envelope, max_lifetimes_s={NodeAdvert.TYPE: NodeAdvert.MAX_LIFETIME_S},
                                   now=0, max_skew_s=ANY_TIME_S)
        except Rejected:  # a forged or malformed entry: not a clock reading
            continue
        if opened.signer_peer_id == peer:
            return skew_check(peer, opened.timestamp_ms / 1000 - time.time())
    return None


def skew_check(peer: str, ahead_s: float, lifetime_s: float = 120.0) -> Check:
    """``ahead_s``: the peer's advert timestamp minus our clock (it signs every refresh, so its clock
    is at least that far ahead of ours, and at most a refresh interval more)."""
    if ahead_s > MAX_CLOCK_SKEW_S:
        return Check("clock", FAIL, f"{peer}'s advert is dated {ahead_s:.0f} s in our future: our clock is behind, "
                     f"and adverts more than {MAX_CLOCK_SKEW_S:g} s ahead are refused", "synchronise the clock (NTP)")
    if -ahead_s > lifetime_s:
        return Check("clock", FAIL, f"{peer}'s fresh advert looks {-ahead_s:.0f} s old: our clock is ahead and "
                     "every advert looks expired", "synchronise the clock (NTP)")
    if ahead_s > SKEW_WARN_S:
        return Check("clock", WARN, f"{peer}'s clock is at least {ahead_s:.0f} s ahead of ours",
                     "synchronise the clock (NTP)")
    return Check("clock", OK, f"within the advert refresh interval of {peer}'s clock")


def run_checks(flags: dict[str, Any], config_file: Path | None, timeout_s: float = DIAL_TIMEOUT_S) -> list[Check]:
    config_check, config = check_config(flags, config_file)
    listen = check_listen(config.swarm.listen)
    checks = [config_check, check_identity(config.layout.identity_key), listen,
              check_reachability(config.swarm.listen), check_disk(config.home), *check_gpu(), check_sandbox(),
              check_sandbox_memory()]
    # the dial-back tests the node's own port when it is free and fixed; else any port of this machine
    own = next((a for a in config.swarm.listen if re.fullmatch(r"/ip4/[0-9.]+/tcp/[1-9][0-9]*", a)), None)
    probe = own if listen.level == OK and own is not None else "/ip4/0.0.0.0/tcp/0"
    return checks + trio.run(check_peers, list(config.swarm.bootstrap), timeout_s, probe)
