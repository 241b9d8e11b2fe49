"""Fetching one checkpoint from the swarm: which shard next, from whom, and what to do when it fails.

Parents are the peers whose have streams (HTTP, one line per change) show the shard verified. The
scheduler prefers any peer over the origin (the trainer), so the origin uploads about one copy and
the fetchers spread the rest; among peers it takes the rarest shard first and the peer with the
best measured throughput and record. Every shard is hashed while it arrives and compared with the
signed manifest before it is marked: a mismatch discards it, charges the peer (``bad_shard``),
excludes it for this checkpoint and tells the caller (which complains on gossip). A cut, stalled
or refused transfer is retried elsewhere; verified shards are never fetched again.
"""

from __future__ import annotations

import json
import logging
import mmap
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import blake3
import trio

from intellect_node.node.shards.client import Endpoint, HttpStatus, ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.server import unpack_bits
from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol.errors import InvalidValue, MalformedBody, Rejected
from intellect_node.protocol.manifest import BadShard

log = logging.getLogger(__name__)
MAX_WATCHED = 12  # have streams followed per checkpoint: the origin and the best other peers
HAVE_IDLE_S = 25.0  # servers send a heartbeat line every 10 s
REFUSED_S = 3.0  # how long a 409 from the origin keeps a shard off its list (a have change clears it)
BUSY_BACKOFF_S = 0.5
FAILURE_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
PER_PEER_DOWNLOADS = 2
PROVIDER_LOOKUP_S = 10.0  # DHT lookups cost CPU on every node they touch; have streams are the fast path
_HTTP_ADDR = re.compile(r"/(?:ip4|dns4)/([A-Za-z0-9.-]{1,253})/tcp/([0-9]{1,5})/http")


def http_endpoint(peer_id: str, addrs: tuple[str, ...] | list[str]) -> Endpoint | None:
    """The first /ip4/<host>/tcp/<port>/http address of an advert, if any."""
    for addr in addrs:
        match = _HTTP_ADDR.fullmatch(addr)
        if match and 0 < int(match[2]) < 65536:
            return Endpoint(peer_id, match[1], int(match[2]))
    return None


@dataclass
class PeerRecord:
    """What this node measured of one peer as a parent, across checkpoints."""

    endpoint: Endpoint | None  # None once its advert names no HTTP address (it turned out private)
    private: bool = False  # its advert names no address at all: behind NAT, it re-serves nothing
    rate: float = 0.0  # bytes/s of good shards, exponentially averaged; 0 until measured
    successes: int = 0
    failures: int = 0  # consecutive
    in_flight: int = 0
    backoff_until: float = 0.0
    complaints: int = 0  # heard about on gossip: hearsay only lowers the rank

    def score(self) -> float:
        """Higher is better: throughput, discounted for failures, complaints and current load."""
        rate = self.rate if self.successes else 2e9  # unmeasured peers get a chance (optimism)
        return rate * 0.5 ** min(self.failures, 10) * 0.5 ** min(self.complaints, 4) / (1 + self.in_flight)


class PeerBook:
    """Known shard servers and their records, shared by every checkpoint's fetch."""

    def __init__(self) -> None:
        self.peers: dict[str, PeerRecord] = {}

    def learn(self, peer_id: str, addrs: tuple[str, ...] | list[str]) -> None:
        """Follow ``peer_id``'s latest advert: a new port after a restart, or no address at all
        once its reachability check found it behind NAT (then it is not asked again). A member
        with no address is recorded too: the origin's seed mode must know it re-serves nothing."""
        endpoint = http_endpoint(peer_id, addrs)
        # private: neither an HTTP address nor a direct libp2p one (a node that has just joined
        # advertises its libp2p addresses before its overlay adds the HTTP one: not private)
        private = endpoint is None and not any("/p2p/" in a and "/p2p-circuit" not in a for a in addrs)
        record = self.peers.get(peer_id)
        if record is None:
            self.peers[peer_id] = PeerRecord(endpoint, private)
        else:
            record.endpoint, record.private = endpoint, private

    def servable(self, peer_id: str) -> bool:
        record = self.peers.get(peer_id)
        return record is not None and record.endpoint is not None

    def may_relay(self, peer_id: str) -> bool:
        """False only for a member whose advert says it is behind NAT (no direct address of any
        kind); an unknown peer, or one whose HTTP address is not advertised yet, may relay."""
        record = self.peers.get(peer_id)
        return record is None or not record.private

    def succeeded(self, peer_id: str, nbytes: int, seconds: float) -> None:
        record = self.peers[peer_id]
        rate = nbytes / max(seconds, 1e-6)
        record.rate = rate if not record.successes else 0.7 * record.rate + 0.3 * rate
        record.successes += 1
        record.failures = 0

    def failed(self, peer_id: str, now: float) -> None:
        record = self.peers[peer_id]
        record.failures += 1
        record.backoff_until = now + min(MAX_BACKOFF_S, FAILURE_BACKOFF_S * 2 ** (record.failures - 1))


