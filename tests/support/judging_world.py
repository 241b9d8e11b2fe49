"""A judge's world for the validation and cheat tests: two checkpoints, the validator's and a
worker's engines on the wide tiny model, the toy tasks, and forgeries made by a real worker key.

Cheaters re-build and sign their batches, so the signature is valid and only recomputation tells.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch
from transformers import AutoTokenizer

from intellect_node.crypto.identity import Identity
from intellect_node.node.engine.proofs import build_completion_proofs
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import RunContext, verify_batch
from intellect_node.node.tasks.toy import generate_toy_tasks
from intellect_node.protocol import codec
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import RolloutBatch, pack_logprobs, pack_tokens, proof_key, unpack_tokens
from intellect_node.protocol.run_spec import TORCH_TORCH, build_run_spec
from tests.support.engine_helpers import untrained_wide_tiny_model, wide_tiny_model

RUN = "validation-test"
STEP = 4  # the newest checkpoint; step 3 is the previous one
WINDOW = 2
SETTINGS = RolloutShape(group_size=4, groups_per_batch=4, max_tokens=16)
CHEATER = Identity.generate()
VALIDATOR = Identity.generate()


def noisy(weights: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """``weights`` moved by relative Gaussian noise of ``scale``, as a training step or other weights would."""
    generator = torch.Generator().manual_seed(seed)
    # drawn on the CPU (the same noise on every machine), added where the weights live
    return {name: t + torch.randn(t.shape, generator=generator).to(t.device) * scale * t.abs()
            for name, t in weights.items()}


class World:
    """Two checkpoints (steps 3 and 4), a validator engine, a worker engine, the task list."""

    def __init__(self, untrained: bool = False) -> None:
        torch.set_num_threads(2)
        model = untrained_wide_tiny_model() if untrained else wide_tiny_model()
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.tasks = generate_toy_tasks(seed=11, count=200)
        self.validator = TorchEngine.from_checkpoint(model, max_batch_rows=64)
        self.worker = TorchEngine.from_checkpoint(model, max_batch_rows=16)
        base = {k: v.clone() for k, v in self.validator.model.state_dict().items()}
        self.weights = {3: base, 4: noisy(base, 0.05, seed=1)}  # a training step moves weights a little
        self.hashes = {step: hashlib.sha256(f"manifest-{step}".encode()).digest() for step in self.weights}
        self.validator.load_state_dict(self.weights[STEP])
        self.worker.load_state_dict(self.weights[STEP])
        self.seen = JudgeState()
        self.run = RunContext(self.spec(SETTINGS), self.tasks)

    def spec(self, settings: RolloutShape, pair=TORCH_TORCH, tasks=None):
        """The run spec the validator judges by (the validator's, never the batch's, settings)."""
        return build_run_spec(run_id=RUN, authority=VALIDATOR.peer_id, tasks=tasks or self.tasks, settings=settings,
                              async_window=WINDOW, engines=(pair,))

    def step_of(self, manifest_hash: bytes) -> int | None:
        return next((s for s, h in self.hashes.items() if h == manifest_hash), None)

    def build(self, *, worker: Identity = CHEATER, step: int = STEP, tasks=None, settings=SETTINGS,
              first_counter: int | None = None, claim_step: int | None = None) -> RolloutBatch:
        if first_counter is None:  # the next dense counter of (worker, step)
            first_counter = self.seen.expected(worker.peer_id, step)
        claim = STEP if claim_step is None else claim_step
        return build_batch(self.worker, self.tokenizer, tasks or self.tasks, run_id=RUN, worker=worker.peer_id,
                           step=step, manifest_hash=self.hashes.get(claim, bytes(32)), first_counter=first_counter,
                           settings=settings).batch

    def verify(self, batch: RolloutBatch, *, worker: Identity = CHEATER, run: RunContext | None = None):
        signed = codec.decode(codec.encode(batch, worker, lifetime_s=600), RolloutBatch)
        return verify_batch(signed, engine=self.validator, tokenizer=self.tokenizer, run=run or self.run,
                            checkpoint_step_of=self.step_of, newest_step=STEP, state=self.seen)

    def remake(self, batch: RolloutBatch, group_index: int, *, prompt: list[int] | None = None,
               tokens: list[list[int]] | None = None, proof_prompt: list[int] | None = None,
               finish: list[str] | None = None) -> RolloutBatch:
        """A consistent forgery of one group: logprobs and proofs recomputed by the cheater's own
        prefill over ``tokens`` (after ``proof_prompt``, default the claimed prompt), bound to the
        claimed rows (their proof keys) as any worker can."""
        group = batch.groups[group_index]
        prompt = prompt if prompt is not None else unpack_tokens(group.prompt_ids).tolist()
        tokens = tokens if tokens is not None else [unpack_tokens(c.token_ids).tolist() for c in group.completions]
        again = self.worker.prefill([proof_prompt or prompt] * len(tokens), tokens)
        keys = [proof_key(batch.manifest_hash, batch.policy_step, pack_tokens(prompt), pack_tokens(t)) for t in tokens]
        proofs = build_completion_proofs([a.hidden_states for a in again], keys)
        records = tuple(
            dataclasses.replace(record, token_ids=pack_tokens(t), logprobs=pack_logprobs(a.logprobs.numpy()),
                                proofs=tuple(p), finish_reason=(finish[j] if finish else record.finish_reason))
            for j, (record, t, a, p) in enumerate(zip(group.completions, tokens, again, proofs, strict=True)))
        groups = list(batch.groups)
        groups[group_index] = dataclasses.replace(group, prompt_ids=pack_tokens(prompt), completions=records)
        return dataclasses.replace(batch, groups=tuple(groups))


def reasons(verdict) -> list[str | None]:
    """Each group's refusal reason (None: accepted), in batch order."""
    return [g.reason for g in verdict.groups]
