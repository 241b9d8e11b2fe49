"""RolloutBatch: what an inference worker delivers, signed, to validators and trainers.

Token ids, logprobs and TOPLOC proofs travel as packed byte strings (u32 / f32 little-endian), so a
batch of a few hundred completions stays a few hundred KB and decodes without a Python object per
token. The worker's reward is advisory: validators and trainers recompute it. specs/rollouts.md is
normative.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from intellect_node.protocol.errors import InvalidValue, SignerMismatch
from intellect_node.protocol.messages import PEER_ID_PATTERN, RUN_ID_PATTERN, Message
from intellect_node.protocol.schema import (
    Bytes,
    Float,
    Int,
    ListOf,
    Nested,
    Optional,
    Record,
    Str,
    wire,
)

TOPLOC_CHUNK = 32
TOPLOC_PROOF_BYTES = 258
MAX_COMPLETION_TOKENS = 32768
MAX_PROMPT_TOKENS = 32768
FINISH_REASONS = frozenset({"stop", "length"})
TOKEN_DTYPE = np.dtype("<u4")
LOGPROB_DTYPE = np.dtype("<f4")


def pack_tokens(ids: list[int] | np.ndarray) -> bytes:
    return np.asarray(ids, dtype=TOKEN_DTYPE).tobytes()


def unpack_tokens(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=TOKEN_DTYPE)


def pack_logprobs(values: list[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=LOGPROB_DTYPE).tobytes()


def unpack_logprobs(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=LOGPROB_DTYPE)


def proof_count(tokens: int) -> int:
    return -(-tokens // TOPLOC_CHUNK)


PROOF_KEY_DOMAIN = b"intellect-node/toploc/row-key/v1"


def proof_key(manifest_hash: bytes, policy_step: int, prompt_ids: bytes, token_ids: bytes) -> bytes:
    """The key a completion's TOPLOC proofs are bound with (``crypto.toploc``, ``key=``).

    sha256 of the domain, the checkpoint's manifest hash, the policy step (u64 big-endian) and the
    packed prompt and completion tokens as they travel (u32 little-endian, each length-prefixed
    u32 big-endian). Why: a proof's activations cannot tell a row from its siblings (same prompt,
    similar states on short rows) or from the same row under a slightly trained checkpoint, so the
    key names the row, and the chunk index is added per chunk (specs/toploc.md section 5).
    """
    digest = hashlib.sha256(PROOF_KEY_DOMAIN)
    digest.update(len(manifest_hash).to_bytes(4, "big") + manifest_hash)
    digest.update(policy_step.to_bytes(8, "big"))
    for packed in (prompt_ids, token_ids):
        digest.update(len(packed).to_bytes(4, "big") + packed)
    return digest.digest()


@dataclass(frozen=True)
class SamplingSettings(Record):
    """What a batch declares it was sampled with: the wire record of a claim, which validators
    compare with the run spec's (``RunSpec.sampling``); workers fill it from the run's shape
    (``RolloutShape.sampling``), never from a default of their own."""

    temperature: float = wire(Float(0.0, 10.0))
    top_p: float = wire(Float(0.0, 1.0))
    max_tokens: int = wire(Int(1, MAX_COMPLETION_TOKENS))


@dataclass(frozen=True)
class CompletionRecord(Record):
    token_ids: bytes = wire(Bytes(4 * MAX_COMPLETION_TOKENS, min_len=4))
    logprobs: bytes = wire(Bytes(4 * MAX_COMPLETION_TOKENS, min_len=4))
    finish_reason: str = wire(Str(8, choices=FINISH_REASONS))
    proofs: tuple[bytes, ...] = wire(ListOf(Bytes(TOPLOC_PROOF_BYTES, min_len=TOPLOC_PROOF_BYTES),
                                            max_items=proof_count(MAX_COMPLETION_TOKENS)))
    reward: float | None = wire(Optional(Float(-1e6, 1e6)))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) // 4

    def check(self, path: str) -> None:
        if len(self.token_ids) % 4:
            raise InvalidValue(f"{path}.token_ids: {len(self.token_ids)} bytes is not a whole number of u32")
        if len(self.logprobs) != len(self.token_ids):
            raise InvalidValue(f"{path}.logprobs: {len(self.logprobs) // 4} values for {self.num_tokens} tokens")
        if len(self.proofs) != proof_count(self.num_tokens):
            raise InvalidValue(f"{path}.proofs: {len(self.proofs)} proofs for {self.num_tokens} tokens, "
                               f"expected {proof_count(self.num_tokens)}")
        logprobs = unpack_logprobs(self.logprobs)
        if not np.all(np.isfinite(logprobs)) or np.any(logprobs > 0):
            raise InvalidValue(f"{path}.logprobs: not all finite and <= 0")


@dataclass(frozen=True)
class RolloutGroup(Record):
    """One task's prompt and the n completions sampled for it (a GRPO group)."""

    counter: int = wire(Int(0, 2**32))
    task_id: str = wire(Str(128))
    length_target: int | None = wire(Optional(Int(1, MAX_COMPLETION_TOKENS)))
    prompt_ids: bytes = wire(Bytes(4 * MAX_PROMPT_TOKENS, min_len=4))
    completions: tuple[CompletionRecord, ...] = wire(ListOf(Nested(CompletionRecord), max_items=64))

    def check(self, path: str) -> None:
        if len(self.prompt_ids) % 4:
            raise InvalidValue(f"{path}.prompt_ids: not a whole number of u32")
        if not self.completions:
            raise InvalidValue(f"{path}.completions: empty group")


