"""Deterministic work assignment: which task, length target and sampling seed a worker uses.

An inference worker must not choose its own tasks (it would pick easy ones and farm rewards), so
everything it is asked to do at ``(run, step, counter)`` is a pure function of public values:

    digest = sha256(domain || len(run_id) || run_id || len(peer_id) || peer_id || step || counter
                    [|| len(beacon) || beacon])

with a different ``domain`` string for each derived value, so the task index, the length target
and the sampling seed are independent of one another. The task and the length target also mix in
the ``beacon``: the ``manifest_hash`` of checkpoint ``step``, which nobody knows before the trainer
signs that checkpoint, so no task of ``step`` is known before it (specs/rollouts.md, "Committed
assignments"); the sampling seed does not need it (a seed tells nothing without its task).
Strings are UTF-8 and prefixed with their byte length (u32 big-endian), integers are u64
big-endian: no two distinct inputs share an encoding. Any validator recomputes the same values
from the rollout's claimed ``(run_id, peer_id, step, counter)`` and rejects a rollout whose task
differs.

The digest is reduced modulo the number of choices. Its bias is at most ``n / 2**256``:
negligible for any task set that fits in memory.

What this module cannot stop alone: a worker trying many counters or keys and keeping the easy
ones. Validators therefore credit counters densely and in order (0, 1, 2, ... within a step, below
the run spec's cap; ``node/roles/validator/ledger.py``), and only under a work commitment stored
before the beacon, settling committed counters never delivered as reward 0
(``node/roles/validator/commitments.py``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

_TASK_DOMAIN = b"intellect-node/assignment/task/v1"
_LENGTH_DOMAIN = b"intellect-node/assignment/length-target/v1"
_SEED_DOMAIN = b"intellect-node/assignment/sampling-seed/v1"
_U64_MAX = 2**64 - 1
BEACON_BYTES = 32  # sha256: a manifest_hash


def _encode_str(value: str, name: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string")
    raw = value.encode("utf-8")
    return struct.pack(">I", len(raw)) + raw


def _encode_u64(value: int, name: str) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2**64)")
    return struct.pack(">Q", value)


def _encode_beacon(value: bytes) -> bytes:
    if not isinstance(value, bytes) or len(value) != BEACON_BYTES:
        raise ValueError(f"beacon must be {BEACON_BYTES} bytes (a checkpoint's manifest_hash)")
    return struct.pack(">I", len(value)) + value


def _digest(domain: bytes, run_id: str, peer_id: str, step: int, counter: int, beacon: bytes | None = None) -> int:
    payload = (
        domain
        + _encode_str(run_id, "run_id")
        + _encode_str(peer_id, "peer_id")
        + _encode_u64(step, "step")
        + _encode_u64(counter, "counter")
        + (b"" if beacon is None else _encode_beacon(beacon))
    )
    return int.from_bytes(hashlib.sha256(payload).digest(), "big")


def task_index(run_id: str, peer_id: str, step: int, counter: int, num_tasks: int, *, beacon: bytes) -> int:
    """Index in ``[0, num_tasks)`` of the task the worker ``peer_id`` solves at (step, counter);
    ``beacon``: the manifest_hash of checkpoint ``step``."""
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        raise ValueError("num_tasks must be a positive integer")
    return _digest(_TASK_DOMAIN, run_id, peer_id, step, counter, beacon) % num_tasks


def length_target(
    run_id: str, peer_id: str, step: int, counter: int, targets: Sequence[int], *, beacon: bytes
) -> int:
    """The thinking-length target (tokens) stated in the prompt, drawn from the run's list
    (``beacon`` as for ``task_index``: the target is part of the task)."""
    if not targets:
        raise ValueError("targets must not be empty")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in targets):
        raise ValueError("every length target must be a positive integer")
    return targets[_digest(_LENGTH_DOMAIN, run_id, peer_id, step, counter, beacon) % len(targets)]


def sampling_seed(run_id: str, peer_id: str, step: int, counter: int) -> int:
    """The 63-bit seed the worker samples with, so a validator can replay the sampling."""
    return _digest(_SEED_DOMAIN, run_id, peer_id, step, counter) >> (256 - 63)
