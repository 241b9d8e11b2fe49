"""Circuit relay v2, relay side: a public node carries circuits for NATed peers that reserved a slot.

Built on py-libp2p 0.8.1's ``CircuitV2Protocol`` (hop and stop), with its defects worked around
here (specs/reachability.md, "Relay defects"):

- R1: a RESERVE names the peer to reserve for (``msg.peer``) and upstream believes it, so one
  connection can take every slot in other peers' names. Here the slot is always the caller's.
- R2: ``_relay_data`` keys its cleanup by peer in one shared table, so when one circuit to a
  destination ends it closes another circuit's streams to the same destination; and the duration
  cap is only checked between reads, so a silent circuit never ends. Here each circuit's pump
  closes only its own two streams, under a hard deadline.

The hop handler is registered only while this node is ``public`` (``set_hop``), through the host,
so the stream guard wraps it like every other handler; the stop handler (a NATed node receiving a
circuit) is always on. Limits come from ``[node]``: ``relay_max_reservations``,
``relay_reservation_ttl_s``, ``relay_circuit_duration_s``, ``relay_circuit_bytes``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID as STOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits

log = logging.getLogger(__name__)
READ_CHUNK = 64 * 1024
CLOSE_TIMEOUT_S = 2.0

__all__ = ["HOP_PROTOCOL", "STOP_PROTOCOL", "RelayService", "relay_limits"]


def relay_limits(max_reservations: int, reservation_ttl_s: float, circuit_duration_s: float,
                 circuit_bytes: int) -> RelayLimits:
    """Upstream's limits record from our config values (whole seconds, as upstream stores them)."""
    return RelayLimits(duration=max(1, math.ceil(circuit_duration_s)), data=circuit_bytes,
                       max_circuit_conns=4, max_reservations=max_reservations,
                       reservation_ttl=max(1, math.ceil(reservation_ttl_s)))


class RelayService(CircuitV2Protocol):
    """Upstream's hop/stop protocol with R1 and R2 fixed, hop switchable, and counters for status."""

    def __init__(self, host: IHost, limits: RelayLimits) -> None:
        super().__init__(host, limits, allow_hop=False)
        self.hop_enabled = False
        self.circuits: Counter[str] = Counter()  # opened, ended, over_duration, over_bytes
        self.bytes_relayed = 0
        self.reservations_refused = 0

    def set_hop(self, enabled: bool) -> None:
        """Offer (or stop offering) relay service; through the host so the guard wraps the handler."""
        if enabled == self.hop_enabled:
            return
        self.hop_enabled = enabled
        if enabled:
            self.host.set_stream_handler(HOP_PROTOCOL, self._handle_hop_stream)
            log.info("relay service on (at most %d reservations)", self.limits.max_reservations)
        else:
            self.host.remove_stream_handler(HOP_PROTOCOL)
            log.info("relay service off (this node is not publicly reachable)")

    def reservations(self) -> list[str]:
        """Peers holding a live reservation here (connected and not expired)."""
        return [peer.to_base58() for peer in list(self.resource_manager._reservations)
                if self.resource_manager.get_reservation(peer) is not None]

    def status(self) -> dict[str, Any]:
        return {"hop": self.hop_enabled, "reservations_served": len(self.reservations()),
                "max_reservations": self.limits.max_reservations,
                "reservations_refused": self.reservations_refused,
                "circuits": dict(self.circuits), "bytes_relayed": self.bytes_relayed}

    async def _handle_reserve(self, stream: INetStream, msg: HopMessage) -> None:
        """R1: the reservation is for the peer on the other end of this stream, whatever it says."""
        msg.ClearField("peer")
        peer = stream.muxed_conn.peer_id
        if not self.resource_manager.can_accept_reservation(peer) and not self.resource_manager.has_reservation(peer):
            self.reservations_refused += 1
        await super()._handle_reserve(stream, msg)

    async def _relay_data(self, src_stream: INetStream, dst_stream: INetStream, peer_id: ID,
                          deadline: float | None = None, circuit_data_limit: list[int] | None = None) -> None:
        """R2: one direction of one circuit; ends both of its own streams (and no one else's) when
        either side ends, the shared byte budget runs out, or the deadline passes, silent or not."""
        if src_stream is None or dst_stream is None:
            return
        from_source = _protocol_of(src_stream) == HOP_PROTOCOL  # the source's stream is the hop stream
        if from_source:
            self.circuits["opened"] += 1
        outcome = "ended"
        with trio.move_on_at(trio.current_time() + deadline - time.monotonic() if deadline else math.inf) as timer:
            try:
                while True:
                    data = await src_stream.read(READ_CHUNK)
                    if not data:
                        break
                    if circuit_data_limit is not None:
                        if len(data) > circuit_data_limit[0]:
                            outcome = "over_bytes"
                            break
                        circuit_data_limit[0] -= len(data)
                    await dst_stream.write(data)
                    self.bytes_relayed += len(data)
            except Exception as exc:  # a reset on either side ends the circuit, nothing more
                log.debug("circuit for %s ended: %r", peer_id, exc)
        if timer.cancelled_caught:
            outcome = "over_duration"
        if from_source or outcome == "over_bytes":
            self.circuits[outcome] += 1
        for stream in (src_stream, dst_stream):
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                try:
                    await (stream.close() if outcome == "ended" else stream.reset())
                except Exception:
                    pass


def _protocol_of(stream: INetStream) -> str | None:
    try:
        return str(stream.get_protocol())
    except Exception:
        return None
