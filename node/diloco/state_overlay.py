"""A DiLoCo peer's global state through the shard overlay: published after every outer step,
fetched by a joiner from the state most live members vouch for (specs/diloco.md section 2).

Why the overlay and not hivemind's state download: hivemind hands a joiner whatever the first
peer that answers serves, checked only against that peer's own claim. Here each member serves its
state as an overlay checkpoint (``state_file``: the same bytes on every honest peer), under a
manifest it signs with its node key whose step is the round. A joiner asks every live allowlisted
member for its manifest of the newest round, counts the checkpoint hashes (which name the state
file's exact bytes, state hash included), and fetches only a hash that more than half of the
members it asked vouch for, shard by verified shard from those members only. One lying member
(or any minority) can withhold its vote or vote for another hash, never make a joiner take it.

The overlay's parts are used as they are: ``ShardStore`` (one directory per round), ``ShardServer``
(seed mode: a member hands each shard out once and lets the others pass it on), ``ShardClient``,
``CheckpointFetch`` (rarest shard first, each shard hashed against the signed manifest, a bad one
charged and its server dropped). Only the authorization differs from the trainer's checkpoints:
a state manifest must be signed by the member that serves it, and that member must be allowlisted.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.outer import GlobalState
from intellect_node.node.diloco.state_file import StateFileError, check_manifest, read_state_file, write_state_file
from intellect_node.node.shards.checkpoint import build_manifest
from intellect_node.node.shards.client import Endpoint, HttpStatus, ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.fetcher import CheckpointFetch, PeerBook, PeerRecord
from intellect_node.node.shards.server import ShardServer
from intellect_node.node.shards.store import Checkpoint, InsufficientDisk, ShardStore
from intellect_node.node.swarm.host import dialable_hosts
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec, overlay_routes
from intellect_node.protocol.errors import InvalidValue, Rejected
from intellect_node.protocol.manifest import CheckpointManifest, UnauthorizedSigner

log = logging.getLogger(__name__)
SHARD_SIZE = 4 << 20  # a tiny model's state is one shard; a 7B one (56 GB) about 13,000
MANIFEST_LIFETIME_S = 86400.0
ROUNDS_KEPT = 2  # the newest and the one before: a joiner asking mid-boundary still finds a majority
ROUNDS_TRIED = 2  # a joiner tries the newest round any member names, then the one before


class StateOverlay:
    """This peer's state server and a joiner's majority fetch, over one run's DiLoCo states."""

    def __init__(self, root: Path, run_id: str, identity: Identity, scores: PeerScores, layout: Layout,
                 allowlist: frozenset[str], shard_size: int = SHARD_SIZE, run_digest: bytes | None = None) -> None:
        shutil.rmtree(root, ignore_errors=True)  # states of an earlier life: the peer publishes its own on start
        self.run_id, self.identity, self.scores, self.layout = run_id, identity, scores, layout
        self.run_digest = layout.digest() if run_digest is None else run_digest  # Layout.run_digest
        self.allowlist = allowlist
        self.config = ShardConfig(data_dir=root, shard_size=shard_size, keep_steps=ROUNDS_KEPT)
        self.served = ShardStore(root / "served", run_id)  # only states this peer signed
        self.fetched = ShardStore(root / "fetched", run_id)  # a joiner's fetch in progress
        self.server = ShardServer(self.served, self.config, identity.peer_id, scores)
        self.client = ShardClient(identity, self.config.stall_s)
        self.counters: Counter[str] = Counter()

    async def serve(self, host: str, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve this peer's states on ``host`` until cancelled; reports the advert address
        (``adverts``), with a dialable address in place of 0.0.0.0."""
        async with trio.open_nursery() as nursery:
            port = await nursery.start(self.server.serve, host, 0)
            task_status.started(f"/ip4/{dialable_hosts(host)[0]}/tcp/{port}/http/diloco-state")

    # ---- publishing ------------------------------------------------------------------------

    async def publish(self, state: GlobalState, digest: bytes) -> None:
        """Serve ``state`` (hash ``digest``) as this round's checkpoint, under a manifest this node
        signs; a state adopted at a round already served replaces it."""
        round_ = state.round
        staged = self.served.staging_path(round_)
        await trio.to_thread.run_sync(write_state_file, state, digest, self.run_digest, staged)
        manifest = await trio.to_thread.run_sync(lambda: build_manifest(
            staged, run_id=self.run_id, step=round_, parent_step=None, shard_size=self.config.shard_size))
        envelope = codec.encode(manifest, self.identity, lifetime_s=MANIFEST_LIFETIME_S)
        await trio.to_thread.run_sync(self.served.add_published, staged, codec.decode(envelope, CheckpointManifest),
                                      envelope)
        self.served.prune(ROUNDS_KEPT)
        self.counters["published"] += 1

    # ---- a joiner's fetch ------------------------------------------------------------------

    async def fetch_majority(self, members: Sequence[Endpoint], timeout_s: float, own_round: int = -1,
                             diverged: bool = False) -> tuple[GlobalState, bytes] | None:
        """The newest state after ``own_round`` that more than half of ``members`` (the live ones, as
        their adverts name them; allowlist outsiders and banned peers are dropped first) serve with
        the same checkpoint hash, fetched from them and checked; None when there is no such state.
        ``diverged``: this peer's state of ``own_round`` disagrees with its group's; that round is
        then tried too, and the state this peer serves for it is one vote (``choose``)."""
        held = self.served.checkpoints.get(own_round)
        own_hash = held.manifest.checkpoint_hash if diverged and held is not None else None
        asked = {m.peer_id: m for m in members if m.peer_id != self.identity.peer_id
                 and (not self.allowlist or m.peer_id in self.allowlist) and not self.scores.is_banned(m.peer_id)}
        if not asked:
            return None
        with trio.move_on_after(timeout_s):
            newest = await self._manifests(asked, None)
            steps = [signed.message.step for signed, _ in newest.values()]

            def reachable(r: int) -> bool:
                """Enough members are at r or beyond to vouch for r (liars naming far-off rounds
                cannot use up the joiner's tries)."""
                mine = r == own_round and own_hash is not None
                return (r > own_round or mine) and 2 * (sum(s >= r for s in steps) + mine) > len(asked) + mine

            for round_ in [r for r in sorted(set(steps), reverse=True) if reachable(r)][:ROUNDS_TRIED]:
                votes = {p: v for p, v in newest.items() if v[0].message.step == round_}
                later = {p: asked[p] for p, v in newest.items() if v[0].message.step > round_}
                votes |= await self._manifests(later, round_)
                own = (self.identity.peer_id, own_hash) if round_ == own_round and own_hash is not None else None
                chosen = choose({p: signed.message.checkpoint_hash for p, (signed, _) in votes.items()}, len(asked),
                                own)
                if chosen is None:
                    self.counters["no_majority"] += 1
                    log.info("round %d: no state hash vouched for by a majority of %d member(s)", round_, len(asked))
                    continue
                holders = [asked[p] for p, (signed, _) in votes.items() if signed.message.checkpoint_hash == chosen]
                signed, envelope = votes[holders[0].peer_id]
                return await self._fetch(signed, envelope, holders)
            return None
        self.counters["fetch_timeouts"] += 1
        log.info("no majority state fetched within %g s", timeout_s)
        return None

    async def _manifests(self, peers: dict[str, Endpoint], round_: int | None
                         ) -> dict[str, tuple[codec.Signed[CheckpointManifest], bytes]]:
        """Each peer's signed manifest of ``round_`` (None: its newest), checked; refusals charged."""
        found: dict[str, tuple[codec.Signed[CheckpointManifest], bytes]] = {}

        async def ask(endpoint: Endpoint) -> None:
            try:
                envelope = await self.client.get(endpoint, overlay_routes.target(self.run_id, "manifest", round_),
                                                 limit=CheckpointManifest.MAX_SIZE)
                signed = codec.decode(envelope, CheckpointManifest)
                self._authorize(signed, endpoint.peer_id, round_)
            except Rejected as exc:
                self.scores.reject(endpoint.peer_id, exc.reason, f"diloco state manifest: {exc}")
                self.counters["manifests_refused"] += 1
                return
            except (HttpStatus, OSError) as exc:  # not serving that round (yet), or gone: no vote
                log.debug("state manifest from %s: %s", endpoint.peer_id, exc)
                return
            found[endpoint.peer_id] = (signed, envelope)

        async with trio.open_nursery() as nursery:
            for endpoint in peers.values():
                nursery.start_soon(ask, endpoint)
        return found

    def _authorize(self, signed: codec.Signed[CheckpointManifest], server: str, round_: int | None) -> None:
        manifest = signed.message
        if signed.signer_peer_id != server:
            raise UnauthorizedSigner("a state manifest must be signed by the member that serves it")
        if manifest.run_id != self.run_id:
            raise InvalidValue(f"state manifest for run {manifest.run_id!r}")
        if round_ is not None and manifest.step != round_:
            raise InvalidValue(f"asked for round {round_}, got a manifest of round {manifest.step}")
        try:
            check_manifest(manifest, self.layout)
        except StateFileError as exc:
            raise InvalidValue(str(exc)) from None

    async def _fetch(self, signed: codec.Signed[CheckpointManifest], envelope: bytes,
                     holders: list[Endpoint]) -> tuple[GlobalState, bytes] | None:
        """The chosen state, shard by verified shard from the members that vouched for it."""
        manifest = signed.message
        book = PeerBook()
        for endpoint in holders:
            book.peers[endpoint.peer_id] = PeerRecord(endpoint)
        self.fetched.prune(0)
        try:
            checkpoint = await trio.to_thread.run_sync(self.fetched.begin, signed, envelope)
        except (InsufficientDisk, OSError) as exc:
            log.error("cannot fetch the round-%d state: %s", manifest.step, exc)
            return None

        async def no_providers(shard: int) -> list[str]:
            return []

        try:
            await CheckpointFetch(checkpoint, self.fetched, book, self.client, self.config, self.scores, self,
                                  self.identity.peer_id, "", no_providers).run()
            state, digest = await trio.to_thread.run_sync(read_state_file, checkpoint.data_path, manifest, self.layout,
                                                          self.run_digest)
        except StateFileError as exc:  # a majority signed bytes that are not a state: nobody to believe
            self.counters["states_refused"] += 1
            log.warning("the majority's round-%d state refused: %s", manifest.step, exc)
            return None
        finally:
            self.fetched.prune(0)
        self.counters["states_fetched"] += 1
        log.info("fetched the round-%d state %s vouched for by %d member(s)", state.round, digest.hex()[:12],
                 len(holders))
        return state, digest

    # ---- FetchEvents -----------------------------------------------------------------------

    def verified(self, checkpoint: Checkpoint, shard: int, peer_id: str, nbytes: int) -> None:
        self.counters["fetched_bytes"] += nbytes

    def bad_shard(self, checkpoint: Checkpoint, shard: int, peer_id: str, digest: bytes) -> None:
        self.counters["bad_shards"] += 1  # the fetcher charged the peer and dropped it for this state
        log.warning("member %s served a bad shard %d of the round-%d state", peer_id, shard, checkpoint.step)


def choose(votes: Mapping[str, bytes], members: int, own: tuple[str, bytes] | None = None) -> bytes | None:
    """The checkpoint hash to fetch: the one more than half of the ``members`` asked vouch for
    (``votes``: member -> hash; a member that did not answer counts against every hash), or None.

    ``own`` (this peer's id and hash, when it diverged at this round) is one more vote, and a state
    it already holds is never fetched. Two members that each diverged alone would otherwise take
    each other's state at once and still differ; so when this peer's hash and one other tie at
    exactly half of the votes, the side whose smallest voucher id is larger moves (the rule that
    merges split hivemind swarms). A joiner never casts a vote, so for it a tie is no majority:
    one liar against one honest member feeds it nothing."""
    tally = Counter(votes.values())
    total = members + (own is not None)
    if own is not None:
        tally[own[1]] += 1
    if not tally:
        return None
    best = max(tally.values())
    leaders = [h for h, n in tally.items() if n == best]
    if 2 * best > total and len(leaders) == 1:
        chosen = leaders[0]
    elif own is not None and 2 * best == total and len(leaders) == 2 and own[1] in leaders:
        other = next(h for h in leaders if h != own[1])
        chosen = other if own[0] > min(p for p, h in votes.items() if h == other) else own[1]
    else:
        return None
    return None if own is not None and chosen == own[1] else chosen
