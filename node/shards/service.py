"""The weight broadcast overlay as a node ``Service``: publish, learn, fetch, serve, retain.

- The trainer (``publish_dir`` set) turns each ``step-<N>.safetensors`` dropped there into a held
  checkpoint, signs its manifest and gossips it (``publisher``).
- Every node accepts manifests signed by the run's trainer only (``unauthorized_signer``), from
  gossip, from a peer's HTTP server when a member advertises a newer step (``discovery``), or on
  restart from disk; fetches each new step (``fetcher``), serves every verified shard (``server``
  over HTTP, ``stream_server`` over libp2p streams for peers that cannot dial HTTP), provides a
  DHT record per (step, shard) (``provider``), keeps the newest ``keep_steps`` and advertises the
  newest complete step as its ``policy_step``.
- A step whose manifest names a delta (specs/deltas.md) against a base held complete here is built
  from that base and the delta body (megabytes, not the checkpoint), checked against every shard
  hash, and then held like any fetched step; where that fails, the step is fetched in full
  (``delta_follower``).
- A bad shard is reported on gossip as a signed ``ShardComplaint`` (``complaints``).

``ShardService`` is the facade the roles and the node use (``store``, ``wait_complete_after``,
``status``); it wires those parts together and keeps what orders them: the intake of manifests,
the steps being started and fetched, retention and completion. ``<data_dir>/status.json``
(``status_file``) tells operators and tests what the node holds, fetched and uploaded, and the
complaints it made and heard.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import trio
from libp2p.custom_types import TProtocol

from intellect_node.node.config.base import ConfigError
from intellect_node.node.shards.client import ShardClient
from intellect_node.node.shards.complaints import ShardComplaints
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.copy_ahead import CopyAhead
from intellect_node.node.shards.delta_follower import DeltaFollower
from intellect_node.node.shards.delta_relay import HeldBodies
from intellect_node.node.shards.deltas import usable_base
from intellect_node.node.shards.discovery import StepDiscovery
from intellect_node.node.shards.fetcher import CheckpointFetch, PeerBook
from intellect_node.node.shards.progress import CheckpointProgress
from intellect_node.node.shards.provider import ShardProvider
from intellect_node.node.shards.publisher import CheckpointPublisher
from intellect_node.node.shards.server import ShardServer
from intellect_node.node.shards.status_file import StatusFile, shard_status
from intellect_node.node.shards.store import Checkpoint, InsufficientDisk, ShardStore
from intellect_node.node.shards.stream_client import ShardStreamClient
from intellect_node.node.shards.stream_server import ShardStreamServer
from intellect_node.node.swarm.host import dialable_hosts
from intellect_node.node.swarm.streams import connection_path
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Unjudgeable
from intellect_node.protocol.framing import SHARDS_PROTOCOL
from intellect_node.protocol.lora import LORA_FORMAT
from intellect_node.protocol.manifest import (
    CheckpointManifest,
    DeltaRef,
    ShardComplaint,
    UnauthorizedSigner,
    authorize_manifest,
)

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)


class ShardService:
    def __init__(self, node: NodeContext, config: ShardConfig) -> None:
        self.node = node
        self.config = config
        self.name = "shards"
        self.run_id = node.config.run_id
        if config.is_publisher and config.trainer not in (None, node.peer_id):
            raise ConfigError(f"--publish-dir makes this node ({node.peer_id}) the trainer, but --trainer names "
                              f"{config.trainer}: its manifests would be refused everywhere, its own copy included")
        self.trainer = config.trainer or (node.peer_id if config.is_publisher else None)
        if self.trainer not in (None, node.peer_id):
            node.connections.protect(self.trainer, "trainer")  # never trimmed (specs/connections.md)
        self.store = ShardStore(config.data_dir, self.run_id)
        self.status_file = StatusFile(config.data_dir / "status.json", self.status)
        self.book = PeerBook(path_of=lambda peer_id: connection_path(node.host, peer_id))
        self.client = ShardClient(node.identity, config.stall_s)
        self.streams = ShardStreamClient(node.host, config.stall_s)
        held = HeldBodies()  # delta bodies checked here, served while their steps are built
        self.server = ShardServer(self.store, config, node.peer_id, node.scores, on_upload=self.status_file.mark_dirty,
                                  relays=self.book.may_relay, held=held)
        self.stream_server = ShardStreamServer(self.server, node.scores, on_change=self.status_file.mark_dirty)
        self.progress = CheckpointProgress()
        self.counters = {"fetched_bytes": 0, "fetched_shards": 0, "resumed_shards": 0, "bad_shards": 0,
                         "published_delta_bytes": 0, "delta_steps": 0, "delta_bytes": 0, "bad_deltas": 0,
                         "delta_refused": 0, "delta_mismatch": 0, "delta_no_base": 0, "delta_unavailable": 0,
                         "delta_copied_ahead": 0, "delta_from_members": 0}
        self.provider = ShardProvider(node)
        self.discovery = StepDiscovery(node, config, self.store, self.book, self.client, self.streams,
                                       trainer=self.trainer, decode_manifest=self.decode_manifest, accept=self._accept)
        self.copies = None if config.is_publisher else CopyAhead(self.store)
        self.deltas = DeltaFollower(node, config, self.store, self.client, self.streams, self.counters,
                                    self.decode_manifest, self.trainer, self.copies, held)
        self.publisher = (CheckpointPublisher(node, config, self.store, self.counters, self)
                          if config.is_publisher else None)
        self.complaints = ShardComplaints(node, self.book, on_change=self.status_file.mark_dirty)
        self.http_addr: str | None = None
        self._fetches: dict[int, trio.CancelScope] = {}
        self._starting: set[int] = set()  # steps whose partial directory is being created
        self._adapter_base: int | None = None  # the newest frozen base an adapter named
        self._incoming_send, self._incoming = trio.open_memory_channel[
            tuple[codec.Signed[CheckpointManifest], bytes]](64)
        self._nursery: trio.Nursery | None = None
        self._newly_complete = trio.Event()  # set, then replaced, each time a step becomes complete here
        if self.trainer is None:
            log.warning("no trainer peer id configured (--trainer): this node accepts no checkpoint manifests")
        node.on_announcement(CheckpointManifest, self._on_manifest_gossip)
        node.on_announcement(ShardComplaint, self.complaints.on_gossip)

    # ---- checking manifests ----------------------------------------------------------------

    def _authorize(self, signed: codec.Signed[CheckpointManifest]) -> None:
        authorize_manifest(signed.message, signed.signer_peer_id, self.run_id, self.trainer)

    def decode_manifest(self, envelope: bytes) -> codec.Signed[CheckpointManifest]:
        """A manifest envelope from anywhere (peer, disk), fully checked, or ``Rejected``."""
        signed = codec.decode(envelope, CheckpointManifest)
        self._authorize(signed)
        return signed

    def _on_manifest_gossip(self, signed: codec.Signed[CheckpointManifest], raw: bytes) -> bool:
        """Queue a manifest heard on gossip. The forwarder never pays for whose signature it is:
        without a trainer this node cannot judge one (``Unjudgeable``, free); with one, a manifest
        signed by another key is its signer's fault (the gossip originator, checked against the
        envelope), charged to the signer and dropped. (Charged to the forwarder, an inference node
        started without --trainer took 60 points per trainer checkpoint from honest neighbours.)"""
        if self.trainer is None:
            raise Unjudgeable(f"manifest of step {signed.message.step}: this node knows no trainer (--trainer)")
        try:
            self._authorize(signed)
        except UnauthorizedSigner as exc:
            self.node.scores.reject(signed.signer_peer_id, exc.reason, f"manifest on gossip: {exc}")
            return False
        try:
            self._incoming_send.send_nowait((signed, raw))
        except trio.WouldBlock:
            log.warning("manifest queue full; step %d will be found by discovery", signed.message.step)
        return True

    # ---- lifecycle -------------------------------------------------------------------------

    async def run(self, node: NodeContext, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        resumed = await trio.to_thread.run_sync(self.store.reopen, self.decode_manifest)
        self.counters["resumed_shards"] = sum(resumed)
        for checkpoint in self.store.held():
            checkpoint.origin = self.trainer == node.peer_id  # a restarted trainer seeds again
        host = _listen_host(node.config.listen)
        node.host.set_stream_handler(TProtocol(SHARDS_PROTOCOL), self.stream_server.handle)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            port = await nursery.start(self.server.serve, host, self.config.http_port)
            hosts = [self.config.public_host] if self.config.public_host else dialable_hosts(host)
            addrs = [f"/ip4/{h}/tcp/{port}/http" for h in hosts]
            self.http_addr = addrs[0]
            for extra in addrs[1:]:
                node.update_advert(extra_addr=extra)
            newest = self.store.newest_complete()
            node.update_advert(extra_addr=self.http_addr, policy_step=newest.step if newest else None)
            nursery.start_soon(self.provider.provide_loop)
            for checkpoint in self.store.held():
                self.provider.provide_held(checkpoint)
                if not checkpoint.complete:
                    await nursery.start(self._fetch, checkpoint)
            nursery.start_soon(self._intake_loop)
            nursery.start_soon(self.discovery.run)
            if self.copies is not None:
                nursery.start_soon(self.copies.run)
                self.copies.after_completion()
            nursery.start_soon(self.status_file.run)
            if self.publisher is not None:
                nursery.start_soon(self.publisher.run)
            log.info("shard overlay serving on %s (data in %s)", self.http_addr, self.store.root)
            task_status.started()
            await trio.sleep_forever()

    # ---- new manifests ---------------------------------------------------------------------

    async def _intake_loop(self) -> None:
        async for signed, envelope in self._incoming:
            await self._accept(signed, envelope)

    async def _accept(self, signed: codec.Signed[CheckpointManifest], envelope: bytes) -> None:
        manifest = signed.message
        if manifest.step in self._starting:
            return  # the same step, from gossip and discovery at once
        held = self.store.checkpoints.get(manifest.step)
        if held is not None:
            if held.manifest.checkpoint_hash != manifest.checkpoint_hash:
                log.warning("trainer signed two different manifests for step %d; keeping the first", manifest.step)
            elif signed.envelope.expiry_ms > held.envelope_expiry_ms():
                self.store.replace_envelope(held, envelope)  # serve the copy that lasts longest
            return
        steps = sorted(self.store.checkpoints)
        old = len(steps) >= self.config.keep_steps and manifest.step < steps[-self.config.keep_steps]
        if old and manifest.step not in self._adapter_bases():
            return  # older than everything we keep (an adapter's base is kept however old)
        self._starting.add(manifest.step)
        ref = manifest.delta
        if ref is not None and ref.format == LORA_FORMAT:
            self._adapter_base = max(ref.base_step, self._adapter_base or 0)
        if ref is not None and ref.format == LORA_FORMAT and ref.base_step not in self.store.checkpoints:
            assert self._nursery is not None
            self._nursery.start_soon(self._fetch_adapter_base, ref)
        base = usable_base(self.store, manifest)
        if base is not None:
            assert self._nursery is not None
            self._nursery.start_soon(self._follow_delta, signed, envelope, base)
            return
        await self._fetch_in_full(signed, envelope)

    async def _follow_delta(self, signed: codec.Signed[CheckpointManifest], envelope: bytes,
                            base: Checkpoint) -> None:
        """Build the step from ``base`` and its delta (``delta_follower``); fetch it in full if that fails."""
        step = signed.message.step
        try:
            checkpoint = await self.deltas.build(signed, envelope, base)
        except InsufficientDisk as exc:
            log.error("cannot build step %d: %s", step, exc)
            self._starting.discard(step)
            return
        except BaseException:
            self._starting.discard(step)
            raise
        if checkpoint is None:
            await self._fetch_in_full(signed, envelope)
            return
        self._starting.discard(step)
        self.provider.provide_manifest(step)
        self._completed(checkpoint)

    async def _fetch_adapter_base(self, ref: DeltaRef) -> None:
        """Fetch the frozen base an adapter applies to (a joiner holds none) in full, once; the
        steps after it then arrive as adapters."""
        await trio.lowlevel.checkpoint()  # let the step that named it register first, so the base counts as pinned
        if ref.base_step in self.store.checkpoints or ref.base_step in self._starting:
            return
        found = await self.deltas.base_manifest(ref)
        if found is not None:
            log.info("fetching step %d, the frozen base of the run's adapters", ref.base_step)
            await self._accept(*found)

    async def _fetch_in_full(self, signed: codec.Signed[CheckpointManifest], envelope: bytes) -> None:
        """Begin the step's partial checkpoint and fetch every shard (the caller put it in ``_starting``)."""
        manifest = signed.message
        try:
            checkpoint = await trio.to_thread.run_sync(self.store.begin, signed, envelope)
        except InsufficientDisk as exc:
            log.error("cannot fetch: %s", exc)
            return
        finally:
            self._starting.discard(manifest.step)
        log.info("fetching step %d: %d bytes in %d shards", manifest.step, manifest.total_size, manifest.shard_count)
        self.retain()
        if manifest.step in self.store.checkpoints:
            self.provider.provide_manifest(manifest.step)
            assert self._nursery is not None
            await self._nursery.start(self._fetch, checkpoint)

    async def _fetch(self, checkpoint: Checkpoint,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        step = checkpoint.step
        with trio.CancelScope() as scope:
            self._fetches[step] = scope
            task_status.started()
            self.progress.start(step, checkpoint.manifest.total_size,
                                checkpoint.verified_count * checkpoint.manifest.shard_size)
            fetch = CheckpointFetch(checkpoint, self.store, self.book, self.client, self.config, self.node.scores,
                                    self, self.node.peer_id, self.trainer or "", self.provider.providers_of(step),
                                    streams=self.streams)
            try:
                await fetch.run()
            finally:
                self.progress.finish(step, checkpoint.complete)
                self._fetches.pop(step, None)
            log.info("step %d verified and complete (%d shards)", step, checkpoint.manifest.shard_count)
            self._completed(checkpoint)

    # ---- completion and retention -------------------------------------------------------------

    def _completed(self, checkpoint: Checkpoint) -> None:
        """A step became complete here: serve and provide it, retain, advertise the newest."""
        self.provider.provide_shards(checkpoint)
        self.retain()
        newest = self.store.newest_complete()
        if newest is not None:
            self.node.update_advert(policy_step=newest.step)
        self.status_file.mark_dirty()
        self._wake_completion_waiters()
        if self.copies is not None:
            self.copies.after_completion()

    def published(self, checkpoint: Checkpoint) -> None:
        """The publisher holds ``checkpoint`` complete and gossiped it: provide it, wake the waiters."""
        self.provider.provide_held(checkpoint)
        self.status_file.mark_dirty()
        self._wake_completion_waiters()

    def _wake_completion_waiters(self) -> None:
        self._newly_complete.set()
        self._newly_complete = trio.Event()

    async def wait_complete_after(self, step: int) -> Checkpoint:
        """The newest complete checkpoint, once one newer than ``step`` is held here (fetched,
        built from a delta or published): woken by each completion, never polled."""
        while (newest := self.store.newest_complete()) is None or newest.step <= step:
            await self._newly_complete.wait()
        return newest

    def retain(self) -> None:
        """Keep the newest ``keep_steps`` steps (complete or not): cancel and delete the rest."""
        pinned = self._adapter_bases()
        steps = sorted(step for step in self.store.checkpoints if step not in pinned)
        for step in steps[: max(0, len(steps) - self.config.keep_steps)]:
            scope = self._fetches.pop(step, None)
            if scope is not None:
                scope.cancel()
        for step in self.store.prune(self.config.keep_steps, pinned):
            log.info("dropped step %d (keeping the newest %d)", step, self.config.keep_steps)

    def pin_adapter_base(self, step: int) -> None:
        """The publisher's adapter applies to ``step``: keep it however old."""
        self._adapter_base = step

    def _adapter_bases(self) -> frozenset[int]:
        """The frozen bases that adapters apply to, kept however old: those of the steps held, and
        the newest one seen (steps that shipped as sparse deltas in between name none)."""
        held = {c.manifest.delta.base_step for c in self.store.held()
                if c.manifest.delta is not None and c.manifest.delta.format == LORA_FORMAT}
        return frozenset(held if self._adapter_base is None else {*held, self._adapter_base})

    # ---- fetch events (called by CheckpointFetch) -------------------------------------------

    def verified(self, checkpoint: Checkpoint, shard: int, peer_id: str, nbytes: int) -> None:
        self.counters["fetched_bytes"] += nbytes
        self.counters["fetched_shards"] += 1
        self.node.connections.mark_proven(peer_id)  # served a verified shard
        self.progress.advance(checkpoint.step, nbytes, peer_id)
        self.status_file.mark_dirty()

    def bad_shard(self, checkpoint: Checkpoint, shard: int, peer_id: str, digest: bytes) -> None:
        self.counters["bad_shards"] += 1
        complaint = self.complaints.against(checkpoint, shard, peer_id, digest)
        assert self._nursery is not None
        self._nursery.start_soon(self.complaints.publish, complaint)
        self.status_file.mark_dirty()

    # ---- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return shard_status(self)


def _listen_host(listen: list[str]) -> str:
    """The HTTP server listens where libp2p does (127.0.0.1 in tests, 0.0.0.0 in production)."""
    for addr in listen:
        match = re.fullmatch(r"/ip4/([0-9.]+)/tcp/[0-9]+", addr)
        if match:
            return match[1]
    return "0.0.0.0"
