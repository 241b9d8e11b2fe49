"""Discovery: members that advertise a newer step than any held here, and their manifests.

Gossip may miss a node (it joined late, or its queue was full); every member's advert carries
the newest step it holds complete (``policy_step``) and its shard server's address. Every
``discovery_s`` ``StepDiscovery`` learns those addresses into the peer book, and asks the member
advertising the newest step past this node's for its manifest (over HTTP, else over a libp2p
connection held to it), which the service then accepts like one heard on gossip.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from intellect_node.node.shards.client import HttpStatus, ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.fetcher import PeerBook, http_endpoint
from intellect_node.node.shards.store import ManifestDecoder, ShardStore
from intellect_node.node.shards.stream_client import ShardStreamClient
from intellect_node.node.swarm.streams import connection_path
from intellect_node.protocol import codec, overlay_routes
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.manifest import CheckpointManifest

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)

Accept = Callable[[codec.Signed[CheckpointManifest], bytes], Awaitable[None]]


class StepDiscovery:
    def __init__(self, node: NodeContext, config: ShardConfig, store: ShardStore, book: PeerBook,
                 client: ShardClient, streams: ShardStreamClient, *, trainer: str | None,
                 decode_manifest: ManifestDecoder, accept: Accept) -> None:
        self.node, self.config, self.store, self.book = node, config, store, book
        self.client, self.streams, self.trainer = client, streams, trainer
        self.decode_manifest, self.accept = decode_manifest, accept
        self.run_id = node.config.run_id

    async def run(self) -> None:
        while True:
            known = max(self.store.checkpoints, default=-1)
            newer = []
            for member in self.node.view.members():
                advert = member.advert
                if advert.peer_id == self.node.peer_id:
                    continue
                self.book.learn(advert.peer_id, advert.addrs)
                if advert.policy_step is not None and advert.policy_step > known:
                    newer.append(advert)
            if newer and self.trainer is not None:
                best = max(newer, key=lambda a: a.policy_step or 0)
                await self._manifest_from(best.peer_id, best.addrs)
            await trio.sleep(self.config.discovery_s)

    async def _manifest_from(self, peer_id: str, addrs: tuple[str, ...]) -> None:
        """The newest manifest ``peer_id`` holds: over HTTP, else over a libp2p connection we hold."""
        endpoint = http_endpoint(peer_id, addrs)
        if self.node.scores.is_banned(peer_id):
            return
        target = overlay_routes.target(self.run_id, "manifest")
        try:
            if endpoint is not None:
                envelope = await self.client.get(endpoint, target, limit=CheckpointManifest.MAX_SIZE)
            elif connection_path(self.node.host, peer_id) is not None:
                envelope = await self.streams.get(peer_id, target, limit=CheckpointManifest.MAX_SIZE)
            else:
                return
            signed = self.decode_manifest(envelope)
        except Rejected as exc:
            self.node.scores.reject(peer_id, exc.reason, f"manifest from a shard server: {exc}")
            return
        except (HttpStatus, OSError) as exc:
            log.debug("manifest from %s: %s", peer_id, exc)
            return
        await self.accept(signed, envelope)
