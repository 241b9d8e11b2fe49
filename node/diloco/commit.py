"""The commit step of an all-reduce attempt (specs/diloco.md section 2): a member applies the
group's average only when every member of the attempt says that its own side completed.

Why: hivemind's all-reduce has no commit of its own. A member whose part and replies all arrived
finishes, while a groupmate that timed out waiting on that (slow) member fails, matches again
without it and averages over fewer peers: the same round then ends with different states on
different peers (seen under load: group sizes 3, 2, 2 in one round). With this step, a member that
completed posts ``True`` under the attempt's key, one that failed posts ``False``, and each waits
for the others: one ``False`` or silence until the deadline fails the attempt on every side, and
hivemind matches the survivors again from their raw values.

The key names the attempt's group id, which only its members hold (the leader draws it at
random), so no outsider can post there; a member can lie here as it can in the all-reduce
itself, and the next round's state-hash check finds a peer that diverged either way. Runs inside
the averager child (``dht`` is hivemind's ``DHT``); this module imports nothing of hivemind, so
the decision is testable on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

COMMIT_S = 10.0  # how long a member that completed waits for the others' outcomes
POLL_S = (0.05, 0.1, 0.2, 0.4)  # the waits between reads, then the last one repeated
OUTCOME_LIFETIME_S = 120.0  # the DHT keeps an outcome this long after it was posted


class CommitRefused(Exception):
    """The attempt is not applied: a member failed its side, or did not say in time."""


def commit_key(prefix: str, group_id: bytes) -> str:
    return f"{prefix}.commit.{group_id.hex()}"


def decide(members: Sequence[bytes], outcomes: Mapping[bytes, bool]) -> bool | None:
    """True when every member posted success, False once one posted failure, None while waiting.
    Entries of non-members are ignored (they cannot change an attempt they are not in)."""
    if any(outcomes.get(m) is False for m in members):
        return False
    if all(outcomes.get(m) is True for m in members):
        return True
    return None


def read_outcomes(stored: Any) -> dict[bytes, bool]:
    """The DHT's entry for a commit key as {member: outcome}; anything malformed is skipped."""
    value = getattr(stored, "value", None)
    if not isinstance(value, dict):
        return {}
    out = {}
    for subkey, entry in value.items():
        outcome = getattr(entry, "value", None)
        if isinstance(subkey, bytes) and isinstance(outcome, bool):
            out[subkey] = outcome
    return out


async def post(dht: Any, key: str, member: bytes, completed: bool) -> None:
    """Say how this member's side of the attempt ended (best effort: silence reads as failure)."""
    expiration = time.time() + OUTCOME_LIFETIME_S
    await dht.store(key=key, subkey=member, value=completed, expiration_time=expiration, return_future=True)


async def await_commit(dht: Any, key: str, members: Sequence[bytes], timeout_s: float = COMMIT_S) -> None:
    """Return once every member posted success; CommitRefused on a failure or at the deadline."""
    deadline = time.monotonic() + timeout_s
    outcomes: dict[bytes, bool] = {}
    for attempt in itertools.count():
        outcomes = read_outcomes(await dht.get(key, latest=True, return_future=True))
        verdict = decide(members, outcomes)
        if verdict is True:
            return
        if verdict is False:
            failed = [m.hex()[:16] for m in members if outcomes.get(m) is False]
            raise CommitRefused(f"members {failed} did not complete their side of the attempt")
        left = deadline - time.monotonic()
        if left <= 0:
            break
        await asyncio.sleep(min(POLL_S[min(attempt, len(POLL_S) - 1)], left))
    silent = [m.hex()[:16] for m in members if m not in outcomes]
    raise CommitRefused(f"members {silent} did not say within {timeout_s:.0f} s whether they completed")
