"""The checkpoint overlay's request targets (specs/shardcast.md section 4), one table for the
server that matches them and the fetchers that build them, over HTTP or a libp2p stream alike.

    GET /ina/v1/<run>/manifest                          newest manifest envelope held
    GET /ina/v1/<run>/<step>/manifest                   that step's manifest envelope
    GET /ina/v1/<run>/<step>/delta                      that step's delta body (specs/deltas.md)
    GET /ina/v1/<run>/<step>/have                       which shards are verified: a stream of lines
    GET /ina/v1/<run>/<step>/checkpoint.safetensors     Range: bytes=a-b, only verified shards

Why in protocol/: peers must agree on these bytes exactly as on a message's fields; a target
outside ROUTE is refused before anything else is read of the request.
"""

from __future__ import annotations

import re

RESOURCES = ("manifest", "have", "delta", "checkpoint.safetensors")
ROUTE = re.compile(r"/ina/v1/(?P<run>[a-z0-9][a-z0-9._-]{0,63})(?:/(?P<step>[0-9]{1,12}))?/"
                   r"(?P<what>manifest|have|delta|checkpoint\.safetensors)")


def target(run_id: str, what: str, step: int | None = None) -> str:
    """The request target of ``what`` (one of RESOURCES) of ``step`` in ``run_id``; no step:
    the newest manifest. ValueError for a target the server would refuse."""
    path = f"/ina/v1/{run_id}/{what}" if step is None else f"/ina/v1/{run_id}/{step}/{what}"
    if ROUTE.fullmatch(path) is None or (step is None and what != "manifest"):
        raise ValueError(f"not an overlay route: {path!r}")
    return path
