"""Who may take part in a round: a member's node identity, bound to its hivemind peer id.

Why a signature per round: hivemind authenticates its peer ids (noise), but they are not our node
identities, and anyone can reach the DHT. Each member signs, with its node's Ed25519 key,
``MEMBER_DOMAIN || u32 round || its hivemind peer id || layout hash || state hash``
(specs/diloco.md section 8); with an allowlist of node peer ids, a payload whose signer is not
listed, whose signature fails, or that names another hivemind peer id than the one that sent it is
refused (at the leader's join check, and again over the whole group before any tensor moves).
This module imports only ``cryptography`` through ``crypto.identity``: the averager child uses it.
"""

from __future__ import annotations

import struct
from typing import Any

from intellect_node.crypto.identity import Identity, IdentityError, public_key_from_peer_id, verify_signature

MEMBER_DOMAIN = b"intellect-node/diloco-member/v1\0"


def member_message(round_: int, hivemind_peer: str, layout: bytes, state_hash: bytes) -> bytes:
    encoded = hivemind_peer.encode()
    return MEMBER_DOMAIN + struct.pack(">IH", round_, len(encoded)) + encoded + layout + state_hash


def sign_member(identity: Identity, round_: int, hivemind_peer: str, layout: bytes, state_hash: bytes) -> bytes:
    return identity.sign(member_message(round_, hivemind_peer, layout, state_hash))


def disagreement(payload: dict[str, Any], ours: bytes) -> str | None:
    """Why a member that trains another model or other data (its signed ``layout``, the run digest
    of ``Layout.run_digest``, differs from ``ours``) cannot average with us, or None."""
    if payload["layout"] == ours:
        return None
    return (f"node {payload['member'][:64]!r} trains another model or other data: its run digest "
            f"{payload['layout'][:8].hex()} is not ours {ours[:8].hex()} (another model preset, or a METAGENE "
            "store of other reads or another tokenizer)")


def refusal(payload: dict[str, Any], hivemind_peer: str, allowlist: frozenset[str]) -> str | None:
    """Why this member's checked gather payload is refused, or None; an empty allowlist admits anyone."""
    if not allowlist:
        return None
    member = payload["member"]
    if member not in allowlist:
        return f"node {member[:64]!r} is not in the run's allowlist"
    try:
        public_key = public_key_from_peer_id(member)
    except (IdentityError, ValueError):
        return f"node {member[:64]!r} is not a valid peer id"
    message = member_message(payload["round"], hivemind_peer, payload["layout"], payload["state_hash"])
    if not verify_signature(public_key, payload["signature"], message):
        return f"node {member[:64]!r}: the signature does not bind it to hivemind peer {hivemind_peer}"
    return None
