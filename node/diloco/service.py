"""The ``diloco`` role in a node: a ``DilocoPeer`` run round after round off the event loop.

The rounds run in a worker thread (a round is minutes of compute and a blocking wait on the
averager child); the trio side prints one progress line per round, appends it to
``<home>/diloco/metrics.jsonl`` durably, and answers ``status``. On shutdown (Ctrl-C, SIGTERM,
a cancelled service) the peer is told to stop, and the child's whole process group is ended.

Where the hivemind peers come from: the node advertises its child's hivemind address in its
signed advert (``adverts``), and the child starts from the addresses that the run's other
``diloco`` members advertise, plus ``[diloco] initial_peers``. Two nodes that both started alone
(neither had seen the other's advert yet) would train in two separate hivemind swarms; so at a
round boundary, a node that started alone, whose last round found no group, and that now sees
another member restarts its child with that member as initial peer, if its own node peer id is
the larger (exactly one side moves).

The global state travels through the shard overlay (``state_overlay``): the node serves its state
after every outer step and advertises that server as ``/ip4/<host>/tcp/<port>/http/diloco-state``;
on start, and after a solo or disagreeing round, it takes the state most live members vouch for.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from intellect_node.node.diloco.adverts import advert_addr, hivemind_maddr, port_of, state_endpoint
from intellect_node.node.diloco.client import AveragerClient, AveragerError, ChildSettings
from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.peer import DilocoPeer, RoundRecord, Stopped
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.diloco.state_hash import state_hash
from intellect_node.node.diloco.state_overlay import StateOverlay
from intellect_node.node.diloco.workload import build_model
from intellect_node.node.home.durable import append_durably
from intellect_node.node.shards.client import Endpoint

if TYPE_CHECKING:
    from intellect_node.crypto.identity import Identity
    from intellect_node.node.swarm.runtime import Node

log = logging.getLogger(__name__)
T = TypeVar("T")


def hivemind_prefix(run_id: str) -> str:
    """The run's matchmaking prefix: hivemind refuses dots, our frames accept [A-Za-z0-9_-]."""
    return "diloco_" + re.sub(r"[^A-Za-z0-9_-]", "_", run_id)[:56]


