"""The shard protocol over libp2p streams (``/ina/shards/1.0.0``, specs/shardcast.md section 4.1):
request and answer-head frames, strictly checked.

One request per stream: a frame with JSON ``{"target": <the HTTP route's path>}`` plus, for a
checkpoint range, ``"range": [first, last]`` (inclusive, as in HTTP). The answer opens with a head
frame ``{"status", "length", "reason"}`` carrying the HTTP status the server would give; then
``length`` raw body bytes (a manifest, a range), or for a have stream one frame per have line
(an empty frame is a heartbeat) until the server closes. Why the HTTP statuses and routes: the
server decides once for both transports (``ShardServer.answer``), and the fetcher handles refusals
the same way whichever transport carried them.
"""

from __future__ import annotations

import json

from intellect_node.protocol.errors import InvalidValue, MalformedBody, WrongType
from intellect_node.protocol.overlay_routes import ROUTE

MAX_REQUEST = 512  # a route is under 128 characters; anything longer is not a request
MAX_ANSWER_HEAD = 8192  # a 409's suggestion list of 64 shards is the longest reason
MAX_BODY = 1 << 40
_STATUSES = frozenset({200, 206, 400, 401, 404, 405, 409, 416, 429, 503})


def encode_request(target: str, first: int | None = None, last: int | None = None) -> bytes:
    request: dict[str, object] = {"target": target}
    if first is not None and last is not None:
        request["range"] = [first, last]
    return json.dumps(request, separators=(",", ":")).encode()


def json_object(raw: bytes, what: str, required: frozenset[str], optional: frozenset[str] = frozenset()) -> dict:
    """``raw`` as a JSON object with every ``required`` key and no key outside ``optional``;
    MalformedBody naming ``what`` otherwise (the shard wire's lines and frames are all such objects)."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MalformedBody(f"{what} is not JSON") from None
    if not isinstance(data, dict) or not required <= set(data) <= required | optional:
        keys = ", ".join(sorted(required)) + "".join(f"[, {key}]" for key in sorted(optional))
        raise MalformedBody(f"{what} is not {{{keys}}}")
    return data


def decode_request(raw: bytes) -> tuple[str, bytes | None]:
    """(target, ``Range`` value as HTTP spells it or None); MalformedBody, WrongType or
    InvalidValue naming what was wrong. ``raw`` was size-limited by the frame read."""
    data = json_object(raw, "shard request", frozenset({"target"}), frozenset({"range"}))
    target = data["target"]
    if type(target) is not str:
        raise WrongType("shard request target is not a string")
    if ROUTE.fullmatch(target) is None:
        raise InvalidValue(f"shard request target {target[:80]!r} names no resource")
    if "range" not in data:
        return target, None
    bounds = data["range"]
    if (not isinstance(bounds, list) or len(bounds) != 2 or any(type(b) is not int for b in bounds)
            or not 0 <= bounds[0] <= bounds[1] < MAX_BODY):
        raise InvalidValue("shard request range is not [first, last] with 0 <= first <= last")
    return target, f"bytes={bounds[0]}-{bounds[1]}".encode()


def encode_head(status: int, length: int = 0, reason: str = "") -> bytes:
    return json.dumps({"status": status, "length": length, "reason": reason[:4096]},
                      separators=(",", ":")).encode()


def decode_head(raw: bytes) -> tuple[int, int, str]:
    """(status, length, reason) of an answer head; MalformedBody or InvalidValue otherwise."""
    data = json_object(raw, "shard answer head", frozenset({"status", "length", "reason"}))
    status, length, reason = data["status"], data["length"], data["reason"]
    if type(status) is not int or status not in _STATUSES:
        raise InvalidValue(f"shard answer status {status!r}")
    if type(length) is not int or not 0 <= length < MAX_BODY or type(reason) is not str:
        raise InvalidValue("shard answer length or reason out of range")
    return status, length, reason
