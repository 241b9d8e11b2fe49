"""A node's hivemind address in its signed advert, and back.

Why a form of its own: an advert's ``/p2p/`` addresses are dialed as libp2p addresses of the
advertising node (the peer cache keeps them, membership dials them), and a hivemind address names
another peer id. So the advert carries ``/ip4/<host>/tcp/<port>/hivemind/<hivemind peer id>``, a
data-plane endpoint like the shard overlay's ``/http`` one, which libp2p ignores; the DiLoCo role
turns it back into the multiaddr hivemind dials. Its state server (the shard overlay's HTTP
server, ``state_overlay``) is advertised as ``/ip4/<host>/tcp/<port>/http/diloco-state``: not
the ``/http`` form, which names the node's checkpoint overlay. Adverts are signed but their content is still a
peer's claim: anything that does not parse exactly is skipped.
"""

from __future__ import annotations

import ipaddress
import re

from intellect_node.node.shards.client import Endpoint

_HIVEMIND = re.compile(r"/ip4/([0-9.]{7,15})/tcp/([0-9]{1,5})/(p2p|hivemind)/([1-9A-HJ-NP-Za-km-z]{32,64})")


def _parse(addr: str, kind: str) -> tuple[str, int, str] | None:
    match = _HIVEMIND.fullmatch(addr)
    if match is None or match.group(3) != kind:
        return None
    host, port, peer = match.group(1), int(match.group(2)), match.group(4)
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return None
    if not 0 < port < 65536 or host == "0.0.0.0":
        return None
    return host, port, peer


def advert_addr(maddr: str) -> str | None:
    """The advert form of a hivemind multiaddr (None for one we do not advertise)."""
    parsed = _parse(maddr, "p2p")
    return None if parsed is None else "/ip4/{}/tcp/{}/hivemind/{}".format(*parsed)


def hivemind_maddr(addr: str) -> str | None:
    """The hivemind multiaddr an advert names, or None when ``addr`` is not one."""
    parsed = _parse(addr, "hivemind")
    return None if parsed is None else "/ip4/{}/tcp/{}/p2p/{}".format(*parsed)


def port_of(maddr: str) -> int:
    """The TCP port of a hivemind multiaddr we advertise (0 when it does not parse)."""
    parsed = _parse(maddr, "p2p")
    return 0 if parsed is None else parsed[1]


_STATE = re.compile(r"/ip4/([0-9.]{7,15})/tcp/([0-9]{1,5})/http/diloco-state")


def state_endpoint(peer_id: str, addrs: tuple[str, ...] | list[str]) -> Endpoint | None:
    """The DiLoCo state server an advert names (``state_overlay``), or None; junk is skipped."""
    for addr in addrs:
        match = _STATE.fullmatch(addr)
        if match is None:
            continue
        host, port = match.group(1), int(match.group(2))
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            continue
        if 0 < port < 65536 and host != "0.0.0.0":
            return Endpoint(peer_id, host, port)
    return None
