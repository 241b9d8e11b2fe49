"""Fetching one checkpoint from the swarm: which shard next, from whom, and what to do when it fails.

Parents are the peers whose have streams (one line per change) show the shard verified. The
scheduler prefers any peer over the origin (the trainer), so the origin uploads about one copy and
the fetchers spread the rest; among peers it takes the rarest shard first and the peer with the
best measured throughput and record. Every shard is hashed while it arrives and compared with the
signed manifest before it is marked: a mismatch discards it, charges the peer (``bad_shard``),
excludes it for this checkpoint and tells the caller (which complains on gossip). A cut, stalled
or refused transfer is retried elsewhere; verified shards are never fetched again.

Transports (``PeerBook.transport``): HTTP to an advertised ``/http`` address, or libp2p streams
over a connection the host holds (a NATed peer advertises no HTTP address, but a hole punch gives
a direct connection). Where both work, the one with the best measured throughput to that peer
(each tried once first). A peer reached only through a relay is used last (only when no other
holder has a shard) and only for ranges a circuit's byte cap can carry.
"""

from __future__ import annotations

import logging
import mmap
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import blake3
import trio

from intellect_node.node.shards.client import Endpoint, HttpStatus, ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.server import unpack_bits
from intellect_node.node.shards.store import Checkpoint, ShardStore
from intellect_node.node.shards.stream_client import ShardStreamClient
from intellect_node.node.shards.stream_wire import json_object
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import overlay_routes
from intellect_node.protocol.errors import InvalidValue, Rejected
from intellect_node.protocol.manifest import BadShard

