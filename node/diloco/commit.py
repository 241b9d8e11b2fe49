"""The commit step of an all-reduce attempt (specs/diloco.md section 2): a member applies the
group's average only when every member of the attempt says that its own side completed, with the
same group and the same sums.

Why: hivemind's all-reduce has no commit of its own. A member whose part and replies all arrived
finishes, while a groupmate that timed out waiting on that (slow) member fails, matches again
without it and averages over fewer peers: the same round then ends with different states on
different peers (seen under load: group sizes 3, 2, 2 in one round). With this step, a member that
completed posts its digests under the attempt's key, one that failed posts ``False``, and each
waits for the others: one ``False``, different digests, or silence until the deadline fails the
attempt on every side, and hivemind matches the survivors again from their raw values.

The digests (``outcome_digests``): 16 bytes over the group as this member saw it (its members in
order and the shared exponents, both from payloads the leader relayed), then 16 per reducer's span
over the sums this member recovered there. A leader that relayed different payloads to different
followers, or a reducer that replied different sums to different members (which no bound on values
can see), makes them differ, and the attempt fails on every side instead of leaving members on
different states; each member logs what differs from its own. Nobody is banned for it: digests are
posted unsigned, so a member could post under another's name and frame an honest reducer.

The key names the attempt's group id, which only its members hold (the leader draws it at
random), so no outsider can post there; a member can lie here as it can in the all-reduce
itself, and the next round's state-hash check finds a peer that diverged either way. Runs inside
the averager child (``dht`` is hivemind's ``DHT``); this module imports nothing of hivemind, so
the decision is testable on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import base58
import torch

COMMIT_S = 10.0  # how long a member that completed waits for the others' outcomes
POLL_S = (0.05, 0.1, 0.2, 0.4)  # the waits between reads, then the last one repeated
OUTCOME_LIFETIME_S = 120.0  # the DHT keeps an outcome this long after it was posted
SPAN_DIGEST = 16  # bytes of sha256 per reducer's span
MAX_DIGESTS = 4096  # spans an outcome may name (a group is far smaller)
Outcome = bytes | bool  # the digests of a completed side, or False for a failed one


class CommitRefused(Exception):
    """The attempt is not applied: a member failed its side, posted other digests, or did not say in time."""


def commit_key(prefix: str, group_id: bytes) -> str:
    return f"{prefix}.commit.{group_id.hex()}"


def peer_name(member: bytes) -> str:
    """A member as hivemind and its logs write a peer id (base58 of its bytes)."""
    return base58.b58encode(member).decode()


def outcome_digests(members: Sequence[bytes], shared_exponents: bytes, sums: torch.Tensor,
                    spans: Sequence[tuple[int, int]]) -> bytes:
    """What a completed member posts: the first 16 bytes of sha256 over the group (each member id,
    length-prefixed, in the group's order, then the shared exponents), then for each reducer's span
    of the flat vector, in the group's order, the first 16 bytes of sha256 over its exact sums
    (int32, little-endian)."""
    group = b"".join(len(m).to_bytes(2, "big") + m for m in members) + shared_exponents
    data = sums.to(torch.int32).numpy().astype("<i4")
    return hashlib.sha256(group).digest()[:SPAN_DIGEST] + b"".join(
        hashlib.sha256(data[start:end].tobytes()).digest()[:SPAN_DIGEST] for start, end in spans)


def differing_entries(mine: bytes, theirs: bytes) -> list[int]:
    """Indices of the 16-byte entries that differ (all of them if the lengths differ): 0 is the
    group, i >= 1 the span of the group's member i - 1."""
    if len(mine) != len(theirs):
        return list(range(max(len(mine), len(theirs)) // SPAN_DIGEST))
    return [i // SPAN_DIGEST for i in range(0, len(mine), SPAN_DIGEST)
            if mine[i:i + SPAN_DIGEST] != theirs[i:i + SPAN_DIGEST]]


def decide(members: Sequence[bytes], outcomes: Mapping[bytes, Outcome]) -> bool | None:
    """True when every member posted the same digests, False once one posted failure or two
    posted different digests, None while waiting. Entries of non-members are ignored (they cannot
    change an attempt they are not in)."""
    posted = [outcomes.get(m) for m in members]
    if any(p is False for p in posted):
        return False
    if len({p for p in posted if isinstance(p, bytes)}) > 1:
        return False
    if all(isinstance(p, bytes) for p in posted):
        return True
    return None


def read_outcomes(stored: Any) -> dict[bytes, Outcome]:
    """The DHT's entry for a commit key as {member: digests or False}; anything malformed is skipped."""
    value = getattr(stored, "value", None)
    if not isinstance(value, dict):
        return {}
    out: dict[bytes, Outcome] = {}
    for subkey, entry in value.items():
        outcome = getattr(entry, "value", None)
        if not isinstance(subkey, bytes):
            continue
        if outcome is False or (isinstance(outcome, bytes) and 0 < len(outcome) <= MAX_DIGESTS * SPAN_DIGEST
                                and len(outcome) % SPAN_DIGEST == 0):
            out[subkey] = outcome
    return out


async def post(dht: Any, key: str, member: bytes, outcome: Outcome) -> None:
    """Say how this member's side of the attempt ended: its digests, or False (best effort:
    silence reads as failure)."""
    expiration = time.time() + OUTCOME_LIFETIME_S
    await dht.store(key=key, subkey=member, value=outcome, expiration_time=expiration, return_future=True)


def _refusal(members: Sequence[bytes], outcomes: Mapping[bytes, Outcome], mine: bytes) -> CommitRefused:
    """Why a decided attempt is not applied here: who failed, else what differs from ``mine``."""
    failed = [peer_name(m) for m in members if outcomes.get(m) is False]
    if failed:
        return CommitRefused(f"members {failed} did not complete their side of the attempt")
    entries = sorted({i for m in members if isinstance(posted := outcomes.get(m), bytes)
                      for i in differing_entries(mine, posted)})
    what = ["the group (its order or shared grid: the leader's relay)" if i == 0 else
            f"the span reduced by {peer_name(members[i - 1])}" if i <= len(members) else f"entry {i}"
            for i in entries]
    return CommitRefused(f"members hold different averages: {', '.join(what)} differ from this member's")


async def await_commit(dht: Any, key: str, members: Sequence[bytes], mine: bytes,
                       timeout_s: float = COMMIT_S) -> None:
    """Return once every member posted the digests ``mine``; CommitRefused on a failure, on
    different digests (naming the reducers whose spans differ from ours) or at the deadline."""
    deadline = time.monotonic() + timeout_s
    outcomes: dict[bytes, Outcome] = {}
    for attempt in itertools.count():
        outcomes = read_outcomes(await dht.get(key, latest=True, return_future=True))
        verdict = decide(members, outcomes)
        if verdict is True and outcomes[members[0]] == mine:
            return
        if verdict is not None:  # a failure, or digests that differ (maybe all equal, but not to ours)
            raise _refusal(members, outcomes, mine)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        await asyncio.sleep(min(POLL_S[min(attempt, len(POLL_S) - 1)], left))
    silent = [peer_name(m) for m in members if m not in outcomes]
    raise CommitRefused(f"members {silent} did not say within {timeout_s:.0f} s whether they completed")
