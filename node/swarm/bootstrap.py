"""Reaching the swarm at start: which addresses to try in which order, DNS names, and why a dial failed.

A contributor whose node cannot join needs to know what was tried and what went wrong with each
address (a stale cache entry, a typo in a host name, a firewall, an address that now belongs to
another peer); "none of the initial peers responded" is the message that loses them. libp2p's own
errors do not say which (a refused port and a wrong peer id both surface as "no addresses
established a successful connection"), so a failed dial is classified here by a plain TCP probe.
The probe also reads the listener's first bytes: a libp2p node speaks first (multistream-select),
so one that closes the connection without a word is turning this address away at admission (its
caps on unproven connections per IP and range, specs/connections.md), not holding another key.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import trio
from libp2p.abc import IHost
from libp2p.peer.peerinfo import PeerInfo

from intellect_node.node.swarm.host import parse_peer_addr

DNS_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 2.0
MAX_RESOLVED = 8  # addresses kept per DNS name: a hostile resolver must not make us dial thousands

_DNS_ADDR = re.compile(r"/(dns|dns4|dns6)/([^/]+)(/.*)")
_FAMILIES = {"dns4": socket.AF_INET, "dns6": socket.AF_INET6, "dns": socket.AF_UNSPEC}

OK = "ok"
DNS_FAILURE = "dns failure"
BAD_ADDRESS = "bad address"
REFUSED = "refused"
TIMEOUT = "timeout"
UNREACHABLE = "unreachable"
WRONG_PEER = "wrong peer id"
OVER_CAP = "over admission cap"
BACKED_OFF = "backed off"


class DnsFailure(Exception):
    """A ``/dns*`` name that did not resolve in time; the message names it."""


@dataclass(frozen=True)
class Attempt:
    """One dial of one configured address: its outcome (one of the constants above) and why."""

    addr: str
    source: str  # "peer cache" or "bootstrap": where the address came from
    outcome: str
    detail: str = ""
    peer: PeerInfo | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    def line(self) -> str:
        return f"{self.addr} ({self.source}): {self.outcome}" + (f" - {self.detail}" if self.detail else "")


def join_tiers(cached: Iterable[str], configured: Iterable[str], own: Iterable[str]) -> list[tuple[str, list[str]]]:
    """The addresses to try, in tiers: the peer cache first, then the configured bootstrap peers.

    The cache holds every peer this node saw in a verified advert (not only bootstrap peers), so
    a node that ran before rejoins through any of them and the bootstrap hosts carry only first
    contacts. An address appears once, in its first tier; our own addresses never.
    """
    seen = set(own)
    tiers = []
    for source, addrs in (("peer cache", cached), ("bootstrap", configured)):
        fresh = [addr for addr in dict.fromkeys(addrs) if addr not in seen]
        seen.update(fresh)
        if fresh:
            tiers.append((source, fresh))
    return tiers


async def resolve(addr: str, timeout_s: float = DNS_TIMEOUT_S) -> list[str]:
    """``addr`` with a leading ``/dns4|dns6|dns/<name>`` replaced by each address the name has.

    Any other address comes back unchanged. DnsFailure names the host when the lookup fails or
    takes longer than ``timeout_s`` (trio abandons the resolver thread, so a hung resolver costs
    a thread, never the node).
    """
    match = _DNS_ADDR.fullmatch(addr)
    if match is None:
        return [addr]
    proto, name, rest = match.groups()
    with trio.move_on_after(timeout_s):
        try:
            infos = await trio.socket.getaddrinfo(name, None, family=_FAMILIES[proto], type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise DnsFailure(f"cannot resolve {name!r}: {getattr(exc, 'strerror', None) or exc}") from None
        ips = list(dict.fromkeys(str(info[4][0]) for info in infos))[:MAX_RESOLVED]
        if not ips:
            family = {"dns4": "IPv4 ", "dns6": "IPv6 "}.get(proto, "")
            raise DnsFailure(f"{name!r} has no {family}address")
        return [f"/{'ip6' if ':' in ip else 'ip4'}/{ip}{rest}" for ip in ips]
    raise DnsFailure(f"resolving {name!r} took longer than {timeout_s:g} s")


async def peer_info(addr: str, dns_timeout_s: float = DNS_TIMEOUT_S) -> PeerInfo:
    """The peer and every address to dial for ``addr`` (DNS resolved); DnsFailure or ValueError."""
    resolved = await resolve(addr, dns_timeout_s)
    infos = [parse_peer_addr(one) for one in resolved]
    info = infos[0]
    return PeerInfo(info.peer_id, [a for one in infos for a in one.addrs])


async def dial(host: IHost, addr: str, source: str, timeout_s: float) -> Attempt:
    """Connect ``host`` to ``addr`` within ``timeout_s`` (plus at most a DNS lookup and a probe)."""
    try:
        info = await peer_info(addr, min(DNS_TIMEOUT_S, timeout_s))
    except DnsFailure as exc:
        return Attempt(addr, source, DNS_FAILURE, str(exc))
    except ValueError as exc:
        return Attempt(addr, source, BAD_ADDRESS, str(exc))
    if info.peer_id == host.get_id():
        return Attempt(addr, source, BAD_ADDRESS, "this is our own peer id")
    failure: Exception | None = None
    with trio.move_on_after(timeout_s):
        try:
            host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
            await host.connect(info)
            return Attempt(addr, source, OK, peer=info)
        except Exception as exc:  # noqa: BLE001 - unreachable peers fail in many transport-specific ways
            failure = exc
    outcome, detail = await _classify(info, failure, timeout_s)
    return Attempt(addr, source, outcome, detail, peer=info)


async def _classify(info: PeerInfo, failure: Exception | None, timeout_s: float) -> tuple[str, str]:
    """Why a dial failed: a TCP probe of the first address tells a dead port from a wrong peer."""
    if failure is not None and "negative cache" in str(failure):
        return BACKED_OFF, "this peer failed moments ago; libp2p waits before dialing it again"
    target = _tcp_target(info)
    if target is None:
        return (TIMEOUT, f"no connection within {timeout_s:g} s") if failure is None else (UNREACHABLE, str(failure))
    probe = await _probe(*target, listen=failure is not None)
    if probe is not None:
        return probe
    if failure is None:
        return TIMEOUT, (f"TCP connects but the libp2p handshake did not finish within {timeout_s:g} s "
                         "(is an intellect-node listening on that port?)")
    return WRONG_PEER, (f"TCP connects but the handshake failed: the node there is not {info.peer_id} "
                        "(it restarted with a new key, or the address is stale) or does not speak libp2p")


def _tcp_target(info: PeerInfo) -> tuple[str, int] | None:
    for maddr in info.addrs:
        for proto in ("ip4", "ip6"):
            try:
                return maddr.value_for_protocol(proto), int(maddr.value_for_protocol("tcp"))
            except LookupError:  # multiaddr's ProtocolLookupError: this address has no such part
                continue
    return None


async def _probe(ip: str, port: int, listen: bool) -> tuple[str, str] | None:
    """None when a plain TCP connection opens (and, with ``listen``, the listener sends a byte or
    stays silent for PROBE_TIMEOUT_S); else the failure's outcome and detail.

    ``listen`` only after a dial that failed rather than timed out: a node over its admission cap
    closes at once, so the wait costs nothing there, and a silent port was already a timeout."""
    connected = False
    with trio.move_on_after(PROBE_TIMEOUT_S):
        with trio.socket.socket(trio.socket.AF_INET6 if ":" in ip else trio.socket.AF_INET) as sock:
            try:
                await sock.connect((ip, port))
            except ConnectionRefusedError:
                return REFUSED, f"nothing listens on {ip}:{port} (node down, or wrong port)"
            except OSError as exc:
                return UNREACHABLE, f"{ip}:{port}: {exc.strerror or exc}"
            connected = True
            if listen:
                try:
                    first = await sock.recv(1)
                except OSError:  # reset: closed as abruptly
                    first = b""
                if not first:
                    return OVER_CAP, _over_cap_detail(ip, port)
        return None
    if connected:
        return None  # connected, then silent: not a refusal at admission
    return TIMEOUT, f"no answer from {ip}:{port} within {PROBE_TIMEOUT_S:g} s (host down, firewall, or behind NAT)"


def _over_cap_detail(ip: str, port: int) -> str:
    """What to tell a user whose address a node turns away at admission (specs/connections.md):
    the dialer cannot see which cap it met, so the message names them all, the per-IP one first."""
    return (f"{ip}:{port} accepts TCP and closes it before the handshake: that node is turning this address "
            "away at admission, over its cap of unproven connections from one IP (unproven_per_ip, 32 by "
            "default; also 64 per /24, 128 per /16 and 200 inbound in all). Nodes sharing one IP (one machine, "
            "one NAT) count together: retry later, join through another peer, or, on that node, raise "
            "unproven_per_ip in its config's [node] section (INTELLECT_NODE_UNPROVEN_PER_IP)")


def join_failure_message(attempts: list[Attempt]) -> str:
    """What a node says when no address answered: every address tried and why each failed."""
    lines = "\n".join("  " + attempt.line() for attempt in attempts)
    return (f"could not reach any of {len(attempts)} peers tried:\n{lines}\n"
            "check the addresses (`intellect-node bootstrap` prints the line to add) and that those nodes "
            "run, or pass --new-swarm to start a new swarm")


def config_line(addrs: list[str]) -> str:
    """The TOML line an operator adds to a node's config.toml to bootstrap from ``addrs``."""
    return "bootstrap = [" + ", ".join(f'"{addr}"' for addr in addrs) + "]"
