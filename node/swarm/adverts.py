"""``Advertiser``: this node's own signed advert, kept current in gossip and in the DHT.

The advert is how the run knows a node exists (specs/dht.md): peers expire it after
``advert_lifetime_s``, so it must be repeated, and it carries what changes while the node runs (the
policy step, the addresses reachability allows, data-plane endpoints), so a change must go out
soon, not at the next refresh. Gossip carries every repetition; the DHT copy is only for lookups,
and is stored far more rarely because each store costs a lookup plus writes at about k peers.

Soon, not at once: every new signing gossiped floods the members topic (each node receives it from
each of its mesh peers and forwards it to the rest), and a joining node's advert changes several
times in its first seconds (its data-plane address, its first reachability verdict), each gossiped
at once, with two more repeats once its mesh formed: while 100 nodes formed on 2 cores each sent
17.7 gossip RPCs a second, 16 of them forwards, on top of the heartbeat budget (bench/HISTORY.md
"Scale"). So a change is signed at once (our own view, and every members exchange from then on,
carry it), but gossiped settled: the first gossip waits until the join has settled
(``ADVERT_SETTLE_S``, and a members mesh), after that the changes of any burst go out together, at
most one publish per ``ADVERT_SETTLE_S``, and a change that leaves the advert as it was is not
signed at all (specs/dht.md "Advert changes").
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import random
from collections import Counter
from collections.abc import Callable

import trio
from libp2p.kad_dht.kad_dht import KadDHT
from libp2p.pubsub.pubsub import Pubsub

from intellect_node.crypto.envelope import now_ms
from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.dht_get import DHT_TIMEOUT_S
from intellect_node.node.swarm.membership import MemberView
from intellect_node.node.swarm.settings import SwarmSettings
from intellect_node.protocol import codec
from intellect_node.protocol.keys import advert_key, members_topic, run_members_key
from intellect_node.protocol.messages import Hardware, NodeAdvert

log = logging.getLogger(__name__)
# the installed distribution's version (pyproject.toml is its one source)
SOFTWARE_VERSION = importlib.metadata.version("intellect-node")
MAX_ADVERTISED_ADDRS = 16
MESH_WAIT_S = 5.0  # after joining, how long to wait for a members mesh before gossiping anyway
# Changes within this long of the last publish go out together, in one publish, once it has passed
# (the first gossip after joining waits this long too): a joining light member's data-plane address
# and first reachability verdict come within about 1.5 s of joining on an idle machine.
ADVERT_SETTLE_S = 2.0
PROVIDER_REFRESH_S = 3600.0  # libp2p provider records last 48 h; once an hour is plenty
# Heartbeats grow sparser as the run grows, so the members topic stays under about this many
# messages per second in total (bench/scale.py, specs/dht.md).
MEMBERS_TOPIC_BUDGET_PER_S = 1.0
# A heartbeat between re-signings repeats bytes its receivers hold: they drop it, so it stops at the
# origin's mesh. A new signing reaches every node once from each of its mesh peers and is forwarded
# by each, about 11 RPCs a node: past ~30 members, where every heartbeat had become a new signing,
# that was most of a light member's 1.5-1.7% of a core at rest. So re-signing has a budget of its
# own: up to this many members the configured ``advert_refresh_s`` holds; past it each member
# re-signs proportionally less often, so the run signs what this many members sign at the
# configured cadence (0.25 a second with the defaults), whatever its size.
MEMBERS_AT_CONFIGURED_REFRESH = 10
# A stretched advert lives this many re-signings: a re-signing may wait out a heartbeat's jitter, a
# loaded machine and a lost delivery (anti-entropy repairs that within a discovery round), and the
# longer it lives, the longer a vanished node stays listed.
LIFETIME_PER_REFRESH = 1.5
JITTER = 0.1  # each interval is drawn within +-10%: nodes started together must not publish in step
# A new checkpoint moves every member's policy step within seconds: gossiped by all, each step cost
# every node about 6 messages sent per member (222 at 40 members for one 4 MiB broadcast; 1.4 s of
# a core per node per step at 100). About this many members of any size gossip a new step at once
# (each with probability PROMPT_STEP_GOSSIPS / members), enough for a delta follower's holders; the
# rest carry it in their own view and members exchanges at once and gossip it with their next
# heartbeat. A trainer's step always goes at once: workers commit against it (specs/dht.md).
PROMPT_STEP_GOSSIPS = 8


class Advertiser:
    def __init__(self, identity: Identity, settings: SwarmSettings, hardware: Hardware, view: MemberView,
                 pubsub: Pubsub, dht: KadDHT, addresses: Callable[[list[str]], list[str]]) -> None:
        """``addresses(data_addrs)``: every address peers can use now, the libp2p ones and the given
        data-plane ones (reachability decides which: ``NatTraversal.advertised``)."""
        self.identity = identity
        self.settings = settings
        self.hardware = hardware
        self.view = view
        self.pubsub = pubsub
        self.dht = dht
        self.addresses = addresses
        self.policy_step: int | None = None
        self.extra_addrs: list[str] = []  # data-plane endpoints (e.g. /ip4/.../tcp/.../http)
        self.envelope: bytes | None = None  # the advert as last signed; None before the first signing
        self.signed: NodeAdvert | None = None  # what ``envelope`` says
        self.signed_at = -math.inf  # trio time of the last signing
        self.signed_lifetime_s = 0.0  # the last signing's lifetime
        self._resign_share = 1.0  # of the re-signing interval, drawn at each signing (JITTER)
        self._timestamp_ms = 0  # the last signing's envelope timestamp
        self._changed = trio.Event()
        # ``changes`` signalled, adverts ``signed``, envelopes ``published`` (``status``'s ``adverts``)
        self.counts: Counter[str] = Counter()

    def own_advert(self) -> NodeAdvert:
        return NodeAdvert(
            peer_id=self.identity.peer_id,
            run_id=self.settings.run_id,
            roles=tuple(dict.fromkeys(self.settings.roles)),
            addrs=self.advertised_addrs(),
            hardware=self.hardware,
            throughput_tokens_per_s=None,
            software_version=SOFTWARE_VERSION,
            policy_step=self.policy_step,
        )

    def advertised_addrs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.addresses(self.extra_addrs)))[:MAX_ADVERTISED_ADDRS]

    def update(self, *, policy_step: int | None = None, extra_addr: str | None = None) -> None:
        """Change what this node advertises: signed at once, gossiped within ``ADVERT_SETTLE_S``,
        not at the next refresh (a new policy step alone: by ``PROMPT_STEP_GOSSIPS`` members of
        the run, the rest at their next heartbeat)."""
        new_addr = extra_addr is not None and extra_addr not in self.extra_addrs
        if policy_step is not None:
            self.policy_step = policy_step
        if new_addr:
            self.extra_addrs.append(extra_addr)
        self.changed(gossip_soon=new_addr or self._gossips_step_soon())

    def _gossips_step_soon(self) -> bool:
        if "trainer" in self.settings.roles:
            return True
        return random.random() < PROMPT_STEP_GOSSIPS / max(1, len(self.view.members()))

    def changed(self, gossip_soon: bool = True) -> None:
        """Something the advert carries may have changed: if it did, re-sign it now (our view and
        the members exchange carry it at once) and have ``run`` gossip it once settled, or with
        the next heartbeat when not ``gossip_soon``."""
        self.counts["changes"] += 1
        if self.own_advert() != self.signed:
            self.sign(self.cadence()[1])
            if gossip_soon:
                self._changed.set()
            else:
                self.counts["deferred"] += 1

    def sign(self, lifetime_s: float | None = None) -> bytes:
        """Sign the advert as it stands and put it in our own view (we are a member too)."""
        lifetime_s = self.settings.advert_lifetime_s if lifetime_s is None else lifetime_s
        self.signed = self.own_advert()
        # strictly newer than the last signing: two changes in one millisecond (changed() signs at
        # once) would otherwise make the second a replay of the first, refused by our own view
        self._timestamp_ms = max(now_ms(), self._timestamp_ms + 1)
        self.envelope = codec.encode(self.signed, self.identity, lifetime_s=lifetime_s,
                                     timestamp_ms=self._timestamp_ms)
        self.signed_at = trio.current_time()
        self.signed_lifetime_s = lifetime_s
        self._resign_share = random.uniform(1 - JITTER, 1)
        self.view.accept(self.envelope)
        self.counts["signed"] += 1
        return self.envelope

    def cadence(self) -> tuple[float, float, float]:
        """(heartbeat interval, advert lifetime, re-signing interval) for the run's present size.

        Re-signing: every ``advert_refresh_s`` up to ``MEMBERS_AT_CONFIGURED_REFRESH`` members,
        then stretched in proportion, so the run's new signings a second, what each node receives
        and forwards, stay flat as it grows; the lifetime spans ``LIFETIME_PER_REFRESH`` of them
        (never below ``advert_lifetime_s``, at most the advert's ``MAX_LIFETIME_S``, past which the
        re-signing is held at the lifetime's share and the budget gives: specs/dht.md). Heartbeats
        come every ``members / MEMBERS_TOPIC_BUDGET_PER_S`` (at least ``heartbeat_s``, at most a
        re-signing interval); those between re-signings are repeats that stop at the origin's
        mesh. The cost: a node that vanishes stays listed for up to one lifetime (600 s at 100
        members with the defaults).
        """
        settings = self.settings
        members = len(self.view.members())
        refresh = settings.advert_refresh_s * max(1.0, members / MEMBERS_AT_CONFIGURED_REFRESH)
        lifetime = min(max(settings.advert_lifetime_s, LIFETIME_PER_REFRESH * refresh), NodeAdvert.MAX_LIFETIME_S)
        refresh = min(refresh, lifetime / LIFETIME_PER_REFRESH)
        interval = min(max(settings.heartbeat_s, members / MEMBERS_TOPIC_BUDGET_PER_S), refresh)
        return interval, lifetime, refresh

    def resign_due(self, refresh: float) -> float:
        """When the current signing must be replaced: a jittered share of ``refresh``, and never
        later than its own lifetime allows (the run may have grown since it was signed)."""
        return self.signed_at + self._resign_share * min(refresh, self.signed_lifetime_s / LIFETIME_PER_REFRESH)

    async def run(self) -> None:
        """Gossip the advert every heartbeat; re-sign when due, gossip (and re-store in the DHT)
        each new signing once settled.

        One loop, one message per interval: the heartbeat repeats the current envelope, which is
        re-signed every refresh (``cadence``) so it never nears expiry. The interval grows with the
        run (``MEMBERS_TOPIC_BUDGET_PER_S``). A change (signed by ``changed``) is gossiped at once
        if the last publish is ``ADVERT_SETTLE_S`` old, else when it is (or at the heartbeat, if
        that comes first), so the changes of a burst go out as one publish. The DHT store runs
        beside the loop: it can take seconds under load, and the cadence must not wait for it or
        peers would expire a live node.
        """
        await self._settle_after_join()
        stored_at = provided_at = heartbeat_at = published_at = -math.inf
        stored_lifetime = 0.0
        stored_addrs: tuple[str, ...] | None = None
        gossiped: bytes | None = None  # the envelope last published
        async with trio.open_nursery() as stores:
            while True:
                interval, lifetime, refresh = self.cadence()
                self._changed = trio.Event()
                now = trio.current_time()
                if self.signed is None or now >= self.resign_due(refresh):
                    self.sign(lifetime)
                envelope, addrs = self.envelope, self.signed.addrs
                fresh = envelope != gossiped
                # The DHT copy only has to outlive its own half-life and carry the addresses a
                # lookup dials; each put is a lookup plus stores at ~k peers, which at gossip
                # cadence swamped a 20-node swarm's CPU, and at every policy step (a new checkpoint
                # every second or two in the demo) helped DHT traffic to a seventh of a worker's CPU
                # (bench/HISTORY.md, "Cutting the swarm's CPU per step"). A new policy step reaches
                # members by gossip; the DHT copy catches up at its refresh.
                if fresh and (addrs != stored_addrs or now - stored_at >= stored_lifetime / 2):
                    stored_addrs, stored_lifetime = addrs, lifetime
                    provide = now - provided_at >= PROVIDER_REFRESH_S
                    stored_at = now
                    provided_at = now if provide else provided_at
                    stores.start_soon(self._store, envelope, provide)
                if fresh or now >= heartbeat_at:
                    await self.publish()
                    gossiped, published_at = envelope, now
                    heartbeat_at = now + interval * random.uniform(1 - JITTER, 1 + JITTER)
                with trio.move_on_at(min(heartbeat_at, self.resign_due(refresh))):
                    await self._changed.wait()
                    await trio.sleep_until(published_at + ADVERT_SETTLE_S)

    async def _settle_after_join(self) -> None:
        """Hold the first gossip until the join has settled (``ADVERT_SETTLE_S``) and this node has a
        members mesh, at most ``MESH_WAIT_S``. The peers this node joined through already hold its
        advert (the members exchange carries it), and gossip before any mesh exists reaches nobody
        (gossipsub sends only to mesh peers); meanwhile the join's own changes (its data-plane
        address, its first reachability verdict) come in, and one publish carries them all."""
        topic = members_topic(self.settings.run_id)
        started = trio.current_time()
        with trio.move_on_at(started + MESH_WAIT_S):
            await trio.sleep_until(started + ADVERT_SETTLE_S)
            # a poll, bounded: py-libp2p's router wakes a waiter per (peer, topic) only (wait_for_mesh),
            # and which peers will form the mesh is unknown while joining (pubsub has met none yet)
            while not self.pubsub.router.mesh.get(topic):  # noqa: ASYNC110
                await trio.sleep(0.1)

    async def _store(self, envelope: bytes, provide: bool) -> None:
        """Put the advert (and, rarely, the run provider record); bounded so puts never pile up."""
        run_id = self.settings.run_id
        with trio.move_on_after(min(DHT_TIMEOUT_S, self.settings.advert_refresh_s)):
            try:
                await self.dht.put_value(advert_key(run_id, self.identity.peer_id), envelope)
                if provide:
                    await self.dht.provide(run_members_key(run_id))
            except Exception as exc:  # no reachable DHT peers yet: the next round retries
                log.debug("advert DHT put failed: %s", exc)

    async def publish(self) -> None:
        """Gossip the current envelope (nothing before the first signing)."""
        if self.envelope is None:
            return
        self.counts["published"] += 1
        try:
            await self.pubsub.publish(members_topic(self.settings.run_id), self.envelope)
        except Exception as exc:
            log.debug("advert publish failed: %s", exc)
