"""The libp2p host: our Ed25519 identity, Noise as the only security transport, yamux.

A default py-libp2p host also accepts plaintext and secio dialers and prefers mplex (about 25 MiB/s
against yamux's 120 on loopback), so both choices are made explicitly here.

Its auto-connector is switched off: py-libp2p 0.8.1 dials every peer in the peerstore (private
addresses too, when the node has no public one) until it holds 200 connections, every 10-30 s, so
in a swarm of N every node ended up connected to every node it had heard of (48 connections at N=50,
bench/HISTORY.md "Scale"), and past 160 it would fight the connection manager's trimming
(``connections.py``) forever. The node chooses its connections itself: ``Discovery`` keeps
``TARGET_CONNECTIONS`` members connected, and DHT lookups, pulls, deliveries and fetches dial whom
they need.

Yamux returns receive credit the go-yamux way (``yamux_window``): one WINDOW_UPDATE once half the
window is read, not one per read.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import re
import socket

import multiaddr
import psutil
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.auto_connector import AutoConnector
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm import yamux_window

log = logging.getLogger(__name__)


def build_host(identity: Identity, connection_config: ConnectionConfig | None = None) -> IHost:
    """A plain py-libp2p host; ``connections.ConnectionManager`` takes over its inbound path. Its
    addresses, wherever libp2p sends them, are the dialable ones (``advertised_multiaddrs``)."""
    yamux_window.install()
    private = Ed25519PrivateKey.new(identity.seed)
    key_pair = KeyPair(private, private.get_public_key())
    noise = NoiseTransport(key_pair, noise_privkey=new_x25519_key_pair().private_key)
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        connection_config=connection_config,
        addrs_factory=advertised_multiaddrs,
    )
    swarm = host.get_network()
    swarm.auto_connector = IdleAutoConnector(swarm)  # type: ignore[attr-defined]
    return host


class IdleAutoConnector(AutoConnector):
    """py-libp2p's auto-connector, never started: its periodic dials and the redial after each
    disconnect both return at once (see the module docstring)."""

    async def start(self) -> None:
        return None


def parse_peer_addr(addr: str) -> PeerInfo:
    """A multiaddr that ends in /p2p/<peer id>; ValueError with the address otherwise."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(addr))
    except Exception as exc:  # multiaddr raises a zoo of types for bad input
        raise ValueError(f"not a peer multiaddr (expected .../p2p/<peer id>): {addr!r} ({exc})") from None


def quiet_libp2p_logs(verbose: bool) -> None:
    """libp2p logs routine events (a peer closing a DHT stream) at ERROR; show them only when asked."""
    logging.getLogger("libp2p").setLevel(logging.DEBUG if verbose else logging.CRITICAL)


class PortInUse(Exception):
    """A listen port another process (often another node) already holds; the message says what to do."""


def claim_listen_addrs(listen: list[str], *, defaulted: bool) -> list[str]:
    """The listen addresses to use, after checking that no one else listens on their TCP ports.

    py-libp2p 0.8.1 listens with SO_REUSEPORT, so a second node on the same port binds it too and
    the kernel splits inbound connections between the two: dials for one land on the other and
    fail the handshake. A test bind without that option finds the holder. A busy port the user
    chose is an error; a busy default port is replaced by a free one (port 0).
    """
    claimed = []
    for addr in listen:
        match = re.fullmatch(r"/ip4/([0-9.]+)/tcp/([0-9]+)", addr)
        if match is None or match[2] == "0" or _port_free(match[1], int(match[2])):
            claimed.append(addr)
        elif defaulted:
            log.warning("port %s is in use (another node on this machine?); listening on a free port instead", match[2])
            claimed.append(f"/ip4/{match[1]}/tcp/0")
        else:
            raise PortInUse(f"cannot listen on {addr}: port {match[2]} is in use (another intellect-node on this "
                            f"machine?); pass --listen /ip4/{match[1]}/tcp/0 for any free port, or another port")
    return claimed


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT from our last run is fine
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return True


def dialable_hosts(listen_host: str) -> list[str]:
    """The IPv4 addresses peers can dial for a listener on ``listen_host``.

    An unspecified address (0.0.0.0) is never advertised: it names no host. It stands for every
    interface, so the interfaces' addresses are advertised instead, loopback only when the machine
    has nothing else (a peer that dials 127.0.0.1 reaches itself).
    """
    if listen_host != "0.0.0.0":
        return [listen_host]
    found = [entry.address for entries in psutil.net_if_addrs().values() for entry in entries
             if entry.family == socket.AF_INET]
    public = [ip for ip in found if not ipaddress.ip_address(ip).is_loopback]
    return public or [ip for ip in found if ipaddress.ip_address(ip).is_loopback] or ["127.0.0.1"]


def dialable_addrs(addrs: list[str]) -> list[str]:
    """``addrs`` with every unspecified address made dialable: ``/ip4/0.0.0.0/...`` becomes one
    address per dialable IPv4 interface (``dialable_hosts``), ``/ip6/::/...`` one per global IPv6
    interface; an unspecified address left over (an IPv6 listener on a machine without global IPv6)
    is dropped, never advertised."""
    out: list[str] = []
    for addr in addrs:
        ip4, ip6 = "/ip4/0.0.0.0/", "/ip6/::/"
        if addr.startswith(ip4):
            out.extend(f"/ip4/{host}/{addr[len(ip4):]}" for host in dialable_hosts("0.0.0.0"))
        elif addr.startswith(ip6):
            out.extend(f"/ip6/{host}/{addr[len(ip6):]}" for host in _global_ipv6_hosts())
        elif not _unspecified(addr):
            out.append(addr)
    return list(dict.fromkeys(out))


def advertised_multiaddrs(candidates: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """The host's ``addrs_factory``: what ``host.get_addrs()`` returns, so what identify sends as
    listenAddrs and in its signed peer record, what kad puts in provider records and peer routing
    answers, and what our adverts carry. py-libp2p 0.8.1 would send a 0.0.0.0 listener as
    ``/ip4/0.0.0.0/...``, which js- and go-libp2p peers stored as the node's only address."""
    return [multiaddr.Multiaddr(addr) for addr in dialable_addrs([str(candidate) for candidate in candidates])]


def listen_addrs(host: IHost) -> list[str]:
    """The multiaddrs peers can dial (a 0.0.0.0 listener becomes one address per interface): the
    host's own, as identify and the DHT send them (``advertised_multiaddrs``)."""
    return [str(addr) for addr in host.get_addrs()]


def _unspecified(addr: str) -> bool:
    parts = addr.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return False
    try:
        return ipaddress.ip_address(parts[2]).is_unspecified
    except ValueError:
        return True  # not an address at all: never advertise it either


def _global_ipv6_hosts() -> list[str]:
    """Global-scope IPv6 interface addresses (a link-local one needs a zone no multiaddr carries)."""
    found = [entry.address for entries in psutil.net_if_addrs().values() for entry in entries
             if entry.family == socket.AF_INET6]
    return [ip for ip in found if "%" not in ip and ipaddress.ip_address(ip).is_global]
