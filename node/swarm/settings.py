"""``SwarmSettings``: everything the swarm reads of a node's configuration, and nothing else.

Why its own type and not the app's config: the swarm sits below every role and below the app that
assembles them (node/__init__.py), so it cannot name the app's config without the arrow running
back up. The app builds one of these from whatever its configuration looks like and hands it to
``Node``; tests build one directly. Frozen, so no part of a running node can change what another
part was started with, and checked on construction, so a wrong type fails where it was made
rather than as a ``TypeError`` deep inside a trio task.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from intellect_node.node.home.layout import HomeLayout

if TYPE_CHECKING:  # connections imports libp2p (a second): reading a config must not
    from intellect_node.node.swarm.connections import ConnectionPolicy

# The port libp2p nodes customarily use. A node that was left on it moves to a free port when
# another node holds it (node/swarm/host.py claim_listen_addrs); a port the user chose never moves.
DEFAULT_LISTEN: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/4001",)
MAX_INBOUND = 250  # below py-libp2p's max_connections (300), so dials this node chooses have room


@dataclass(frozen=True)
class SwarmSettings:
    home: Path
    run_id: str
    roles: tuple[str, ...] = ()  # what the advert says this node does
    listen: tuple[str, ...] = DEFAULT_LISTEN
    bootstrap: tuple[str, ...] = ()
    new_swarm: bool = False  # start a swarm of one when no bootstrap or cached peer answers
    advert_lifetime_s: float = 120.0
    advert_refresh_s: float = 40.0
    heartbeat_s: float = 10.0
    discovery_s: float = 15.0
    connect_timeout_s: float = 5.0
    # Circuit relay v2 service, offered only while this node is publicly reachable (specs/reachability.md).
    relay_service: bool = True
    relay_max_reservations: int = 16
    relay_reservation_ttl_s: float = 600.0
    relay_circuit_duration_s: float = 120.0
    relay_circuit_bytes: int = 16 * 1024 * 1024
    # Inbound admission (specs/connections.md): slots, caps on unproven peers per address range,
    # and eviction of an idle unproven connection of the most represented range when full.
    max_inbound: int = 200
    unproven_per_ip: int = 32
    unproven_per_24: int = 64  # IPv6: per /64
    unproven_per_16: int = 128  # IPv6: per /48
    evict_unproven: bool = True

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(SwarmSettings)
        for field in fields(self):
            _check_type(field.name, getattr(self, field.name), hints[field.name])
        for name in ("advert_lifetime_s", "advert_refresh_s", "heartbeat_s", "discovery_s", "connect_timeout_s",
                     "relay_reservation_ttl_s", "relay_circuit_duration_s", "relay_circuit_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be above 0")
        if self.relay_max_reservations < 0:
            raise ValueError(f"relay_max_reservations: {self.relay_max_reservations!r} must be 0 or more")
        # py-libp2p refuses to register a connection past its max_connections (300, both
        # directions): inbound slots above MAX_INBOUND would be admitted and then dropped.
        if not 1 <= self.max_inbound <= MAX_INBOUND:
            raise ValueError(f"max_inbound: {self.max_inbound!r} must be from 1 to {MAX_INBOUND}")
        if not 1 <= self.unproven_per_ip <= self.unproven_per_24 <= self.unproven_per_16:
            raise ValueError(f"need 1 <= unproven_per_ip ({self.unproven_per_ip}) <= unproven_per_24 "
                             f"({self.unproven_per_24}) <= unproven_per_16 ({self.unproven_per_16})")

    @property
    def connection_policy(self) -> ConnectionPolicy:
        """The connection manager's admission limits from these settings (trimming keeps its defaults)."""
        from intellect_node.node.swarm.connections import ConnectionPolicy

        return ConnectionPolicy(max_inbound=self.max_inbound, unproven_per_ip=self.unproven_per_ip,
                                unproven_per_24=self.unproven_per_24, unproven_per_16=self.unproven_per_16,
                                evict=self.evict_unproven)

    @property
    def layout(self) -> HomeLayout:
        """Where this node keeps its bans, peer cache and control socket (and the roles their state)."""
        return HomeLayout(self.home)

    @property
    def listen_defaulted(self) -> bool:
        """True if nobody chose the listen addresses, so a busy default port may be swapped for a free one."""
        return self.listen == DEFAULT_LISTEN


def _check_type(name: str, value: Any, kind: Any) -> None:
    """``TypeError`` naming the field unless ``value`` is a ``kind`` (a bool is no number here)."""
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typing.get_origin(kind) is tuple:
        ok = isinstance(value, tuple) and all(isinstance(item, typing.get_args(kind)[0]) for item in value)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise TypeError(f"{name}: {value!r} is not a {getattr(kind, '__name__', kind)}")
