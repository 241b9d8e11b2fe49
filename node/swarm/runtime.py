"""One node: host, DHT, gossip, membership and control socket, run as tasks of one trio nursery.

Nothing here computes; every loop sleeps between rounds and bounds each network call with a
deadline, so a slow or hostile peer can delay one round, never the node.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol

import multiaddr
import trio
from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.bootstrap import OK, UNREACHABLE, Attempt, dial, join_failure_message, join_tiers
from intellect_node.node.swarm.connections import ConnectionManager
from intellect_node.node.swarm.context import NodeContext
from intellect_node.node.swarm.control import NodeAlreadyRunning, claim_socket_path, serve_control
from intellect_node.node.swarm.dht_get import bounded_get
from intellect_node.node.swarm.gossip import build_pubsub, install_validator
from intellect_node.node.swarm.guard import StreamGuard
from intellect_node.node.swarm.nat.holepunch import CountingDCUtR
from intellect_node.node.swarm.host import (
    build_host,
    claim_listen_addrs,
)
from intellect_node.node.swarm.membership import (
    AdvertRecordValidator,
    Member,
    MemberView,
    check_advert_record,
    member_summary,
)
from intellect_node.node.swarm.peer_cache import PeerCache
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.nat.reachability import DialBackServer, Reachability, check, tcp_port
from intellect_node.node.swarm.nat.relay_client import RelayClient, is_relayed
from intellect_node.node.swarm.nat.relay_service import RelayService, relay_limits
from intellect_node.node.swarm.settings import SwarmSettings
from intellect_node.node.swarm.supervisor import HostFailed, Supervisor, at_once
from intellect_node.node.swarm.streams import close_quietly, read_frame, write_frame
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue, Rejected, SignerMismatch
from intellect_node.protocol.framing import (
    MAX_MEMBERS_REQUEST,
    MAX_MEMBERS_RESPONSE,
    MEMBERS_PROTOCOL,
    decode_envelope_list,
    encode_envelope_list,
)
from intellect_node.protocol.keys import (
    ANNOUNCE_MAX_BYTES,
    DHT_NAMESPACE,
    advert_key,
    announcements_topic,
    members_topic,
    run_members_key,
)
from intellect_node.protocol.messages import Hardware, Message, NodeAdvert
from intellect_node.protocol.rollouts import RolloutAnnouncement
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service

log = logging.getLogger(__name__)
SOFTWARE_VERSION = "0.1.0"
STREAM_TIMEOUT_S = 5.0
DHT_TIMEOUT_S = 10.0
TARGET_CONNECTIONS = 8
MESH_WAIT_S = 5.0  # after joining, how long to wait for a members mesh before gossiping anyway
EARLY_PULLS_AT_S = (1.0, 2.0, 4.0, 8.0)  # seconds after joining: pull the adverts a random peer holds
REACHABILITY_RETRY_S = (1.0, 5.0, 10.0)  # after joining, while no peer has answered
REACHABILITY_RECHECK_S = 300.0  # addresses and NATs change; a decided node asks again this often
RELAY_KEEP_S = 5.0  # while private: how often reservations are checked, refreshed and filled
PROVIDER_REFRESH_S = 3600.0  # libp2p provider records last 48 h; once an hour is plenty
# Heartbeats grow sparser as the run grows, so the members topic stays under about this many
# messages per second in total (libp2p rate-limits each forwarding peer per topic).
MEMBERS_TOPIC_BUDGET_PER_S = 2.0


class JoinError(Exception):
    """The node could not reach the swarm; the message says what to do about it."""


def _peer_ids(peer_ids: Sequence[str] | set[str]) -> list[ID]:
    """The libp2p ids of ``peer_ids``, skipping any that does not parse."""
    out = []
    for peer_id in peer_ids:
        try:
            out.append(ID.from_base58(peer_id))
        except ValueError:
            continue
    return out


def _only(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """True if ``exc`` is one of ``kinds``, or a group (trio's nurseries wrap) of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only(inner, kinds) for inner in exc.exceptions)
    return isinstance(exc, kinds)


class Service(Protocol):
    """A part of the node that runs beside membership: the shard overlay, a role's work loop.

    ``run`` is started once the node has joined, with the node as a ``NodeContext`` (what a
    service may use of it); it calls ``task_status.started()`` when ready and runs until
    cancelled. Services register announcement handlers before the node starts.
    """

    name: str  # its key in ``status`` ("shards", "inference", ...)

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...

    def status(self) -> dict[str, Any]:
        """Is it producing: the figures a contributor asks for first (``intellect-node status``)."""
        ...


# (signed message, raw envelope) -> False to drop quietly; raise Rejected to refuse.
AnnouncementHandler = Callable[[codec.Signed[Any], bytes], bool | None]


class Node:
    def __init__(self, config: SwarmSettings, identity: Identity, hardware: Hardware,
                 services: Sequence[Service] = ()) -> None:
        self.config = config
        self.identity = identity
        self.hardware = hardware
        self.peer_id = identity.peer_id
        self.scores = PeerScores(on_ban=self._on_ban, ban_log=config.layout.bans)
        self.scores.restore()
        self.view = MemberView(config.run_id)
        self.view.vouch(self.peer_id)
        self.peer_cache = PeerCache(config.layout.peer_cache)
        self.host = build_host(identity)
        self.guard = StreamGuard(self.scores)
        self.guard.install(self.host)
        self.supervisor = Supervisor()
        self.connections = ConnectionManager(self.host)
        self.reachability = Reachability()
        self.dialback = DialBackServer(self.host, self.scores)
        self.relay = RelayService(self.host, relay_limits(config.relay_max_reservations, config.relay_reservation_ttl_s,
                                                          config.relay_circuit_duration_s, config.relay_circuit_bytes))
        self.relay_client = RelayClient(self.host, self.relay)
        self.holepunch = CountingDCUtR(self.host)
        self.policy_step: int | None = None
        self.started_at = time.time()
        self.services = list(services)
        self.extra_addrs: list[str] = []  # data-plane endpoints (e.g. /ip4/.../tcp/.../http)
        self._own_envelope: bytes | None = None
        self._nursery: trio.Nursery | None = None
        self._advert_changed = trio.Event()
        self._announcement_handlers: dict[str, tuple[type[Message], AnnouncementHandler]] = {}
        self.rollouts_announced: dict[str, int] = {}  # worker -> batches it announced
        self.on_announcement(RolloutAnnouncement, self._on_rollout_announcement)

    # ---- lifecycle -------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        """Join and serve until cancelled; reports the listen multiaddrs once ready."""
        claimed = claim_listen_addrs(list(self.config.listen), defaulted=self.config.listen_defaulted)
        listen = [multiaddr.Multiaddr(addr) for addr in claimed]
        self.pubsub, router = build_pubsub(self.host, guard=self.guard)
        self.pubsub.blacklisted_peers.update(_peer_ids(self.scores.banned))  # bans from before a restart
        self.dht = KadDHT(self.host, DHTMode.SERVER)
        self.dht.register_validator(DHT_NAMESPACE, AdvertRecordValidator(self.scores))
        topic = members_topic(self.config.run_id)
        install_validator(self.pubsub, topic, (NodeAdvert,), self._on_gossip_advert, self.scores)
        if self._announcement_handlers:
            accepted = tuple(cls for cls, _ in self._announcement_handlers.values())
            install_validator(self.pubsub, announcements_topic(self.config.run_id), accepted,
                              self._on_announcement, self.scores, max_size=ANNOUNCE_MAX_BYTES)
        claim_socket_path(self.config.layout.control_socket)  # before supervision: a second node must not retry
        try:
            async with self.host.run(listen_addrs=listen), trio.open_nursery() as nursery:
                self._nursery = nursery
                async with background_trio_service(self.pubsub), background_trio_service(router), \
                        background_trio_service(self.dht), background_trio_service(self.relay), \
                        background_trio_service(self.holepunch):
                    await self.pubsub.wait_until_ready()
                    nursery.start_soon(self.connections.run)
                    await nursery.start(self.supervisor.run, "control", partial(serve_control, self.config.layout.control_socket,
                                                                                 self.snapshot))
                    self.host.set_stream_handler(TProtocol(MEMBERS_PROTOCOL), self._serve_members)
                    self.dialback.install()
                    await self._supervise(nursery, "members-gossip", self._drain, await self.pubsub.subscribe(topic))
                    if self._announcement_handlers:
                        await self._supervise(nursery, "announcements-gossip", self._drain,
                                              await self.pubsub.subscribe(announcements_topic(self.config.run_id)))
                    self._refresh_own_advert()
                    await self._join()
                    await self._supervise(nursery, "catch-up", self._catch_up_after_joining)
                    for loop in (self._advertise_loop, self._discovery_loop, self._upkeep_loop, self._reachability_loop,
                                 self._relay_loop):
                        await self._supervise(nursery, loop.__name__.strip("_"), loop)
                    for service in self.services:
                        await nursery.start(self.supervisor.run, service.name, partial(service.run, self))
                    task_status.started(self.addrs())
                    await trio.sleep_forever()
        except Exception as exc:
            if _only(exc, (JoinError, NodeAlreadyRunning)):
                raise
            raise HostFailed(f"the libp2p host, its pubsub or its DHT failed ({exc!r}); "
                             "the node cannot run without them (traceback above)") from exc
        finally:
            self.peer_cache.save()

    def addrs(self) -> list[str]:
        """The multiaddrs peers can dial (a 0.0.0.0 listener becomes one address per interface):
        the host's own, as identify and the DHT send them (``host.advertised_multiaddrs``)."""
        return [str(addr) for addr in self.host.get_addrs()]

    # ---- joining ---------------------------------------------------------------------------

    async def _join(self) -> None:
        """Reach the swarm through the peer cache, else the bootstrap peers (``bootstrap.join_tiers``).

        Each tier is dialed at once (bounded per address); a later tier is tried only when no
        address of the earlier ones answered, so a node that ran before does not need the bootstrap
        hosts. When nothing answers, JoinError lists every address tried and why it failed.
        """
        tiers = join_tiers(self.peer_cache.addresses(), self.config.bootstrap, self.addrs())
        if not tiers:
            if self.config.new_swarm:
                log.info("starting a new swarm for run %s (no bootstrap peers given)", self.config.run_id)
                return
            raise JoinError(
                "no bootstrap peers configured and no cached peers from an earlier run: pass "
                "--bootstrap /ip4/.../tcp/.../p2p/<peer id> (the address `intellect-node bootstrap` prints), "
                "or --new-swarm to start a new swarm"
            )
        attempts: list[Attempt] = []
        for source, addrs in tiers:
            async with trio.open_nursery() as nursery:
                for addr in addrs:
                    nursery.start_soon(self._attempt_join, addr, source, attempts)
            reached = sum(attempt.ok for attempt in attempts)
            if reached:
                log.info("joined run %s through %d of %d peers (%s)", self.config.run_id, reached, len(attempts), source)
                return
        if not self.config.new_swarm:
            raise JoinError(join_failure_message(attempts))
        log.warning("%s; starting a new swarm as --new-swarm asks", join_failure_message(attempts))

    async def _attempt_join(self, addr: str, source: str, attempts: list[Attempt]) -> None:
        attempt = await self._connect_and_exchange(addr, source)
        if not attempt.ok:
            log.info("cannot join through %s", attempt.line())
        attempts.append(attempt)

    async def _connect_and_exchange(self, addr: str, source: str = "member") -> Attempt:
        if is_relayed(addr):
            attempt = await self._dial_relayed(addr, source)
        else:
            attempt = await dial(self.host, addr, source, self.config.connect_timeout_s)
        if attempt.ok and attempt.peer is not None:
            peer = attempt.peer.peer_id
            if source == "bootstrap":
                self.connections.protect(peer.to_base58(), "bootstrap")
            with trio.move_on_after(self.config.connect_timeout_s):
                await self.dht.routing_table.add_peer(peer)
                await self._exchange_members(peer)
        return attempt

    async def _dial_relayed(self, addr: str, source: str) -> Attempt:
        """A ``/p2p-circuit`` address: through the relay it names (libp2p's own dial skips these)."""
        failure = f"no relayed connection within {self.config.connect_timeout_s:g} s"
        with trio.move_on_after(self.config.connect_timeout_s):
            try:
                peer = await self.relay_client.dial(addr)
                return Attempt(addr, source, OK, peer=PeerInfo(peer, []))
            except Exception as exc:  # noqa: BLE001 - bad address, relay gone, no reservation, handshake
                failure = str(exc)
        return Attempt(addr, source, UNREACHABLE, failure)

    # ---- the members protocol --------------------------------------------------------------

    async def _exchange_members(self, peer: ID) -> None:
        """Send our advert to ``peer`` and take the adverts it knows."""
        peer_id = peer.to_base58()
        try:
            stream = await self.host.new_stream(peer, [TProtocol(MEMBERS_PROTOCOL)])
        except Exception as exc:
            log.info("members exchange with %s failed to open: %s", peer_id, exc)
            return
        try:
            await write_frame(stream, self._own_envelope or b"")
            payload = await read_frame(stream, MAX_MEMBERS_RESPONSE, STREAM_TIMEOUT_S)
            envelopes = decode_envelope_list(payload)
        except Rejected as exc:
            self.scores.reject(peer_id, exc.reason, f"members response: {exc}")
            return
        except Exception as exc:
            log.info("members exchange with %s failed: %s", peer_id, exc)
            return
        finally:
            await close_quietly(stream)
        for envelope in envelopes:
            self._accept_advert(envelope, delivered_by=peer_id)

    async def _serve_members(self, stream: INetStream) -> None:
        peer_id = stream.muxed_conn.peer_id.to_base58()
        try:
            if self.scores.is_banned(peer_id):
                return
            request = await read_frame(stream, MAX_MEMBERS_REQUEST, STREAM_TIMEOUT_S)
            if request:
                signed = codec.decode(request, NodeAdvert)
                if signed.signer_peer_id != peer_id:
                    raise SignerMismatch("members request carries an advert of another peer")
                self._accept_advert(request, delivered_by=peer_id)
            await write_frame(stream, encode_envelope_list(self.view.envelopes()))
        except Rejected as exc:
            self.scores.reject(peer_id, exc.reason, f"members request: {exc}")
        except Exception as exc:
            log.info("members request from %s failed: %s", peer_id, exc)
        finally:
            await close_quietly(stream)

    # ---- adverts ---------------------------------------------------------------------------

    def own_advert(self) -> NodeAdvert:
        return NodeAdvert(
            peer_id=self.peer_id,
            run_id=self.config.run_id,
            roles=tuple(dict.fromkeys(self.config.roles)),
            addrs=self._advertised_addrs(),
            hardware=self.hardware,
            throughput_tokens_per_s=None,
            software_version=SOFTWARE_VERSION,
            policy_step=self.policy_step,
        )

    def _advertised_addrs(self) -> tuple[str, ...]:
        """libp2p and data-plane addresses as reachability allows (node/swarm/nat/reachability.py)."""
        relayed = self.relay_client.relayed_addrs() if self.reachability.state == "private" else []
        return tuple(dict.fromkeys([*self.reachability.advertised(self.addrs()), *relayed,
                                    *self.reachability.advertised_data(self.extra_addrs)]))[:16]

    def update_advert(self, *, policy_step: int | None = None, extra_addr: str | None = None) -> None:
        """Change what this node advertises; the new advert goes out at once, not at the next refresh."""
        if policy_step is not None:
            self.policy_step = policy_step
        if extra_addr is not None and extra_addr not in self.extra_addrs:
            self.extra_addrs.append(extra_addr)
        self._advert_changed.set()

    def _refresh_own_advert(self) -> bytes:
        self._own_envelope = codec.encode(self.own_advert(), self.identity, lifetime_s=self.config.advert_lifetime_s)
        self.view.accept(self._own_envelope)
        return self._own_envelope

    def _accept_advert(self, envelope: bytes, delivered_by: str | None) -> bool:
        """Record a verified advert (charging ``delivered_by`` for a bad one); True if kept or known."""
        try:
            self._remember(self.view.accept(envelope))
        except Rejected as exc:
            self.scores.reject(delivered_by, exc.reason, f"advert: {exc}")
            return False
        return True

    def _remember(self, member: Member | None) -> None:
        """Keep a newly accepted peer's addresses for the next start (not our own)."""
        if member is not None and member.advert.peer_id != self.peer_id:
            self.peer_cache.remember(member.advert.peer_id, list(member.advert.addrs))

    def _on_gossip_advert(self, signed: codec.Signed[NodeAdvert], raw: bytes) -> bool:
        self._remember(self.view.accept(raw))  # Rejected propagates to the gossip validator, which charges
        return True

    async def _advertise_loop(self) -> None:
        """Gossip the advert every heartbeat; re-sign (and re-store in the DHT) when due or changed.

        One loop, one message per interval: the heartbeat repeats the current envelope, which is
        re-signed every ``advert_refresh_s`` so it never nears expiry. The interval grows with the
        run (``MEMBERS_TOPIC_BUDGET_PER_S``). The DHT store runs beside the loop: it can take seconds
        under load, and the cadence must not wait for it or peers would expire a live node.
        """
        assert self._nursery is not None
        signed_at = stored_at = provided_at = -float("inf")
        stored_addrs: tuple[str, ...] | None = None
        while True:
            changed = self._advert_changed.is_set()
            if time.monotonic() - signed_at >= self.config.advert_refresh_s or changed:
                self._advert_changed = trio.Event()
                signed_at = time.monotonic()
                envelope = self._refresh_own_advert()
                # The DHT copy only has to outlive its own half-life and carry the addresses a
                # lookup dials; each put is a lookup plus stores at ~k peers, which at gossip
                # cadence swamped a 20-node swarm's CPU, and at every policy step (a new checkpoint
                # every second or two in the demo) helped DHT traffic to a seventh of a worker's CPU
                # (bench/RESULTS.md, "Cutting the swarm's CPU per step"). A new policy step reaches
                # members by gossip at once; the DHT copy catches up at its refresh.
                addrs = self._advertised_addrs()
                if addrs != stored_addrs or signed_at - stored_at >= self.config.advert_lifetime_s / 2:
                    stored_addrs = addrs
                    provide = signed_at - provided_at >= PROVIDER_REFRESH_S
                    stored_at = signed_at
                    provided_at = signed_at if provide else provided_at
                    self._nursery.start_soon(self._store_advert, envelope, provide)
            await self._publish_advert()
            interval = max(self.config.heartbeat_s, len(self.view.members()) / MEMBERS_TOPIC_BUDGET_PER_S)
            next_signing = signed_at + self.config.advert_refresh_s - time.monotonic()
            with trio.move_on_after(max(0.0, min(interval, next_signing))):
                await self._advert_changed.wait()

    async def _store_advert(self, envelope: bytes, provide: bool) -> None:
        """Put the advert (and, rarely, the run provider record); bounded so puts never pile up."""
        with trio.move_on_after(min(DHT_TIMEOUT_S, self.config.advert_refresh_s)):
            try:
                await self.dht.put_value(advert_key(self.config.run_id, self.peer_id), envelope)
                if provide:
                    await self.dht.provide(run_members_key(self.config.run_id))
            except Exception as exc:  # no reachable DHT peers yet: the next round retries
                log.debug("advert DHT put failed: %s", exc)

    async def _publish_advert(self) -> None:
        if self._own_envelope is None:
            return
        try:
            await self.pubsub.publish(members_topic(self.config.run_id), self._own_envelope)
        except Exception as exc:
            log.debug("advert publish failed: %s", exc)

    async def _supervise(self, nursery: trio.Nursery, name: str, loop: Callable[..., Awaitable[None]], *args: Any) -> None:
        await nursery.start(self.supervisor.run, name, at_once(partial(loop, *args)))

    async def _drain(self, subscription: Any) -> None:
        """Gossip adverts are handled in the validator; the subscription queue only needs emptying."""
        try:
            while True:
                await subscription.get()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return  # unsubscribed

    # ---- announcements and provider records (used by services) -------------------------------

    def on_announcement(self, cls: type[Message], handler: AnnouncementHandler) -> None:
        """Accept ``cls`` on the run's announcements topic; call before ``run``."""
        self._announcement_handlers[cls.TYPE] = (cls, handler)

    def _on_announcement(self, signed: codec.Signed[Any], raw: bytes) -> bool:
        _, handler = self._announcement_handlers[signed.message.TYPE]
        return handler(signed, raw) is not False

    def _on_rollout_announcement(self, signed: codec.Signed[RolloutAnnouncement], raw: bytes) -> bool:
        if signed.message.run_id != self.config.run_id:
            raise InvalidValue(f"announcement for run {signed.message.run_id!r}")
        worker = signed.message.worker
        self.rollouts_announced[worker] = self.rollouts_announced.get(worker, 0) + 1
        return True

    async def announce(self, message: Message, lifetime_s: float) -> bytes:
        """Sign and gossip ``message`` on the announcements topic; returns the envelope."""
        envelope = codec.encode(message, self.identity, lifetime_s=lifetime_s)
        await self.publish_announcement(envelope)
        return envelope

    async def publish_announcement(self, envelope: bytes) -> None:
        """Gossip an envelope signed earlier (a verdict is recorded durably before it goes out)."""
        await self.pubsub.publish(announcements_topic(self.config.run_id), envelope)

    async def provide(self, key: str) -> bool:
        """Announce a provider record for ``key`` (e.g. "I hold shard k of step s")."""
        with trio.move_on_after(DHT_TIMEOUT_S):
            try:
                return await self.dht.provide(key)
            except Exception as exc:
                log.debug("provide %s failed: %s", key, exc)
        return False

    async def find_providers(self, key: str, count: int = 20) -> list[str]:
        """Peer ids that announced ``key``; empty on timeout or failure."""
        with trio.move_on_after(DHT_TIMEOUT_S):
            try:
                return [info.peer_id.to_base58() for info in await self.dht.find_providers(key, count)]
            except Exception as exc:
                log.debug("find_providers %s failed: %s", key, exc)
        return []

    # ---- reachability ----------------------------------------------------------------------

    async def _reachability_loop(self) -> None:
        """Ask connected peers to dial this node back (node/swarm/nat/reachability.py): soon after
        joining, again while nobody has answered, then every REACHABILITY_RECHECK_S. A change
        re-signs the advert at once, so peers stop dialing a private address quickly."""
        delays = iter(REACHABILITY_RETRY_S)
        while True:
            decided = self.reachability.state != "unknown"
            await trio.sleep(REACHABILITY_RECHECK_S if decided else next(delays, REACHABILITY_RETRY_S[-1]))
            port = tcp_port(self.addrs())
            peers = self.host.get_connected_peers()
            if port is None or not peers:
                continue
            random.shuffle(peers)
            before = self._advertised_addrs()
            self.reachability = await check(self.host, peers, port, self.reachability)
            self.relay.set_hop(self.reachability.state == "public" and self.config.relay_service)
            if self.reachability.state != "private":
                self.relay_client.drop_all()
            if self._advertised_addrs() != before:
                log.info("reachability: %s (observed IP %s)", self.reachability.state, self.reachability.observed_ip)
                self._advert_changed.set()

    async def _relay_loop(self) -> None:
        """While private: hold reservations on up to RELAY_SLOTS public peers, bootstrap peers first
        (node/swarm/nat/relay_client.py); a change of the relayed addresses re-signs the advert at once."""
        while True:
            await trio.sleep(RELAY_KEEP_S)
            if self.reachability.state != "private":
                continue
            if await self.relay_client.keep(self._relay_candidates):
                log.info("relayed addresses: %s", self.relay_client.relayed_addrs() or "none")
                self._advert_changed.set()
            for relay in self.relay_client.held:
                self.connections.protect(relay, "relay")

    def _relay_candidates(self) -> list[tuple[str, str]]:
        """Connected members with a direct address, as (peer id, address without /p2p/): bootstrap
        peers first, then the rest in random order (so NATed nodes spread over the relays)."""
        connected = {peer.to_base58() for peer in self.host.get_connected_peers()}
        bootstrap = {addr.rsplit("/p2p/", 1)[-1] for addr in self.config.bootstrap}
        found = []
        for member in self.view.members():
            peer_id = member.advert.peer_id
            direct = [a for a in member.advert.addrs if "/p2p/" in a and not is_relayed(a)]
            if peer_id != self.peer_id and peer_id in connected and direct:
                found.append((peer_id, direct[0][:direct[0].index("/p2p/")]))
        random.shuffle(found)
        return sorted(found, key=lambda item: item[0] not in bootstrap)

    # ---- discovery and upkeep --------------------------------------------------------------

    async def _discovery_loop(self) -> None:
        """Find members gossip has not brought, and pull from one peer in case gossip fell behind.

        Gossip is push-only: a node that was starved of CPU or cut off for a while has no way to
        catch up from it. So each round also exchanges adverts with one random connected peer
        (anti-entropy: one small stream), besides the DHT provider lookup for unknown members.
        """
        while True:
            await trio.sleep(self.config.discovery_s)
            await self._discover_through_dht()
            await self._connect_to_members()
            await self._pull_from_random_peer()

    async def _pull_from_random_peer(self) -> None:
        """One members exchange (anti-entropy) with a random connected peer."""
        connected = self.host.get_connected_peers()
        if connected:
            with trio.move_on_after(STREAM_TIMEOUT_S * 2):
                await self._exchange_members(random.choice(connected))

    async def _discover_through_dht(self) -> None:
        with trio.move_on_after(DHT_TIMEOUT_S):
            try:
                providers = await self.dht.find_providers(run_members_key(self.config.run_id), 20)
            except Exception as exc:
                log.debug("provider lookup failed: %s", exc)
                return
            for info in providers:
                peer_id = info.peer_id.to_base58()
                if peer_id == self.peer_id or self.view.get(peer_id) is not None:
                    continue
                key = advert_key(self.config.run_id, peer_id)
                value = await bounded_get(self.dht, key, check_advert_record, self.scores, owner=info.peer_id)
                if value is not None:
                    self._accept_advert(value, delivered_by=None)

    async def _catch_up_after_joining(self) -> None:
        """Spread our advert and learn the members who join right after us, without waiting for
        the first heartbeat (``heartbeat_s``) or discovery round (``discovery_s``).

        A new swarm is a star around its bootstrap, whose gossip mesh keeps only 6-12 peers: a
        member outside it reaches nobody until the first discovery round. So: dial the members
        the join exchange named at once, and again once later joiners have arrived; gossip the
        advert once a mesh exists; and pull the adverts a random peer holds a few times in the
        first seconds. In a 20-node start on 2 cores, gossip took several gossip heartbeats per
        hop while every node was busy joining, and the last joiners' adverts reached some nodes
        only through their first discovery round (bench/RESULTS.md).
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._gossip_advert_once_meshed)
            nursery.start_soon(self._pull_early)
            await self._connect_to_members()
            await trio.sleep(1.0)
            await self._connect_to_members()

    async def _pull_early(self) -> None:
        joined_at = trio.current_time()
        for at in EARLY_PULLS_AT_S:
            await trio.sleep_until(joined_at + at)
            await self._pull_from_random_peer()

    async def _gossip_advert_once_meshed(self) -> None:
        """Gossip the advert again as soon as this node has a members mesh, and once more a gossip
        heartbeat later. The advert gossiped while joining went out before any mesh existed
        (gossipsub sends only to mesh peers), so only the peers this node dialed knew it, and the
        next heartbeat is ``heartbeat_s`` away: in a 20-node start that gap set convergence."""
        topic = members_topic(self.config.run_id)
        with trio.move_on_after(MESH_WAIT_S):
            while not self.pubsub.router.mesh.get(topic):
                await trio.sleep(0.1)
        await self._publish_advert()
        await trio.sleep(1.0)  # node.gossip's heartbeat: by then the mesh has grown to its degree
        await self._publish_advert()

    async def _connect_to_members(self) -> None:
        """Keep at least TARGET_CONNECTIONS peers, dialing members we know but are not connected to.

        One at a time: dialing all missing peers at once (libp2p's ``connect`` takes 250 ms of
        wall time, 14 ms of CPU) made a 20-node start on 2 cores a storm of handshakes, over 100 of
        which timed out (5 s). In random order: every joiner learns the same member list from its
        bootstrap, and in list order all of them dialed the same first few members at once, whose
        handshakes then timed out and who heard no gossip meanwhile.
        """
        connected = {peer.to_base58() for peer in self.host.get_connected_peers()}
        members = self.view.members()
        random.shuffle(members)
        for member in members:
            if len(connected) >= TARGET_CONNECTIONS:
                return
            peer_id = member.advert.peer_id
            if peer_id == self.peer_id or peer_id in connected or self.scores.is_banned(peer_id):
                continue
            for addr in member.advert.addrs:
                if "/p2p/" in addr and (await self._connect_and_exchange(addr)).ok:
                    connected.add(peer_id)
                    break

    async def _upkeep_loop(self) -> None:
        """Expire members; persist the peer cache soon after it changes (a crash skips shutdown)."""
        while True:
            await trio.sleep(1.0)
            for peer_id in self.view.prune():
                log.info("member %s left (advert expired)", peer_id)
            if self.peer_cache.dirty:
                self.peer_cache.save()

    def _on_ban(self, peer_id: str) -> None:
        """Drop a banned peer's gossip and connection.

        Not ``Pubsub.add_to_blacklist``: in libp2p 0.8.1 its teardown races the dead-peer handler
        (KeyError in ``_teardown_if_connected``) and takes the pubsub service, and the node, down.
        Adding to the blacklist set and closing the connection reaches the same state safely.
        """
        try:
            peer = ID.from_base58(peer_id)
        except ValueError:
            return
        pubsub = getattr(self, "pubsub", None)  # before ``run`` built it, it takes the bans at birth
        if pubsub is not None:
            pubsub.blacklisted_peers.add(peer)
        if self._nursery is not None:
            self._nursery.start_soon(self._disconnect, peer)

    async def _disconnect(self, peer: ID) -> None:
        try:
            await self.host.disconnect(peer)
        except Exception as exc:
            log.debug("disconnect of %s failed: %s", peer, exc)

    # ---- status ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What ``intellect-node status`` shows: this node, the run's members, rejection counts."""
        now = time.time()
        members = [member_summary(m, now) for m in sorted(self.view.members(), key=lambda m: m.advert.peer_id)]
        return {
            "peer_id": self.peer_id,
            "run_id": self.config.run_id,
            "version": SOFTWARE_VERSION,
            "uptime_s": round(now - self.started_at, 1),
            "addrs": self.addrs(),
            "connected_peers": len(self.host.get_connected_peers()),
            "connections": self.connections.status(),
            "reachability": {**self.reachability.summary(), "dialbacks_served": dict(self.dialback.outcomes)},
            "relay": {**self.relay.status(), **self.relay_client.status(), "hole_punches": self.holepunch.status()},
            "gossip_peers": len(self.pubsub.peers),
            "gossip_mesh": {topic: len(peers) for topic, peers in self.pubsub.router.mesh.items()},
            "members": members,
            "rejections": dict(self.scores.rejections),
            "rollout_batches_announced": sum(self.rollouts_announced.values()),
            "banned": sorted(self.scores.banned),
            "services": {service.name: service.status() for service in self.services},
            "handler_errors": dict(self.guard.errors),
            "supervisor": self.supervisor.snapshot(),
        }

