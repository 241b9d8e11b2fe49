"""DHT keys and gossip topic names, derived from run id and peer id.

libp2p 0.8.1 fails remote lookups of keys over about 50 bytes, so every key is a short namespace
plus a truncated sha256: fixed length whatever the run id or peer id.
"""

from __future__ import annotations

import hashlib

DHT_NAMESPACE = "ina"  # the validator registered for "/ina/..." checks every stored value
_KEY_HASH_BYTES = 16


def _digest(*parts: str) -> str:
    joined = "\x00".join(parts).encode()
    return hashlib.sha256(joined).digest()[:_KEY_HASH_BYTES].hex()


def advert_key(run_id: str, peer_id: str) -> str:
    """Where a node's signed advert lives: "/ina/" + 32 hex characters (37 bytes)."""
    return f"/{DHT_NAMESPACE}/{_digest('advert', run_id, peer_id)}"


def run_members_key(run_id: str) -> str:
    """The provider-record key every member of a run provides (returns about k = 20 of them)."""
    return _digest("members", run_id)


def members_topic(run_id: str) -> str:
    """Gossip topic on which every node repeats its signed advert: the run's full member list."""
    return f"ina/{run_id}/members"


# The largest envelope any announcement type may have (verdicts, 768 KiB; manifests 512 KiB). A
# node judges size against this, not against the types it handles itself: a bootstrap node that
# handles no manifests must still not charge the trainer that forwards one (unknown types are free).
ANNOUNCE_MAX_BYTES = 768 << 10


def announcements_topic(run_id: str) -> str:
    """Gossip topic for small signed announcements (manifests, batches, verdicts)."""
    return f"ina/{run_id}/announce"
