"""Following by deltas (specs/deltas.md): a step built from a base held here and a small body.

A manifest whose delta applies to a step held complete here is not fetched shard by shard:
``DeltaFollower.build`` gets the delta body (megabytes, not the checkpoint) from a member that
holds the step, checks it against the signed manifest, builds the step from the base and checks
every shard hash. ``None`` tells the service to fetch the step in full instead. A joiner that
holds no base for the run's adapters gets the base's manifest from a holder with
``base_manifest``, accepted only if it is the checkpoint the adapter names.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

import trio

from intellect_node.node.shards.client import HttpStatus, ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.copy_ahead import CopyAhead
from intellect_node.node.shards.deltas import DeltaFailed, build_from_delta
from intellect_node.node.shards.fetcher import http_endpoint
from intellect_node.node.shards.store import Checkpoint, ManifestDecoder, ShardStore
from intellect_node.node.shards.stream_client import ShardStreamClient
from intellect_node.node.swarm.streams import connection_path
from intellect_node.protocol import codec, overlay_routes
from intellect_node.protocol.deltas import delta_hash
from intellect_node.protocol.errors import MalformedBody, Rejected
from intellect_node.protocol.manifest import CheckpointManifest, DeltaRef

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)


class DeltaFollower:
    def __init__(self, node: NodeContext, config: ShardConfig, store: ShardStore, client: ShardClient,
                 streams: ShardStreamClient, counters: dict[str, Any], decode_manifest: ManifestDecoder,
                 trainer: str | None, copies: CopyAhead | None = None) -> None:
        self.node, self.config, self.store, self.client, self.streams = node, config, store, client, streams
        self.copies = copies  # the base copied ahead (specs/deltas.md 5a); None on the publisher
        self.counters, self.decode_manifest, self.trainer = counters, decode_manifest, trainer
        self.run_id = node.config.run_id

    async def build(self, signed: codec.Signed[CheckpointManifest], envelope: bytes,
                    base: Checkpoint) -> Checkpoint | None:
        """The step, complete, from ``base`` and its delta; None where that fails (fetch it in full).
        ``InsufficientDisk`` passes through: the full fetch would not fit either."""
        manifest = signed.message
        body = await self._fetch_delta(manifest)
        if body is None:
            self.counters["delta_unavailable"] += 1
            return None
        if self.copies is not None:
            await self.copies.settled(base)
        try:
            checkpoint = await trio.to_thread.run_sync(build_from_delta, self.store, signed, envelope, base, body)
        except DeltaFailed as exc:
            self.counters[exc.reason] += 1
            log.warning("%s; fetching step %d in full", exc, manifest.step)
            return None
        except OSError as exc:  # a disk error while building: the full fetch may still fit
            log.warning("building step %d from its delta failed (%s); fetching it in full", manifest.step, exc)
            return None
        checkpoint.bump()  # built in a worker thread: waiters are woken here, on trio's thread
        self.counters["delta_steps"] += 1
        self.counters["delta_bytes"] += len(body)
        self.counters["delta_copied_ahead"] += checkpoint.on_copy_ahead
        return checkpoint

    async def base_manifest(self, ref: DeltaRef) -> tuple[codec.Signed[CheckpointManifest], bytes] | None:
        """The manifest of the frozen base an adapter applies to (a joiner holds none), from the
        first holder that answers with the checkpoint ``ref`` names."""
        target = overlay_routes.target(self.run_id, "manifest", ref.base_step)
        for peer_id, addrs in self._holders(ref.base_step):
            try:
                envelope = await self._get_whole(peer_id, addrs, target, CheckpointManifest.MAX_SIZE)
                if envelope is None:
                    continue
                signed = self.decode_manifest(envelope)
            except Rejected as exc:
                self.node.scores.reject(peer_id, exc.reason, f"adapter base manifest: {exc}")
                continue
            except (HttpStatus, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                log.debug("adapter base manifest from %s: %s", peer_id, exc)
                continue
            if signed.message.step != ref.base_step or signed.message.checkpoint_hash != ref.base_hash:
                log.warning("peer %s answered step %d's manifest with another checkpoint", peer_id, ref.base_step)
                continue
            return signed, envelope
        return None

    def _holders(self, step: int) -> list[tuple[str, tuple[str, ...]]]:
        """Who may hold ``step``'s delta: members at that step or later (shuffled, so followers
        spread over them), then the trainer, which always does."""
        others, trainer = [], []
        for member in self.node.view.members():
            advert = member.advert
            if advert.peer_id == self.node.peer_id or self.node.scores.is_banned(advert.peer_id):
                continue
            if advert.peer_id == self.trainer:
                trainer.append((advert.peer_id, advert.addrs))
            elif advert.policy_step is not None and advert.policy_step >= step:
                others.append((advert.peer_id, advert.addrs))
        random.shuffle(others)
        return others[:self.config.delta_attempts - 1] + trainer if trainer else others[:self.config.delta_attempts]

    async def _get_whole(self, peer_id: str, addrs: tuple[str, ...], target: str, limit: int) -> bytes | None:
        """A whole body of at most ``limit`` bytes from ``peer_id``: over HTTP where it advertises
        a server, else over a libp2p connection held to it (None: neither), within a bounded time."""
        endpoint = http_endpoint(peer_id, addrs)
        with trio.fail_after(max(self.config.stall_s, 1.0) * 3):
            if endpoint is not None:
                return await self.client.get(endpoint, target, limit=limit)
            if connection_path(self.node.host, peer_id) is not None:
                return await self.streams.get(peer_id, target, limit=limit)
        return None

    async def _fetch_delta(self, manifest: CheckpointManifest) -> bytes | None:
        """The delta body the manifest names, from the first holder whose bytes hash right."""
        ref = manifest.delta
        assert ref is not None
        target = overlay_routes.target(self.run_id, "delta", manifest.step)
        for peer_id, addrs in self._holders(manifest.step):
            try:
                body = await self._get_whole(peer_id, addrs, target, ref.size)
                if body is None:
                    continue
                if len(body) != ref.size:
                    raise MalformedBody(f"{len(body)}-byte delta body, the manifest names {ref.size}")
                if delta_hash(body) != ref.hash:
                    self.counters["bad_deltas"] += 1
                    self.node.scores.reject(peer_id, "bad_delta",
                                            f"delta of step {manifest.step} does not match the signed manifest")
                    continue
                return body
            except Rejected as exc:
                self.node.scores.reject(peer_id, exc.reason, f"delta of step {manifest.step}: {exc}")
            except (HttpStatus, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                log.debug("delta of step %d from %s: %s", manifest.step, peer_id, exc)
        return None
