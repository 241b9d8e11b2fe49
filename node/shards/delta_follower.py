"""Following by deltas (specs/deltas.md): a step built from a base held here and a small body.

A manifest whose delta applies to a step held complete here is not fetched shard by shard:
``DeltaFollower.build`` gets the delta body (megabytes, not the checkpoint) from a member that
holds the step, checks it against the signed manifest, builds the step from the base and checks
every shard hash. ``None`` tells the service to fetch the step in full instead. Each node sends
a body to a few peers only and names them to the rest (a 409, ``delta_relay``): a follower then
takes it from those, and serves its own copy from when it checked it. A joiner that holds no
base for the run's adapters gets the base's manifest from a holder with ``base_manifest``,
accepted only if it is the checkpoint the adapter names.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from intellect_node.node.shards.client import HttpStatus, ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.copy_ahead import CopyAhead
from intellect_node.node.shards.delta_relay import HeldBodies
from intellect_node.node.shards.deltas import DeltaFailed, build_from_delta
from intellect_node.node.shards.fetcher import http_endpoint
from intellect_node.node.shards.server import SEED_HOLD_S, SEED_HOLDERS
from intellect_node.node.shards.store import Checkpoint, ManifestDecoder, ShardStore
from intellect_node.node.shards.stream_client import ShardStreamClient
from intellect_node.node.shards.stream_wire import json_object
from intellect_node.node.swarm.streams import connection_path
from intellect_node.protocol import codec, overlay_routes
from intellect_node.protocol.deltas import delta_hash
from intellect_node.protocol.errors import InvalidValue, MalformedBody, Rejected
from intellect_node.protocol.manifest import CheckpointManifest, DeltaRef
from intellect_node.protocol.messages import PEER_ID_PATTERN

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
RELAY_RETRY_S = (0.1, 1.0)  # after a 409: first pause between rounds, doubling to the last
MAX_NAMED = 4 * SEED_HOLDERS  # holders remembered from the 409s of one step's search


class DeltaFollower:
    def __init__(self, node: NodeContext, config: ShardConfig, store: ShardStore, client: ShardClient,
                 streams: ShardStreamClient, counters: dict[str, Any], decode_manifest: ManifestDecoder,
                 trainer: str | None, copies: CopyAhead | None = None, held: HeldBodies | None = None) -> None:
        self.node, self.config, self.store, self.client, self.streams = node, config, store, client, streams
        self.copies = copies  # the base copied ahead (specs/deltas.md 5a); None on the publisher
        self.held = held if held is not None else HeldBodies()  # served by this node's server meanwhile
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
        try:
            self.held.hold(manifest.step, body)
        except OSError as exc:  # no memory for a memfd: this node just passes it on after its build
            log.warning("cannot hold step %d's delta body to pass it on: %s", manifest.step, exc)
        try:
            if self.copies is not None:
                await self.copies.settled(base)
            checkpoint = await trio.to_thread.run_sync(build_from_delta, self.store, signed, envelope, base, body)
        except DeltaFailed as exc:
            self.counters[exc.reason] += 1
            log.warning("%s; fetching step %d in full", exc, manifest.step)
            return None
        except OSError as exc:  # a disk error while building: the full fetch may still fit
            log.warning("building step %d from its delta failed (%s); fetching it in full", manifest.step, exc)
            return None
        finally:
            self.held.release(manifest.step)
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

    def _holders(self, step: int, trainer_too: bool = True) -> list[tuple[str, tuple[str, ...]]]:
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
        if trainer and trainer_too:
            return others[:self.config.delta_attempts - 1] + trainer
        return others[:self.config.delta_attempts]

    def _named(self, body: bytes) -> list[tuple[str, tuple[str, ...]]]:
        """The holders a 409 names, with their advertised addresses (none where this node has no
        advert: a connection held to it may still carry the request)."""
        data = json_object(body, "a delta 409's body", frozenset({"holders"}))
        holders = data["holders"]
        if (not isinstance(holders, list) or len(holders) > SEED_HOLDERS
                or not all(type(p) is str and re.fullmatch(PEER_ID_PATTERN, p) for p in holders)):
            raise InvalidValue(f"a delta 409 names holders that are not up to {SEED_HOLDERS} peer ids")
        addrs = {m.advert.peer_id: m.advert.addrs for m in self.node.view.members()}
        return [(p, addrs.get(p, ())) for p in holders
                if p not in (self.node.peer_id, self.trainer) and not self.node.scores.is_banned(p)]

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
        """The delta body the manifest names, from the first holder whose bytes hash right; after a
        409 (the trainer's or a member's: each hands out a few copies, then names their holders),
        from the holders named, in rounds until a bounded time (specs/deltas.md section 4)."""
        search = _DeltaSearch(hold_s=max(SEED_HOLD_S, self.config.stall_s))
        pause = RELAY_RETRY_S[0]
        while True:
            body = await self._fetch_round(manifest, search)
            if body is not None:
                return body
            if not search.waiting(trio.current_time()):
                return None  # no 409 to wait out, or waited long enough: the full fetch
            await trio.sleep(pause)
            pause = min(pause * 2, RELAY_RETRY_S[1])

    async def _fetch_round(self, manifest: CheckpointManifest, search: _DeltaSearch) -> bytes | None:
        """One pass over the named holders, the members at the step, then (unless it refused a
        hold ago) the trainer: the first right body, or None."""
        ref = manifest.delta
        assert ref is not None
        target = overlay_routes.target(self.run_id, "delta", manifest.step)
        asked: set[str] = set()
        trainer_too = trio.current_time() >= search.trainer_again
        for peer_id, addrs in search.named + self._holders(manifest.step, trainer_too=trainer_too):
            if peer_id in asked or peer_id in search.wrong:
                continue
            asked.add(peer_id)
            try:
                body = await self._get_whole(peer_id, addrs, target, ref.size)
                if body is None:
                    continue
                if len(body) != ref.size:
                    raise MalformedBody(f"{len(body)}-byte delta body, the manifest names {ref.size}")
                if delta_hash(body) != ref.hash:
                    search.wrong.add(peer_id)
                    self.counters["bad_deltas"] += 1
                    self.node.scores.reject(peer_id, "bad_delta",
                                            f"delta of step {manifest.step} does not match the signed manifest")
                    continue
                if peer_id != self.trainer:
                    self.counters["delta_from_members"] += 1
                return body
            except HttpStatus as exc:
                if exc.status != 409:
                    log.debug("delta of step %d from %s: %s", manifest.step, peer_id, exc)
                    continue
                try:
                    names = self._named(exc.body)
                except Rejected as bad:  # raised here, a sibling clause would not catch it
                    search.wrong.add(peer_id)
                    self.node.scores.reject(peer_id, bad.reason, f"delta of step {manifest.step}: {bad}")
                    continue
                search.refused(peer_id == self.trainer, names, trio.current_time())
            except Rejected as exc:
                search.wrong.add(peer_id)
                self.node.scores.reject(peer_id, exc.reason, f"delta of step {manifest.step}: {exc}")
            except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                log.debug("delta of step %d from %s: %s", manifest.step, peer_id, exc)
        return None


@dataclass
class _DeltaSearch:
    """Where one step's body search stands: the holders 409s named (newest first), the peers that
    sent a wrong body or refusal, when the trainer may be asked again, when to stop waiting."""

    hold_s: float  # the trainer's hold before it sends one more copy (specs/deltas.md section 4)
    named: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    wrong: set[str] = field(default_factory=set)  # not asked again for this step
    trainer_again: float = 0.0
    give_up: float = 0.0  # 0: no 409 yet, nothing to wait for

    def refused(self, by_trainer: bool, names: list[tuple[str, tuple[str, ...]]], now: float) -> None:
        fresh = {peer_id for peer_id, _ in names}
        self.named = (names + [n for n in self.named if n[0] not in fresh])[:MAX_NAMED]
        if by_trainer:
            self.trainer_again = now + self.hold_s
        self.give_up = self.give_up or now + 3 * self.hold_s

    def waiting(self, now: float) -> bool:
        return bool(self.give_up) and now < self.give_up