class DilocoService:
    name = "diloco"

    def __init__(self, home: Path, run_id: str, settings: DilocoSettings) -> None:
        self.home, self.run_id, self.settings = home, run_id, settings
        self.peer: DilocoPeer | None = None
        self.overlay: StateOverlay | None = None  # this peer's state server and a joiner's majority fetch
        self.last: RoundRecord | None = None
        self.progress: dict[str, Any] = {}
        self.solo_rounds = 0
        self.adopted = 0  # states taken from peers (on joining, or after this peer diverged)

    @property
    def sync_timeout_s(self) -> float:
        return min(self.settings.round_timeout_s, 30.0)

    def build(self, identity: Identity, initial_peers: tuple[str, ...]) -> DilocoPeer:
        """The model (θ0 from the run's seed: equal on every peer), the data, the child, the peer."""
        s = self.settings
        data = s.open_data()  # a bad store fails here, before any child starts
        self.home.mkdir(parents=True, exist_ok=True)
        model = build_model(s.model, seed=s.seed)
        client = AveragerClient(self.home / "averager.sock", Layout.of(dict(model.named_parameters())),
                                ChildSettings(hivemind_prefix(self.run_id), s.levels, initial_peers, s.host, s.port,
                                              s.max_peers, s.min_peers, s.matchmaking_s,
                                              str(self.home / "hivemind.key"), s.allowlist, data.digest,
                                              s.sparse_k),
                                self.home / "averager.log")
        client.ensure_running()
        return DilocoPeer(model, s, client, data, identity, self.home / "state.safetensors")

    def _on_progress(self, progress: dict[str, Any]) -> None:
        self.progress = progress

    def record(self, rec: RoundRecord) -> None:
        self.last = rec
        self.progress = {"phase": "outer step applied"}
        self.solo_rounds += rec.solo
        log.info("diloco %s", rec.line())
        append_durably(self.home / "metrics.jsonl", json.dumps(asdict(rec)))

    def advertised_peers(self, node: Node) -> dict[str, list[str]]:
        """Hivemind addresses of the run's other diloco members, by node peer id, from their adverts."""
        found: dict[str, list[str]] = {}
        for member in node.view.members():
            advert = member.advert
            if advert.peer_id == node.peer_id or "diloco" not in advert.roles:
                continue
            maddrs = [m for m in map(hivemind_maddr, advert.addrs) if m is not None]
            if maddrs:
                found[advert.peer_id] = maddrs
        return found

    def _advertise(self, node: Node, client: AveragerClient) -> None:
        for maddr in client.maddrs:
            addr = advert_addr(maddr)
            if addr is not None:
                node.update_advert(extra_addr=addr)

    async def _merge_if_split(self, node: Node, peer: DilocoPeer) -> None:
        """A child that started alone, and whose last round found nobody, joins a member it now sees,
        if this node's id is the larger (others may well have joined it: then its rounds have groups)."""
        client = peer.client
        if client.settings.initial_peers or self.last is None or not self.last.solo:
            return
        others = self.advertised_peers(node)
        if not others or min(others) > node.peer_id:
            return
        initial = tuple(m for maddrs in others.values() for m in maddrs)[:64]
        port = max((port_of(m) for m in client.maddrs), default=0)  # keep the advertised address valid
        log.info("diloco: joining the hivemind swarm of %d member(s) this node started apart from", len(others))
        await self._off_loop(peer, client.restart,
                             dataclasses.replace(client.settings, initial_peers=initial, port=port))
        self._advertise(node, client)

    async def _off_loop(self, peer: DilocoPeer, work: Callable[..., T], *args: Any) -> T:
        """``work`` in a worker thread. If this task is cancelled meanwhile (Ctrl-C, SIGTERM), the peer
        is told to stop and its child is ended, so the thread returns within an inner step, and it is
        waited for: a thread abandoned inside torch makes the interpreter abort at exit."""
        finished = False

        async def stop_on_cancel() -> None:
            try:
                await trio.sleep_forever()
            finally:
                if not finished:
                    peer.stopping.set()
                    with trio.CancelScope(shield=True):  # closing waits up to seconds for the child: not on the loop
                        await trio.to_thread.run_sync(peer.client.close)

        stopped: Stopped | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_cancel)
            try:
                result = await trio.to_thread.run_sync(work, *args)
            except Stopped as exc:  # raised past the nursery, which would wrap it in an ExceptionGroup
                stopped = exc
            except AveragerError as exc:  # the child ended under a restart or a request: by us, if stopping
                if not peer.stopping.is_set():
                    raise
                stopped = Stopped(f"stopped: {exc}")
            finally:
                finished = True
                nursery.cancel_scope.cancel()
        if stopped is not None:
            raise stopped
        return result

    def state_servers(self, node: Node) -> list[Endpoint]:
        """The state servers of the run's other diloco members, from their signed adverts."""
        found = []
        for member in node.view.members():
            advert = member.advert
            if advert.peer_id != node.peer_id and "diloco" in advert.roles:
                endpoint = state_endpoint(advert.peer_id, advert.addrs)
                if endpoint is not None:
                    found.append(endpoint)
        return found

    async def _sync(self, node: Node, peer: DilocoPeer, overlay: StateOverlay) -> None:
        """Adopt the state most live members vouch for, if it is ahead of ours (or we diverged)."""
        fetched = await overlay.fetch_majority(self.state_servers(node), self.sync_timeout_s, peer.state.round,
                                               peer.diverged)
        if fetched is not None and await self._off_loop(peer, peer.adopt, fetched[0]):
            self.adopted += 1
            await self._publish(peer, overlay, fetched[1])

    async def _publish(self, peer: DilocoPeer, overlay: StateOverlay, digest: bytes) -> None:
        """Serve the state after an outer step; a failure costs joiners one server, not our rounds."""
        try:
            await overlay.publish(peer.state, digest)
        except (OSError, ValueError) as exc:
            log.warning("diloco: could not serve the round-%d state: %s", peer.state.round, exc)

    async def run(self, node: Node, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        advertised = tuple(m for maddrs in self.advertised_peers(node).values() for m in maddrs)
        initial = tuple(dict.fromkeys(advertised + self.settings.initial_peers))[:64]
        peer = await trio.to_thread.run_sync(self.build, node.identity, initial)
        self.peer = peer
        self.overlay = overlay = StateOverlay(self.home / "states", self.run_id, node.identity, node.scores,
                                              peer.layout, frozenset(self.settings.allowlist),
                                              run_digest=peer.layout.run_digest(peer.data.digest))
        self._advertise(node, peer.client)
        log.info("diloco: hivemind peer %s at %s, started from %d peer(s); round %d", peer.client.peer_id,
                 peer.client.maddrs, len(initial), peer.state.round)
        try:
            async with trio.open_nursery() as nursery:  # the state server lives as long as the rounds
                node.update_advert(extra_addr=await nursery.start(overlay.serve, self.settings.host))
                task_status.started()
                try:
                    await self._rounds(node, peer, overlay)
                except Stopped:
                    pass
                nursery.cancel_scope.cancel()
        finally:
            peer.stopping.set()
            peer.client.close()

    async def _rounds(self, node: Node, peer: DilocoPeer, overlay: StateOverlay) -> None:
        """Serve the state, take the swarm's if it is ahead, then round after round (each outer step
        served), until ``rounds`` or until stopped."""
        await self._publish(peer, overlay, await trio.to_thread.run_sync(state_hash, peer.state))
        await self._sync(node, peer, overlay)
        while not self.settings.rounds or peer.state.round < self.settings.rounds:
            await self._merge_if_split(node, peer)
            if peer.diverged:
                await self._sync(node, peer, overlay)
            record = await self._off_loop(peer, peer.run_round, self._on_progress)
            if record is not None:  # the first overlapped round applies nothing yet
                self.record(record)
                await self._publish(peer, overlay, bytes.fromhex(record.state_hash))
        last = await self._off_loop(peer, peer.finish)  # overlap: the round still in flight
        if last is not None:
            self.record(last)
            await self._publish(peer, overlay, bytes.fromhex(last.state_hash))

    def status(self) -> dict[str, Any]:
        peer, last = self.peer, self.last
        return {"round": peer.state.round if peer else None, "phase": self.progress.get("phase", "starting"),
                "inner_step": self.progress.get("step"), "loss": self.progress.get("loss"),
                "last_round": asdict(last) if last else None, "solo_rounds": self.solo_rounds,
                "states_adopted": self.adopted,
                "hivemind_peer": peer.client.peer_id if peer else None,
                "hivemind_maddrs": peer.client.maddrs if peer else [],
                "averager_pid": peer.client.process.pid if peer and peer.client.process else None,
                "averager_restarts": max(peer.client.restarts, 0) if peer else 0,
                "state_overlay": dict(self.overlay.counters) if self.overlay else {}}
