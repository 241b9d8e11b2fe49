"""The trainer's side of the overlay: each checkpoint it drops becomes a signed, held, gossiped step.

The trainer role writes ``step-<N>.safetensors`` (and, training LoRA, the adapter
``step-<N>.base-<B>.lora`` before it) into ``publish_dir``. ``CheckpointPublisher`` stages the
file in the store, builds and signs its manifest, naming the smaller of the adapter and the
sparse delta from the parent step where either pays (specs/deltas.md), holds it complete, and
gossips the manifest; it repeats the newest for late joiners every ``reannounce_s``. What the
service does with a published step (retain, provide, wake the waiters) it does through
``PublishEvents``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from intellect_node.crypto.envelope import now_ms
from intellect_node.node.shards.checkpoint import CheckpointFormatError, build_manifest
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.deltas import adapter_delta, make_delta
from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue
from intellect_node.protocol.manifest import CheckpointManifest, DeltaRef

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
PUBLISHED_FILE = re.compile(r"step-(\d{1,12})\.safetensors")
ADAPTER_FILE = re.compile(r"step-(\d{1,12})\.base-(\d{1,12})\.lora")  # the trainer's adapter beside it
PUBLISH_POLL_S = 0.1


class PublishEvents(Protocol):
    def decode_manifest(self, envelope: bytes) -> codec.Signed[CheckpointManifest]: ...

    def retain(self) -> None: ...

    def pin_adapter_base(self, step: int) -> None: ...

    def published(self, checkpoint: Checkpoint) -> None: ...


class CheckpointPublisher:
    def __init__(self, node: NodeContext, config: ShardConfig, store: ShardStore, counters: dict[str, Any],
                 events: PublishEvents) -> None:
        assert config.publish_dir is not None
        self.node, self.config, self.store, self.counters, self.events = node, config, store, counters, events
        self.publish_dir = config.publish_dir
        self.run_id = node.config.run_id

    async def run(self) -> None:
        """Publish each new step-<N>.safetensors in publish_dir; repeat the newest for late joiners."""
        self.publish_dir.mkdir(parents=True, exist_ok=True)
        last_announce = trio.current_time()
        while True:
            newest = max(self.store.checkpoints, default=-1)
            for step, path in sorted(self._published_files()):
                if step > newest:
                    await self._publish(path, step, parent=newest if newest >= 0 else None)
                    newest = step
                    last_announce = trio.current_time()
                else:
                    log.warning("ignoring %s: step %d is not after the newest step %d", path.name, step, newest)
                    path.unlink(missing_ok=True)
            if newest >= 0 and trio.current_time() - last_announce >= self.config.reannounce_s:
                await self._announce(self.store.checkpoints[newest])
                last_announce = trio.current_time()
            await trio.sleep(PUBLISH_POLL_S)

    def _published_files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.publish_dir.iterdir():
            match = PUBLISHED_FILE.fullmatch(path.name)
            if match and path.is_file() and not path.is_symlink():
                found.append((int(match[1]), path))
        return found

    def _take_adapter(self, step: int) -> tuple[int, bytes] | None:
        """The adapter body the trainer wrote as ``step-<N>.base-<B>.lora`` before handing over
        ``step-<N>.safetensors`` (read and removed), with its base step B."""
        found = None
        for path in self.publish_dir.glob(f"step-{step}.base-*.lora"):
            match = ADAPTER_FILE.fullmatch(path.name)
            if match and int(match[1]) == step and path.is_file() and not path.is_symlink():
                found = (int(match[2]), path.read_bytes())
            path.unlink(missing_ok=True)
        return found

    async def _publish(self, path: Path, step: int, parent: int | None) -> None:
        staged = self.store.staging_path(step)
        await trio.to_thread.run_sync(shutil.move, path, staged)
        try:
            manifest = await trio.to_thread.run_sync(lambda: build_manifest(
                staged, run_id=self.run_id, step=step, parent_step=parent, shard_size=self.config.shard_size))
        except (CheckpointFormatError, InvalidValue) as exc:
            log.error("cannot publish %s: %s", path.name, exc)
            staged.unlink(missing_ok=True)
            return
        delta = await self._delta_for(manifest, staged)
        if delta is not None:
            manifest = dataclasses.replace(manifest, delta=delta[0])
        envelope = codec.encode(manifest, self.node.identity, lifetime_s=self.config.manifest_lifetime_s)
        checkpoint = self.store.add_published(staged, self.events.decode_manifest(envelope), envelope,
                                              delta=delta[1] if delta is not None else None)
        self.events.retain()
        self.node.update_advert(policy_step=step)
        log.info("published step %d: %d bytes in %d shards, checkpoint %s", step, manifest.total_size,
                 manifest.shard_count, manifest.checkpoint_hash.hex()[:16])
        await self._announce(checkpoint)
        self.events.published(checkpoint)

    async def _delta_for(self, manifest: CheckpointManifest, staged: Path) -> tuple[DeltaRef, bytes] | None:
        """The smaller of the trainer's adapter (if it wrote one beside the checkpoint) and the
        sparse delta from the parent step, where either pays (specs/deltas.md). At LoRA's small
        learning rates the merged policy's own sparse delta is often smaller than the adapter
        (bench/deltas.py: about 0.2 MB against 1.8 MB a step on SmolLM2-135M); where it is not,
        its encoding stops as soon as it cannot win (it took 2-3 s of the origin's time before the
        step went out in bench/delta_broadcast.py, deflating 27 MB to learn it was 20 MB)."""
        options: list[tuple[DeltaRef, bytes]] = []
        adapter = await trio.to_thread.run_sync(self._take_adapter, manifest.step)
        if adapter is not None:
            base_step, body = adapter
            base = self.store.checkpoints.get(base_step)
            ref = adapter_delta(base, body, manifest) if base is not None and base.complete else None
            if ref is not None and manifest.parent_step is not None and base_step <= manifest.parent_step:
                options.append((ref, body))
                self.events.pin_adapter_base(base_step)
            else:
                log.warning("step %d: its adapter's base step %d is not held complete here", manifest.step, base_step)
        parent = self.store.checkpoints.get(manifest.parent_step) if manifest.parent_step is not None else None
        if parent is not None and parent.complete and self.config.max_delta_fraction > 0:
            smaller_than = options[0][0].size if options else None  # the adapter wins a tie
            delta = await trio.to_thread.run_sync(make_delta, parent, staged, manifest, self.config.max_delta_fraction,
                                                  smaller_than)
            if delta is not None:
                options.append(delta)
        if not options:
            return None
        chosen = min(options, key=lambda option: option[0].size)
        self.counters["published_delta_bytes"] = chosen[0].size
        log.info("step %d ships as a %d-byte %s delta on step %d (%.4f of the checkpoint)", manifest.step,
                 chosen[0].size, chosen[0].format, chosen[0].base_step, chosen[0].size / manifest.total_size)
        return chosen

    async def _announce(self, checkpoint: Checkpoint) -> None:
        """Gossip ``checkpoint``'s manifest: the envelope held, while more than half its lifetime is
        left. Workers bind every batch to sha256(envelope) and holders keep the longest-lasting copy,
        so a fresh signature at each re-announcement would leave validators unable to place any
        batch begun before it: on a real model a batch takes longer than ``reannounce_s``."""
        try:
            if checkpoint.envelope_expiry_ms() - now_ms() > self.config.manifest_lifetime_s * 500:
                await self.node.publish_announcement(checkpoint.envelope)
                return
            envelope = await self.node.announce(checkpoint.manifest, lifetime_s=self.config.manifest_lifetime_s)
        except Exception as exc:  # no gossip peers yet: discovery and the next re-announcement cover it
            log.info("announcing step %d failed: %s", checkpoint.step, exc)
            return
        self.store.replace_envelope(checkpoint, envelope)