@dataclass(frozen=True)
class RolloutBatch(Message):
    TYPE: ClassVar[str] = "rollout_batch"
    MAX_SIZE: ClassVar[int] = 16 << 20
    MAX_LIFETIME_S: ClassVar[float] = 3600.0

    run_id: str = wire(Str(64, pattern=RUN_ID_PATTERN))
    worker: str = wire(Str(64, pattern=PEER_ID_PATTERN))
    policy_step: int = wire(Int(0, 2**40))
    manifest_hash: bytes = wire(Bytes(32, min_len=32))
    engine: str = wire(Str(16, choices=frozenset({"torch", "vllm"})))
    sampling: SamplingSettings = wire(Nested(SamplingSettings))
    groups: tuple[RolloutGroup, ...] = wire(ListOf(Nested(RolloutGroup), max_items=1024))

    def check(self, path: str) -> None:
        if not self.groups:  # names no work: nothing a judge could credit, judge or refuse
            raise InvalidValue(f"{path}.groups: a batch without groups")
        counters = [group.counter for group in self.groups]
        if len(set(counters)) != len(counters):
            raise InvalidValue(f"{path}.groups: a task counter appears twice")
        for group in self.groups:
            for completion in group.completions:
                if completion.num_tokens > self.sampling.max_tokens:
                    raise InvalidValue(f"{path}: a completion has {completion.num_tokens} tokens, "
                                       f"over max_tokens {self.sampling.max_tokens}")

    def check_signer(self, signer_peer_id: str) -> None:
        if self.worker != signer_peer_id:
            raise SignerMismatch("rollout batch names a worker other than its signer")


@dataclass(frozen=True)
class RolloutAnnouncement(Message):
    """Gossiped after delivery: which batch exists, never its content (specs/rollouts.md)."""

    TYPE: ClassVar[str] = "rollout_announcement"
    MAX_SIZE: ClassVar[int] = 1024
    MAX_LIFETIME_S: ClassVar[float] = 600.0

    run_id: str = wire(Str(64, pattern=RUN_ID_PATTERN))
    worker: str = wire(Str(64, pattern=PEER_ID_PATTERN))
    policy_step: int = wire(Int(0, 2**40))
    batch_digest: bytes = wire(Bytes(32, min_len=32))
    groups: int = wire(Int(1, 1024))
    completions: int = wire(Int(1, 65536))

    def check_signer(self, signer_peer_id: str) -> None:
        if self.worker != signer_peer_id:
            raise SignerMismatch("announcement names a worker other than its signer")