log = logging.getLogger(__name__)
MAX_WATCHED = 12  # have streams followed per checkpoint: the origin and the best other peers
HAVE_IDLE_S = 25.0  # servers send a heartbeat line every 10 s
REFUSED_S = 3.0  # how long a 409 from the origin keeps a shard off its list (a have change clears it)
BUSY_BACKOFF_S = 0.5
FAILURE_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
PER_PEER_DOWNLOADS = 2
# libp2p: the stream guard lets a peer hold 2 inbound streams of a protocol, one is the have stream
PER_PEER_STREAM_DOWNLOADS = 1
RELAY_MAX_RANGE = 4 << 20  # a circuit carries 16 MiB by default (relay_circuit_bytes): a few shards
MAX_HINTS = 8  # holders taken from one 409 (the server names at most 8)
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
    rates: dict[str, float] = field(default_factory=dict)  # the same, per transport that carried one
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
    """Known shard servers and their records, shared by every checkpoint's fetch.

    ``path_of(peer)``: how the host is connected to it now ("direct", "relayed" or None); without
    one (no libp2p host, e.g. the DiLoCo state overlay) only HTTP is used."""

    def __init__(self, path_of: Callable[[str], str | None] | None = None) -> None:
        self.peers: dict[str, PeerRecord] = {}
        self.path_of = path_of or (lambda peer_id: None)

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

    def transport(self, peer_id: str, nbytes: int = 0) -> str | None:
        """How to fetch ``nbytes`` from ``peer_id`` now: "http", "p2p" (a direct libp2p
        connection), "relay" (a circuit, only if nothing else reaches it and ``nbytes`` fits
        RELAY_MAX_RANGE) or None. Between HTTP and p2p, the better measured rate; an unmeasured
        one first (HTTP before p2p), so each is measured."""
        record = self.peers.get(peer_id)
        if record is None:
            return None
        path = self.path_of(peer_id)
        options = (["http"] if record.endpoint is not None else []) + (["p2p"] if path == "direct" else [])
        if not options:
            return "relay" if path == "relayed" and nbytes <= RELAY_MAX_RANGE else None
        return max(options, key=lambda t: record.rates.get(t, 2e9 - options.index(t)))

    def servable(self, peer_id: str) -> bool:
        return self.transport(peer_id) is not None

    def may_relay(self, peer_id: str) -> bool:
        """False only for a member whose advert says it is behind NAT (no direct address of any
        kind); an unknown peer, or one whose HTTP address is not advertised yet, may relay."""
        record = self.peers.get(peer_id)
        return record is None or not record.private

    def succeeded(self, peer_id: str, nbytes: int, seconds: float, transport: str = "http") -> None:
        record = self.peers[peer_id]
        rate = nbytes / max(seconds, 1e-6)
        record.rate = rate if not record.successes else 0.7 * record.rate + 0.3 * rate
        before = record.rates.get(transport)
        record.rates[transport] = rate if before is None else 0.7 * before + 0.3 * rate
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
                 origin: str, find_providers: Callable[[int], Awaitable[list[str]]],
                 streams: ShardStreamClient | None = None) -> None:
        self.checkpoint, self.store, self.book, self.client = checkpoint, store, book, client
        self.streams = streams  # libp2p streams; None: HTTP only
        self.config, self.scores, self.events = config, scores, events
        self.own_peer_id, self.origin, self.find_providers = own_peer_id, origin, find_providers
        manifest = checkpoint.manifest
        self.target = overlay_routes.target(store.root.name, "checkpoint.safetensors", manifest.step)
        self.have: dict[str, bytearray] = {}
        self.active: dict[int, str] = {}
        self.blocked: set[str] = set()  # served a bad shard of this checkpoint
        self.refused: dict[tuple[str, int], float] = {}
        self.suggested: set[int] = set()
        self.watched: set[str] = set()
        self.providers: set[str] = set()  # found through the DHT's provider records
        self.hinted: set[str] = set()  # holders the origin named in a 409
        self._hint = trio.Event()
        self._wake = trio.Event()
        self._persisting = trio.Lock()

    def _poke(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    async def run(self) -> None:
        mapped = await trio.to_thread.run_sync(self._map_data)
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
        self.checkpoint.bump()

    def _map_data(self) -> mmap.mmap:
        """The checkpoint's data file mapped for writing (opened off the trio loop: a disk may stall)."""
        with open(self.checkpoint.data_path, "r+b") as f:
            return mmap.mmap(f.fileno(), self.checkpoint.manifest.total_size, access=mmap.ACCESS_WRITE)

    # ---- who has what --------------------------------------------------------------------

    async def _watch_peers(self, nursery: trio.Nursery) -> None:
        """Keep have streams open to the origin and the best-ranked other known peers."""
        while True:
            candidates = [p for p in self.book.peers if p != self.own_peer_id and p not in self.watched
                          and self.book.servable(p)
                          and p not in self.blocked and not self.scores.is_banned(p)]
            candidates.sort(key=lambda p: (p != self.origin, p not in self.hinted, p not in self.providers,
                                           -self.book.peers[p].score()))
            # holders the origin named and DHT providers are watched even when every slot is taken
            # by peers that hold nothing yet: in a swarm larger than the slots, a fetcher that
            # watched no holder waited for the origin's seed hold to pass (a copy every 10 s)
            room = max(0, MAX_WATCHED - len(self.watched))
            chosen = candidates[:room]
            extra = max(0, 2 * MAX_WATCHED - len(self.watched) - room)
            chosen += [p for p in candidates[room:] if p in self.hinted or p in self.providers][:extra]
            for peer_id in chosen:
                self.watched.add(peer_id)
                nursery.start_soon(self._watch, peer_id)
            with trio.move_on_after(1.0):
                await self._hint.wait()
            self._hint = trio.Event()

    async def _watch(self, peer_id: str) -> None:
        """Follow ``peer_id``'s have stream, reconnecting while it has not shown every shard."""
        manifest = self.checkpoint.manifest
        target = overlay_routes.target(self.store.root.name, "have", manifest.step)
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
                transport = self._transport(peer_id, 0)
                if transport is None:
                    return  # no longer advertises an address we could open, nor a connection
                max_line = 4096 + manifest.shard_count // 4
                try:
                    if transport == "http":
                        endpoint = self.book.peers[peer_id].endpoint
                        assert endpoint is not None
                        await self.client.follow(endpoint, target, on_line, idle_timeout_s=HAVE_IDLE_S,
                                                 max_line=max_line)
                    else:
                        assert self.streams is not None
                        await self.streams.follow(peer_id, target, on_line, idle_timeout_s=HAVE_IDLE_S,
                                                  max_line=max_line)
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

    def _transport(self, peer_id: str, nbytes: int) -> str | None:
        """The book's choice, less libp2p when this fetch has no stream client."""
        transport = self.book.transport(peer_id, nbytes)
        return transport if transport == "http" or self.streams is not None else None

    def _usable(self, peer_id: str, now: float) -> bool:
        record = self.book.peers.get(peer_id)
        transport = self._transport(peer_id, self.checkpoint.manifest.shard_size)
        cap = PER_PEER_DOWNLOADS if transport == "http" else PER_PEER_STREAM_DOWNLOADS
        return (record is not None and transport is not None
                and peer_id not in self.blocked
                and record.backoff_until <= now
                and not self.scores.is_banned(peer_id)
                and sum(1 for p in self.active.values() if p == peer_id) < cap)

    def _pick(self) -> tuple[int, str] | None:
        now = trio.current_time()
        verified = self.checkpoint.verified
        missing = [i for i in range(len(verified)) if not verified[i] and i not in self.active]
        if not missing:
            return None
        usable = [p for p in self.have if self._usable(p, now)]
        size = self.checkpoint.manifest.shard_size
        direct = [p for p in usable if self._transport(p, size) != "relay"]
        # circuits last: a relay carries a few MiB per circuit, and every relay's bytes are a favour
        return self._pick_among(direct, missing, now) or self._pick_among(usable, missing, now)

    def _pick_among(self, usable: list[str], missing: list[int], now: float) -> tuple[int, str] | None:
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
        transport = self._transport(peer_id, end - start)
        hasher = blake3.blake3()
        began = trio.current_time()
        try:
            if transport is None:  # its advert or connection went between the pick and now
                raise OSError(f"{peer_id} no longer reachable for shard transfers")
            with view[start:end] as dest:  # the shard's place in the mmapped file
                if transport == "http":
                    assert endpoint is not None
                    await self.client.get_range(endpoint, self.target, start, dest, hasher.update)
                else:
                    assert self.streams is not None
                    await self.streams.get_range(peer_id, self.target, start, dest, hasher.update)
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
                self.book.succeeded(peer_id, end - start, trio.current_time() - began, transport or "http")
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
                body = json_object(exc.body, "a 409's body", frozenset({"suggest"}), frozenset({"holders"}))
            except Rejected:  # an older or odd origin: no hints, the 3 s hold still applies
                body = {}
            suggest, holders = body.get("suggest"), body.get("holders")
            self.suggested = {i for i in suggest if type(i) is int} if isinstance(suggest, list) else set()
            if isinstance(holders, list):
                named = {p for p in holders[:MAX_HINTS] if type(p) is str and p in self.book.peers
                         and p != self.own_peer_id}
                if named - self.hinted:
                    self.hinted |= named
                    self._hint.set()
        elif exc.status in (429, 503):
            self.book.peers[peer_id].backoff_until = now + BUSY_BACKOFF_S
        elif exc.status == 404 and peer_id in self.have:
            self.have[peer_id][shard] = 0  # its map was stale
        else:
            self.book.failed(peer_id, now)


def _parse_have(body: bytes, shard_count: int) -> tuple[int, bytearray]:
    """A have line: {"version": int, "shards": int, "verified": hex bits}, nothing else."""
    data = json_object(body, "have line", frozenset({"version", "shards", "verified"}))
    version, shards, verified = data["version"], data["shards"], data["verified"]
    if type(version) is not int or version < 0 or shards != shard_count or type(verified) is not str:
        raise InvalidValue("have line fields out of range")
    try:
        return version, unpack_bits(verified, shard_count)
    except ValueError as exc:
        raise InvalidValue(f"have line bits: {exc}") from None
