"""The persistent list of peers this node has seen, so a restart does not need bootstrap peers.

Only addresses taken from verified adverts are stored (never what an unverified peer claims), at
most ``MAX_PEERS``, most recently changed first, written atomically.

A full cache is not rotated by every advert it hears: in a run larger than ``MAX_PEERS`` each
re-signing of a member outside it evicted one inside it and cost a durable write (at 100 members,
with the write on the event loop, a twelfth of a light member's CPU at rest; bench/HISTORY.md
"Scale"). A newcomer takes the place of the entry heard from longest ago only once that entry has
been silent for ``SILENT_REPLACE_S``: longer than a live member's re-signing interval, so the
peers replaced are the ones that left.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from intellect_node.node.config.loader import read_json_bounded
from intellect_node.node.home.durable import write_durably

log = logging.getLogger(__name__)

MAX_PEERS = 64
MAX_CACHE_BYTES = 1 << 20  # MAX_PEERS peers of up to 16 addresses are far below this
SILENT_REPLACE_S = 900.0  # a live member re-signs at least every 600 s up to 150 members (specs/dht.md)


class PeerCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._addrs: dict[str, list[str]] = {}  # peer id -> multiaddrs with /p2p/, insertion = age
        self._heard: dict[str, float] = {}  # peer id -> when an advert of it was last remembered (monotonic)
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

    def remember(self, peer_id: str, addrs: list[str], now: float | None = None) -> None:
        """Keep the dialable (``/p2p/``) addresses of a verified advert; others are data-plane URLs."""
        addrs = [addr for addr in addrs if "/p2p/" in addr]
        if not addrs:
            return
        now = time.monotonic() if now is None else now
        if self._addrs.get(peer_id) == addrs:
            self._heard[peer_id] = now
            return  # recency alone is not worth a disk write per heartbeat
        if peer_id not in self._addrs and len(self._addrs) >= MAX_PEERS:
            silent = min(self._addrs, key=lambda held: self._heard.get(held, -float("inf")))
            if now - self._heard.get(silent, -float("inf")) < SILENT_REPLACE_S:
                return  # full of members still heard from
            self._addrs.pop(silent)
            self._heard.pop(silent, None)
        self.dirty = True
        self._addrs.pop(peer_id, None)
        self._addrs = {peer_id: addrs, **self._addrs}
        self._heard[peer_id] = now

    def encoded(self) -> bytes:
        """The file's bytes as the cache stands (the cache is clean from here: write them)."""
        self.dirty = False
        return json.dumps(self._addrs, indent=1).encode()

    def addresses(self) -> list[str]:
        return [addr for addrs in self._addrs.values() for addr in addrs]

    def save(self) -> None:
        write_durably(self.path, self.encoded())
