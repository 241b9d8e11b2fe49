"""Is this node publicly dialable? Learned from peers that dial it back (our own small protocol).

py-libp2p 0.8.1's AutoNAT server dials back with ``host.connect``, which returns at once when the
requester is already connected, and it always is (the request came on that connection): every
NATed requester would be told it is reachable. So a node here asks a few connected peers with its
own protocol: "dial me back on this TCP port". The
server dials only the IP it observes on the requester's own connection (never an address the
request names, so it cannot be made to dial a third party), on one port, with a fresh TCP
connection and a Noise handshake that must prove the requester's peer id, within
``DIAL_TIMEOUT_S``; at most ``MAX_CONCURRENT`` dial-backs at once and one per requester IP per
``PER_IP_INTERVAL_S``. It answers reachable / unreachable / refused plus the IP it observed.

The requester is ``public`` when any peer reached it, ``private`` when peers answered and none
reached it, ``unknown`` before any answer. A private node advertises no libp2p address (peers
could not dial it; its own outbound connections carry every stream); a public one advertises the
addresses that were dialed back.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.transport.tcp.tcp import TCP

from intellect_node.node.swarm.guard import ip_of, peer_of
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol.errors import InvalidValue, Rejected
from intellect_node.protocol.framing import DIALBACK_PROTOCOL

log = logging.getLogger(__name__)
DIAL_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = DIAL_TIMEOUT_S + 5.0
MAX_CONCURRENT = 4
PER_IP_INTERVAL_S = 30.0
MAX_TRACKED_IPS = 4096
MAX_REQUEST = 2  # one big-endian TCP port
MAX_ANSWER = 64  # one status byte and an IP address in text
REACHABLE, UNREACHABLE, REFUSED = b"R", b"U", b"X"
ASK_PEERS = 3


def tcp_port(addrs: list[str]) -> int | None:
    """The TCP port of the first ``/ip4/.../tcp/<port>`` listen address."""
    for addr in addrs:
        match = re.match(r"/ip4/[0-9.]+/tcp/([0-9]+)", addr)
        if match and int(match[1]):
            return int(match[1])
    return None


class DialBackServer:
    """Answers dial-back requests; bounded in concurrency and per requester IP, counted by outcome.

    Every malformed request (garbage, a length prefix over ``MAX_REQUEST``, a truncated or stalled
    frame, a request of the wrong size) ends here, not in the stream guard: counted as the outcome
    ``rejected``, charged to the requester by its reason (``PeerScores``), and the stream closed."""

    def __init__(self, host: IHost, scores: PeerScores) -> None:
        self.host = host
        self.scores = scores
        self.outcomes: Counter[str] = Counter()
        self._busy = trio.CapacityLimiter(MAX_CONCURRENT)
        self._last_by_ip: dict[str, float] = {}

    def install(self) -> None:
        """Through the host, so the stream guard wraps the handler like every other."""
        self.host.set_stream_handler(TProtocol(DIALBACK_PROTOCOL), self.serve)

    def _admit(self, ip: str) -> bool:
        now = time.monotonic()
        if now - self._last_by_ip.get(ip, -PER_IP_INTERVAL_S) < PER_IP_INTERVAL_S:
            return False
        if len(self._last_by_ip) >= MAX_TRACKED_IPS:
            self._last_by_ip = {k: t for k, t in self._last_by_ip.items() if now - t < PER_IP_INTERVAL_S}
            if len(self._last_by_ip) >= MAX_TRACKED_IPS:
                return False
        self._last_by_ip[ip] = now
        return True

    async def serve(self, stream: INetStream) -> None:
        ip, peer = ip_of(stream), peer_of(stream)
        try:
            try:
                request = await read_frame(stream, MAX_REQUEST, REQUEST_TIMEOUT_S)
                if len(request) != MAX_REQUEST:
                    raise InvalidValue(f"dial-back request of {len(request)} bytes, expected {MAX_REQUEST}")
            except Rejected as exc:
                self.outcomes["rejected"] += 1
                self.scores.reject(peer, exc.reason, f"dial-back request from {ip or 'an unknown IP'}: {exc}")
                return
            answer = await self._answer(ip, peer, int.from_bytes(request, "big"))
            try:
                await write_frame(stream, answer + ip.encode())
            except Exception as exc:  # the requester gave up or reset: nothing to charge
                log.debug("dial-back answer to %s not delivered: %r", peer, exc)
        finally:
            await close_quietly(stream)

    async def _answer(self, ip: str, peer: str | None, port: int) -> bytes:
        """The status byte for a well-formed request; REFUSED when this server will not dial (an
        IP that is not IPv4 or asked recently, port 0, every dial-back slot busy)."""
        if not port or peer is None or not _is_ipv4(ip) or not self._admit(ip):
            self.outcomes["refused"] += 1
            return REFUSED
        try:
            self._busy.acquire_nowait()
        except trio.WouldBlock:
            self.outcomes["refused"] += 1
            return REFUSED
        try:
            ok = await dial_and_prove(self.host, ip, port, ID.from_base58(peer))
        finally:
            self._busy.release()
        self.outcomes["reachable" if ok else "unreachable"] += 1
        return REACHABLE if ok else UNREACHABLE


def _is_ipv4(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).version == 4
    except ValueError:
        return False


async def dial_and_prove(host: IHost, ip: str, port: int, peer: ID) -> bool:
    """A fresh TCP connection to ip:port whose Noise handshake proves ``peer``; closed at once.

    Not ``host.connect``: that would reuse the connection the request came on and prove nothing.
    """
    raw = None
    with trio.move_on_after(DIAL_TIMEOUT_S):
        try:
            raw = await TCP().dial(multiaddr.Multiaddr(f"/ip4/{ip}/tcp/{port}"))
            secured = await host.get_network().upgrader.upgrade_security(raw, True, peer)
            await secured.close()
            return True
        except Exception as exc:
            log.debug("dial-back to %s:%d failed: %r", ip, port, exc)
        finally:
            if raw is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                    try:
                        await raw.close()
                    except Exception:
                        pass
    return False


@dataclass
class Reachability:
    """What peers said about this node: ``state`` is public, private or unknown."""

    state: str = "unknown"
    observed_ip: str | None = None
    confirmed_by: list[str] = field(default_factory=list)
    denied_by: list[str] = field(default_factory=list)
    checked_at: float | None = None

    def advertised(self, addrs: list[str]) -> list[str]:
        """The libp2p addresses to advertise: all while unknown, none when private, and when public
        the address that was dialed back (the observed IP on our port) first."""
        if self.state == "private":
            return []
        if self.state == "public" and self.observed_ip:
            port, suffix = tcp_port(addrs), next((a[a.index("/p2p/"):] for a in addrs if "/p2p/" in a), "")
            proven = f"/ip4/{self.observed_ip}/tcp/{port}{suffix}"
            return list(dict.fromkeys([proven, *(a for a in addrs if a.startswith(f"/ip4/{self.observed_ip}/"))]))
        return addrs

    def advertised_data(self, addrs: list[str]) -> list[str]:
        """The data-plane addresses (``/ip4/<host>/tcp/<port>/http``) to advertise, by the same rule:
        all while unknown; none when private (peers could not open them: a NATed node fetches
        from reachable peers and serves only streams it opened itself); when public, the same
        ports on the IP that was dialed back (a 1:1 NAT's public address, not the interface's)."""
        if self.state == "private":
            return []
        if self.state == "public" and self.observed_ip:
            moved = [re.sub(r"^/ip4/[0-9.]+/", f"/ip4/{self.observed_ip}/", a) for a in addrs]
            return list(dict.fromkeys(moved))
        return addrs

    def summary(self) -> dict[str, object]:
        return {"state": self.state, "observed_ip": self.observed_ip, "confirmed_by": self.confirmed_by[:ASK_PEERS],
                "denied_by": self.denied_by[:ASK_PEERS],
                "checked_s_ago": None if self.checked_at is None else round(time.time() - self.checked_at, 1)}


async def ask(host: IHost, peer: ID, port: int) -> tuple[bytes, str] | None:
    """One dial-back request; (status byte, observed IP) or None when the peer gave no valid answer."""
    with trio.move_on_after(ANSWER_TIMEOUT_S):
        try:
            stream = await host.new_stream(peer, [TProtocol(DIALBACK_PROTOCOL)])
        except Exception as exc:
            log.debug("dial-back request to %s failed to open: %s", peer, exc)
            return None
        try:
            await write_frame(stream, port.to_bytes(2, "big"))
            answer = await read_frame(stream, MAX_ANSWER, ANSWER_TIMEOUT_S)
        except Exception as exc:
            log.debug("dial-back request to %s failed: %s", peer, exc)
            return None
        finally:
            await close_quietly(stream)
        status, ip = answer[:1], answer[1:].decode("ascii", "replace")
        if status in (REACHABLE, UNREACHABLE, REFUSED) and _is_ipv4(ip):
            return status, ip
        log.info("dial-back answer from %s is malformed (%d bytes)", peer, len(answer))
    return None


async def check(host: IHost, peers: list[ID], port: int, current: Reachability) -> Reachability:
    """Ask up to ASK_PEERS peers at once; a new Reachability (the current one when nobody answered)."""
    answers: dict[str, tuple[bytes, str]] = {}

    async def one(peer: ID) -> None:
        answer = await ask(host, peer, port)
        if answer is not None and answer[0] != REFUSED:
            answers[peer.to_base58()] = answer

    async with trio.open_nursery() as nursery:
        for peer in peers[:ASK_PEERS]:
            nursery.start_soon(one, peer)
    if not answers:
        return current
    confirmed = [p for p, (status, _) in answers.items() if status == REACHABLE]
    denied = [p for p, (status, _) in answers.items() if status == UNREACHABLE]
    observed = next((ip for p, (status, ip) in answers.items() if status == REACHABLE),
                    next(iter(answers.values()))[1])
    return Reachability("public" if confirmed else "private", observed, confirmed, denied, time.time())
