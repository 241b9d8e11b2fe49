"""The persistent list of peers this node has seen, so a restart does not need bootstrap peers.

Only addresses taken from verified adverts are stored (never what an unverified peer claims), at
most ``MAX_PEERS``, most recently changed first, written atomically.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from intellect_node.node.config.loader import read_json_bounded
from intellect_node.node.home.durable import write_durably

log = logging.getLogger(__name__)

MAX_PEERS = 64
MAX_CACHE_BYTES = 1 << 20  # MAX_PEERS peers of up to 16 addresses are far below this


class PeerCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._addrs: dict[str, list[str]] = {}  # peer id -> multiaddrs with /p2p/, insertion = age
        self.dirty = False
        self._load()

    def _load(self) -> None:
        try:  # a cache only: whatever is wrong with the file (its size too) costs the addresses, not the start
            data = read_json_bounded(self.path, MAX_CACHE_BYTES)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable peer cache %s: %s", self.path, exc)
            return
        if isinstance(data, dict):
            for peer_id, addrs in list(data.items())[:MAX_PEERS]:
                if isinstance(peer_id, str) and isinstance(addrs, list) and all(isinstance(a, str) for a in addrs):
                    self._addrs[peer_id] = addrs[:16]

    def remember(self, peer_id: str, addrs: list[str]) -> None:
        """Keep the dialable (``/p2p/``) addresses of a verified advert; others are data-plane URLs."""
        addrs = [addr for addr in addrs if "/p2p/" in addr]
        if not addrs:
            return
        if self._addrs.get(peer_id) == addrs:
            return  # recency alone is not worth a disk write per heartbeat
        self.dirty = True
        self._addrs.pop(peer_id, None)
        self._addrs = {peer_id: addrs, **self._addrs}
        while len(self._addrs) > MAX_PEERS:
            self._addrs.pop(next(reversed(self._addrs)))

    def addresses(self) -> list[str]:
        return [addr for addrs in self._addrs.values() for addr in addrs]

    def save(self) -> None:
        write_durably(self.path, json.dumps(self._addrs, indent=1).encode())
        self.dirty = False