class FetchEvents(Protocol):
    def verified(self, checkpoint: Checkpoint, shard: int, peer_id: str, nbytes: int) -> None: ...

    def bad_shard(self, checkpoint: Checkpoint, shard: int, peer_id: str, digest: bytes) -> None: ...


class CheckpointFetch:
    """Runs until every shard of ``checkpoint`` is verified, then finalizes it in the store."""

    def __init__(self, checkpoint: Checkpoint, store: ShardStore, book: PeerBook, client: ShardClient,
                 config: ShardConfig, scores: PeerScores, events: FetchEvents, own_peer_id: str,
                 origin: str, find_providers: Callable[[int], Awaitable[list[str]]]) -> None:
        self.checkpoint, self.store, self.book, self.client = checkpoint, store, book, client
        self.config, self.scores, self.events = config, scores, events
        self.own_peer_id, self.origin, self.find_providers = own_peer_id, origin, find_providers
        manifest = checkpoint.manifest
        self.target = f"/ina/v1/{store.root.name}/{manifest.step}/checkpoint.safetensors"
        self.have: dict[str, bytearray] = {}
        self.active: dict[int, str] = {}
        self.blocked: set[str] = set()  # served a bad shard of this checkpoint
        self.refused: dict[tuple[str, int], float] = {}
        self.suggested: set[int] = set()
        self.watched: set[str] = set()
        self.providers: set[str] = set()  # found through the DHT's provider records
        self._wake = trio.Event()
        self._persisting = trio.Lock()

    def _poke(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    async def run(self) -> None:
        with open(self.checkpoint.data_path, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), self.checkpoint.manifest.total_size, access=mmap.ACCESS_WRITE)
        view = memoryview(mapped)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_peers, nursery)
                nursery.start_soon(self._discover_providers)
                await self._schedule(nursery, view)
                nursery.cancel_scope.cancel()
        finally:
            view.release()
            mapped.close()
        await trio.to_thread.run_sync(self.store.finalize, self.checkpoint)

    # ---- who has what --------------------------------------------------------------------

    async def _watch_peers(self, nursery: trio.Nursery) -> None:
        """Keep have streams open to the origin and the best-ranked other known peers."""
        while True:
            candidates = [p for p in self.book.peers if p != self.own_peer_id and p not in self.watched
                          and self.book.servable(p)
                          and p not in self.blocked and not self.scores.is_banned(p)]
            candidates.sort(key=lambda p: (p != self.origin, p not in self.providers, -self.book.peers[p].score()))
            for peer_id in candidates[: max(0, MAX_WATCHED - len(self.watched))]:
                self.watched.add(peer_id)
                nursery.start_soon(self._watch, peer_id)
            await trio.sleep(1.0)

    async def _watch(self, peer_id: str) -> None:
        """Follow ``peer_id``'s have stream, reconnecting while it has not shown every shard."""
        manifest = self.checkpoint.manifest
        target = f"/ina/v1/{self.store.root.name}/{manifest.step}/have"
        complete = False

        def on_line(line: bytes) -> bool:
            nonlocal complete
            if not line.strip():
                return True  # heartbeat
            _, bits = _parse_have(line, manifest.shard_count)
            self.have[peer_id] = bits
            self.refused = {key: t for key, t in self.refused.items() if key[0] != peer_id}
            self._poke()
            complete = all(bits)
            return peer_id not in self.blocked and not complete

        delay = 0.0
        try:
            while peer_id not in self.blocked and not complete:
                await trio.sleep(delay)
                endpoint = self.book.peers[peer_id].endpoint
                if endpoint is None:
                    return  # no longer advertises an address we could open
                try:
                    await self.client.follow(endpoint, target, on_line,
                                             idle_timeout_s=HAVE_IDLE_S, max_line=4096 + manifest.shard_count // 4)
                    delay = 0.5
                except HttpStatus as exc:
                    delay = 0.5 if exc.status == 404 else 2.0  # 404: it has not heard of this step yet
                except Rejected as exc:
                    self.scores.reject(peer_id, exc.reason, f"have stream: {exc}")
                    delay = 5.0
                except OSError:
                    delay = min(max(2 * delay, 1.0), 10.0)  # down or restarting
        finally:
            if not complete:  # a complete peer never changes again: it stays in `watched`
                self.watched.discard(peer_id)

    async def _discover_providers(self) -> None:
        """Provider records find holders our member view missed (large swarms, late adverts)."""
        while True:
            await trio.sleep(PROVIDER_LOOKUP_S)
            missing = [i for i, v in enumerate(self.checkpoint.verified) if not v]
            if not missing:
                return
            self.providers.update(await self.find_providers(random.choice(missing)))

    # ---- scheduling ------------------------------------------------------------------------

    async def _schedule(self, nursery: trio.Nursery, view: memoryview) -> None:
        checkpoint = self.checkpoint
        while checkpoint.verified_count < checkpoint.manifest.shard_count:
            if len(self.active) < self.config.max_downloads:
                choice = self._pick()
                if choice is not None:
                    shard, peer_id = choice
                    self.active[shard] = peer_id
                    self.book.peers[peer_id].in_flight += 1
                    nursery.start_soon(self._download, shard, peer_id, view)
                    continue
            with trio.move_on_after(0.25):
                await self._wake.wait()

    def _usable(self, peer_id: str, now: float) -> bool:
        record = self.book.peers.get(peer_id)
        return (record is not None and record.endpoint is not None and peer_id not in self.blocked
                and record.backoff_until <= now
                and not self.scores.is_banned(peer_id)
                and sum(1 for p in self.active.values() if p == peer_id) < PER_PEER_DOWNLOADS)

    def _pick(self) -> tuple[int, str] | None:
        now = trio.current_time()
        verified = self.checkpoint.verified
        missing = [i for i in range(len(verified)) if not verified[i] and i not in self.active]
        if not missing:
            return None
        usable = [p for p in self.have if self._usable(p, now)]
        relays = [p for p in usable if p != self.origin]
        holders = {i: [p for p in relays if self.have[p][i]] for i in missing}
        available = [i for i in missing if holders[i]]
        if available:
            rarest = min(len(holders[i]) for i in available)
            shard = random.choice([i for i in available if len(holders[i]) == rarest])
            return shard, max(holders[shard], key=lambda p: self.book.peers[p].score())
        if self.origin not in usable:
            return None
        fresh = [i for i in missing if self.have[self.origin][i] and self.refused.get((self.origin, i), 0) <= now]
        if not fresh:
            return None
        preferred = [i for i in fresh if i in self.suggested]
        return random.choice(preferred or fresh), self.origin

    async def _download(self, shard: int, peer_id: str, view: memoryview) -> None:
        manifest = self.checkpoint.manifest
        start, end = manifest.shard_range(shard)
        record = self.book.peers[peer_id]
        endpoint = record.endpoint
        hasher = blake3.blake3()
        began = trio.current_time()
        try:
            if endpoint is None:  # its advert dropped the address between the pick and now
                raise OSError(f"{peer_id} no longer advertises an HTTP address")
            with view[start:end] as dest:  # the shard's place in the mmapped file
                await self.client.get_range(endpoint, self.target, start, dest, hasher.update)
        except HttpStatus as exc:
            self._refused(shard, peer_id, exc)
        except Rejected as exc:
            self.scores.reject(peer_id, exc.reason, f"shard {shard} of step {manifest.step}: {exc}")
            self.book.failed(peer_id, trio.current_time())
        except OSError as exc:
            log.info("shard %d from %s failed: %s", shard, peer_id, exc)
            self.book.failed(peer_id, trio.current_time())
        else:
            digest = hasher.digest()
            if digest != manifest.shard_hashes[shard]:
                self.blocked.add(peer_id)
                self.have.pop(peer_id, None)
                self.scores.reject(peer_id, BadShard.reason, f"shard {shard} of step {manifest.step}: hash mismatch")
                self.events.bad_shard(self.checkpoint, shard, peer_id, digest)
            else:
                self.store.mark_verified(self.checkpoint, shard)
                self.book.succeeded(peer_id, end - start, trio.current_time() - began)
                self.events.verified(self.checkpoint, shard, peer_id, end - start)
                async with self._persisting:  # one writer at a time: the last write holds the newest state
                    await trio.to_thread.run_sync(self.store.persist_verified, self.checkpoint)
        finally:
            del self.active[shard]
            record.in_flight -= 1
            self._poke()

    def _refused(self, shard: int, peer_id: str, exc: HttpStatus) -> None:
        now = trio.current_time()
        if exc.status == 409:  # seed mode: the origin wants this shard taken from a peer
            self.refused[(peer_id, shard)] = now + REFUSED_S
            try:
                suggest = json.loads(exc.body)["suggest"]
                self.suggested = {i for i in suggest if type(i) is int}
            except (ValueError, TypeError, KeyError):
                self.suggested = set()
        elif exc.status in (429, 503):
            self.book.peers[peer_id].backoff_until = now + BUSY_BACKOFF_S
        elif exc.status == 404 and peer_id in self.have:
            self.have[peer_id][shard] = 0  # its map was stale
        else:
            self.book.failed(peer_id, now)


def _parse_have(body: bytes, shard_count: int) -> tuple[int, bytearray]:
    """A have line: {"version": int, "shards": int, "verified": hex bits}, nothing else."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MalformedBody("have line is not JSON") from None
    if not isinstance(data, dict) or set(data) != {"version", "shards", "verified"}:
        raise MalformedBody("have line is not {version, shards, verified}")
    version, shards, verified = data["version"], data["shards"], data["verified"]
    if type(version) is not int or version < 0 or shards != shard_count or type(verified) is not str:
        raise InvalidValue("have line fields out of range")
    try:
        return version, unpack_bits(verified, shard_count)
    except ValueError as exc:
        raise InvalidValue(f"have line bits: {exc}") from None
