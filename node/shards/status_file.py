"""``<data_dir>/status.json``: what the overlay holds, fetched, uploaded and complained about.

Operators and tests read this file rather than the process, so it is rewritten (atomically, at most
every ``STATUS_EVERY_S``) whenever something in it changed, and not otherwise: the writer waits for
a change, where it used to wake every 0.5 s to look (a node at rest paid for two wake-ups a second,
and a wake-up of its event loop costs ~0.35 ms of CPU on a 2-core VM: issue 51's idle budget).

It lives apart from ``ShardService`` so that the service keeps only what orders the overlay
(intake, fetches, retention, completion) and the report's shape is read in one place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from intellect_node.node.home.durable import write_durably

if TYPE_CHECKING:
    from intellect_node.node.shards.service import ShardService

STATUS_EVERY_S = 0.5


def shard_status(service: ShardService) -> dict[str, Any]:
    """The report: every held step, the service's counters, uploads, stream requests, complaints."""
    return {
        "peer_id": service.node.peer_id,
        "http": service.http_addr,
        "steps": {str(c.step): {"complete": c.complete, "verified": c.verified_count,
                                "shards": c.manifest.shard_count, "total_size": c.manifest.total_size,
                                "origin": c.origin,
                                "checkpoint_hash": c.manifest.checkpoint_hash.hex(),
                                "delta_size": c.manifest.delta.size if c.manifest.delta else None,
                                "delta_format": c.manifest.delta.format if c.manifest.delta else None,
                                "completed_at": c.completed_at,
                                "path": str(c.data_path)}
                  for c in service.store.held()},
        **service.counters,
        "uploaded_bytes": service.server.stats.bytes,
        "uploaded_shards": service.server.stats.shards,
        "uploaded_deltas": service.server.stats.deltas,
        "uploads_refused": service.server.stats.refused,
        "stream_requests": dict(service.stream_server.counts),
        "complaints_made": list(service.complaints.made),
        "complaints_heard": list(service.complaints.heard),
    }


class StatusFile:
    """Rewrites ``path`` with ``report()`` after each change (``mark_dirty``, from the trio thread),
    at most once per ``STATUS_EVERY_S``."""

    def __init__(self, path: Path, report: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self._report = report
        self._changed = trio.Event()
        self._changed.set()  # the first report

    def mark_dirty(self) -> None:
        self._changed.set()

    async def run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            await trio.to_thread.run_sync(_write_status, self.path, json.dumps(self._report(), indent=1))
            await trio.sleep(STATUS_EVERY_S)


def _write_status(path: Path, text: str) -> None:
    write_durably(path, text.encode())
