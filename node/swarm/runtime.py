"""``Node``: the swarm's parts wired together, joined to the run, and run as tasks of one nursery.

Each part is its own module with a narrow interface (the way hivemind splits DHT, DHTNode,
DHTProtocol and traverse): ``Advertiser`` (our advert), ``MemberExchange`` (the members protocol
and every advert's way into the view), ``Discovery`` (finding and dialing members),
``NatTraversal`` (reachability, relays, hole punching), ``Announcements`` (the run's announcements
topic) and ``Upkeep``. What is left here is what needs them all: building them in order, joining,
starting their loops under the supervisor, and the status snapshot.

Nothing here computes; every loop sleeps between rounds and bounds each network call with a
deadline, so a slow or hostile peer can delay one round, never the node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol

import multiaddr
import trio
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.tools.anyio_service import background_trio_service

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.adverts import SOFTWARE_VERSION, Advertiser
from intellect_node.node.swarm.announcements import AnnouncementHandler, Announcements
from intellect_node.node.swarm.bootstrap import Attempt, join_failure_message, join_tiers
from intellect_node.node.swarm.connections import ConnectionManager
from intellect_node.node.swarm.context import NodeContext
from intellect_node.node.swarm.control import NodeAlreadyRunning, claim_socket_path, serve_control
from intellect_node.node.swarm.dht_get import DHT_TIMEOUT_S
from intellect_node.node.swarm.discovery import Discovery
from intellect_node.node.swarm.gossip import build_pubsub, install_validator
from intellect_node.node.swarm.guard import StreamGuard
from intellect_node.node.swarm.host import build_host, claim_listen_addrs, listen_addrs
from intellect_node.node.swarm.member_exchange import MemberExchange
from intellect_node.node.swarm.membership import AdvertRecordValidator, MemberView, member_summary
from intellect_node.node.swarm.nat.traversal import NatTraversal
from intellect_node.node.swarm.peer_cache import PeerCache
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.node.swarm.settings import SwarmSettings
from intellect_node.node.swarm.supervisor import HostFailed, Supervisor, at_once
from intellect_node.node.swarm.upkeep import Upkeep
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue
from intellect_node.protocol.keys import DHT_NAMESPACE, members_topic
from intellect_node.protocol.messages import Hardware, Message, NodeAdvert
from intellect_node.protocol.rollouts import RolloutAnnouncement

log = logging.getLogger(__name__)


class JoinError(Exception):
    """The node could not reach the swarm; the message says what to do about it."""


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


class Node:
    def __init__(self, config: SwarmSettings, identity: Identity, hardware: Hardware,
                 services: Sequence[Service] = ()) -> None:
        self.config = config
        self.identity = identity
        self.peer_id = identity.peer_id
        self.services = list(services)
        self.started_at = time.time()
        self.scores = PeerScores(ban_log=config.layout.bans)
        self.scores.restore()
        self.view = MemberView(config.run_id)
        self.view.vouch(self.peer_id)
        self.peer_cache = PeerCache(config.layout.peer_cache)
        self.host = build_host(identity)
        self.guard = StreamGuard(self.scores)
        self.guard.install(self.host)  # before any handler is set, so it wraps every one
        self.supervisor = Supervisor()
        self.connections = ConnectionManager(self.host, config.connection_policy)
        self.pubsub, self.router = build_pubsub(self.host, guard=self.guard)
        self.pubsub.blacklisted_peers.update(_peer_ids(self.scores.banned))  # bans from before a restart
        self.dht = KadDHT(self.host, DHTMode.SERVER)
        self.dht.register_validator(DHT_NAMESPACE, AdvertRecordValidator(self.scores))
        self.upkeep = Upkeep(self.host, self.pubsub, self.view, self.peer_cache, self.scores)
        self.scores.on_ban, self.scores.on_lift = self.upkeep.on_ban, self.upkeep.on_lift
        self.nat = NatTraversal(self.host, self.scores, config, self.view, self.connections,
                                on_change=lambda: self.adverts.changed())
        self.adverts = Advertiser(identity, config, hardware, self.view, self.pubsub, self.dht,
                                  addresses=lambda data_addrs: self.nat.advertised(self.addrs(), data_addrs))
        self.members = MemberExchange(self.host, self.view, self.scores, self.peer_cache,
                                      own_envelope=lambda: self.adverts.envelope)
        self.discovery = Discovery(self.host, self.dht, config, self.view, self.scores, self.connections,
                                   self.members, self.nat.dial_relayed)
        self.announcements = Announcements(config.run_id, identity, self.pubsub, self.scores)
        # Every node relays the rollout announcements of its run (they tell every node which batches
        # exist: specs/rollouts.md), so it accepts them without a service asking; receivers count them.
        self.on_announcement(RolloutAnnouncement, self._of_this_run)

    # ---- lifecycle -------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        """Join and serve until cancelled; reports the listen multiaddrs once ready."""
        claimed = claim_listen_addrs(list(self.config.listen), defaulted=self.config.listen_defaulted)
        listen = [multiaddr.Multiaddr(addr) for addr in claimed]
        topic = members_topic(self.config.run_id)
        install_validator(self.pubsub, topic, (NodeAdvert,), self.members.on_gossip, self.scores)
        announcing = self.announcements.install()
        claim_socket_path(self.config.layout.control_socket)  # before supervision: a second node must not retry
        try:
            async with self.host.run(listen_addrs=listen), trio.open_nursery() as nursery:
                async with background_trio_service(self.pubsub), background_trio_service(self.router), \
                        background_trio_service(self.dht), background_trio_service(self.nat.relay), \
                        background_trio_service(self.nat.holepunch):
                    await self.pubsub.wait_until_ready()
                    nursery.start_soon(self.connections.run)
                    await nursery.start(self.supervisor.run, "control",
                                        partial(serve_control, self.config.layout.control_socket, self.snapshot))
                    self.members.install()
                    self.nat.install()
                    await self._supervise(nursery, "members-gossip", _drain, await self.pubsub.subscribe(topic))
                    if announcing:
                        await self._supervise(nursery, "announcements-gossip", _drain,
                                              await self.pubsub.subscribe(self.announcements.topic))
                    self.adverts.sign()
                    await self._join()
                    await self._supervise(nursery, "catch-up", self.discovery.catch_up)
                    for name, loop in (("advertise_loop", self.adverts.run), ("discovery_loop", self.discovery.run),
                                       ("upkeep_loop", self.upkeep.run),
                                       ("reachability_loop", self.nat.reachability_loop),
                                       ("relay_loop", self.nat.relay_loop)):
                        await self._supervise(nursery, name, loop)
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
        """The multiaddrs peers can dial (``host.listen_addrs``)."""
        return listen_addrs(self.host)

    async def _supervise(self, nursery: trio.Nursery, name: str, loop: Callable[..., Awaitable[None]],
                         *args: Any) -> None:
        await nursery.start(self.supervisor.run, name, at_once(partial(loop, *args)))

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
                log.info("joined run %s through %d of %d peers (%s)", self.config.run_id, reached, len(attempts),
                         source)
                return
        if not self.config.new_swarm:
            raise JoinError(join_failure_message(attempts))
        log.warning("%s; starting a new swarm as --new-swarm asks", join_failure_message(attempts))

    async def _attempt_join(self, addr: str, source: str, attempts: list[Attempt]) -> None:
        attempt = await self.discovery.connect(addr, source)
        if not attempt.ok:
            log.info("cannot join through %s", attempt.line())
        attempts.append(attempt)

    # ---- what services use (NodeContext) -----------------------------------------------------

    def on_announcement(self, cls: type[Message], handler: AnnouncementHandler) -> None:
        """Accept ``cls`` on the run's announcements topic; call before ``run``."""
        self.announcements.on(cls, handler)

    def _of_this_run(self, signed: codec.Signed[RolloutAnnouncement], raw: bytes) -> bool:
        if signed.message.run_id != self.config.run_id:
            raise InvalidValue(f"announcement for run {signed.message.run_id!r}")
        return True

    async def announce(self, message: Message, lifetime_s: float) -> bytes:
        """Sign and gossip ``message`` on the announcements topic; returns the envelope."""
        return await self.announcements.announce(message, lifetime_s)

    async def publish_announcement(self, envelope: bytes) -> None:
        """Gossip an envelope signed earlier (a verdict is recorded durably before it goes out)."""
        await self.announcements.publish(envelope)

    def update_advert(self, *, policy_step: int | None = None, extra_addr: str | None = None) -> None:
        """Change what this node advertises; the new advert goes out within ``ADVERT_SETTLE_S``
        (node/swarm/adverts.py), not at the next refresh."""
        self.adverts.update(policy_step=policy_step, extra_addr=extra_addr)

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
            **self.nat.status(),
            "gossip_peers": len(self.pubsub.peers),
            "gossip_mesh": {topic: len(peers) for topic, peers in self.router.mesh.items()},
            "gossip_rpcs": self.router.rpc_counts(),
            "adverts": {**self.adverts.counts, **self.members.gossip_counts},
            "members": members,
            "rejections": dict(self.scores.rejections),
            "banned": sorted(self.scores.banned),
            "services": {service.name: service.status() for service in self.services},
            "handler_errors": dict(self.guard.errors),
            "stream_tables": self.guard.status(),
            "supervisor": self.supervisor.snapshot(),
        }


async def _drain(subscription: Any) -> None:
    """Gossip is handled in the topic validators; a subscription queue only needs emptying."""
    try:
        while True:
            await subscription.get()
    except (trio.EndOfChannel, trio.ClosedResourceError):
        return  # unsubscribed


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
