"""One DiLoCo peer: H inner AdamW steps, the exact group average, the outer step, a checkpoint.

Why one class owns the round: the order of a round is protocol (specs/diloco.md section 1), and
keeping it in one place (with no networking but ``AveragerClient`` and no event loop) lets the
role run it in a worker thread, and the tests and the bench run it as is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco import grid
from intellect_node.node.diloco.checkpoint import (
    PeerState,
    adamw_vectors,
    load_checkpoint,
    restore_adamw,
    save_checkpoint,
)
from intellect_node.node.diloco.client import AveragerClient, AveragerError
from intellect_node.node.diloco.data import peer_key, round_batch
from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.outer import GlobalState, outer_step
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.diloco.state_hash import state_hash
from intellect_node.node.metagene.recipe import Recipe, make_optimizer

log = logging.getLogger(__name__)


@dataclass
class RoundRecord:
    """What one round did: a metrics.jsonl line and the progress line's fields."""

    round: int
    inner_steps: int
    loss: float
    tokens: int
    tokens_per_s: float
    train_s: float
    allreduce_s: float
    allreduce_bytes: int  # packed tensor bytes this peer sent in the round's all-reduce (framing excluded)
    group_size: int
    solo: bool
    hash_agreement: bool | None
    state_hash: str
    error: str = ""

    def line(self) -> str:
        agree = {True: "agree", False: "DIVERGED", None: "-"}[self.hash_agreement]
        return (f"round {self.round} | steps {self.inner_steps} | loss {self.loss:.4f} | {self.tokens_per_s:,.0f} tok/s | "
                f"all-reduce {self.allreduce_s:.2f}s {self.allreduce_bytes / 2**20:.2f} MiB | "
                f"peers {self.group_size}{' (solo)' if self.solo else ''} | hash {self.state_hash[:12]} {agree}")


def lm_loss(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=rows[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))


class Stopped(Exception):
    """The peer was asked to stop: the round in progress is dropped, nothing is applied or saved."""


class DilocoPeer:
    def __init__(self, model: torch.nn.Module, settings: DilocoSettings, client: AveragerClient, corpus: torch.Tensor,
                 identity: Identity, checkpoint: Path | None = None) -> None:
        self.model, self.settings, self.client, self.corpus = model, settings, client, corpus
        self.identity = identity  # the node's key: names this peer's data and signs it into rounds
        self.key = peer_key(identity.peer_id)
        self.checkpoint = checkpoint
        self.stopping = threading.Event()  # set from another thread: the round in progress is dropped
        self.named = dict(model.named_parameters())
        self.layout = Layout.of(self.named)
        recipe = Recipe(lr=settings.inner_lr, min_lr=settings.inner_lr, warmup_steps=0, total_steps=1,
                        weight_decay=settings.weight_decay, betas=settings.betas)
        self.recipe = recipe
        self.optimizer = make_optimizer(model, recipe)
        if checkpoint is not None and checkpoint.exists():
            saved = load_checkpoint(checkpoint, self.layout)
            restore_adamw(self.optimizer, self.named, self.layout, saved.exp_avg, saved.exp_avg_sq, saved.adam_step)
            self.state, self.residual, self.tokens = saved.state, saved.residual, saved.tokens
            log.info("resumed at round %d from %s", self.state.round, checkpoint)
        else:
            self.state = GlobalState.start(self.layout, self.layout.flatten(self.named))
            self.residual, self.tokens = torch.zeros(self.layout.elements), 0
        self._load_global()
        self.diverged = False  # our last round was solo or our hash disagreed: the swarm's state wins

    def sync(self, timeout_s: float) -> bool:
        """Adopt the global state a live peer serves, hash-checked, when it is ahead of ours (or at our
        round after we diverged); then serve ours. True when a state was adopted."""
        adopted = False
        try:
            theirs = self.client.fetch(timeout_s)
        except AveragerError as exc:
            log.warning("state from peers refused: %s", exc)
            theirs = None
        ours = state_hash(self.state)
        if theirs is not None and (theirs.round > self.state.round or (
                theirs.round == self.state.round and self.diverged and state_hash(theirs) != ours)):
            log.info("adopting the swarm's state at round %d (ours: round %d)", theirs.round, self.state.round)
            self.state, self.residual, self.diverged, adopted = theirs, torch.zeros_like(self.residual), False, True
            self._load_global()
            ours = self._save()
        self._publish(ours)
        return adopted

    def _publish(self, digest: bytes) -> None:
        try:
            self.client.publish(self.state, digest)
        except AveragerError as exc:  # joiners ask another peer; our own rounds go on
            log.warning("could not serve the state to joiners: %s", exc)

    def _load_global(self) -> None:
        with torch.no_grad():
            for name, view in self.layout.views(self.state.params).items():
                self.named[name].copy_(view)

    def run_round(self, on_progress: Callable[[dict[str, Any]], None] | None = None) -> RoundRecord:
        s, r = self.settings, self.state.round
        report = on_progress or (lambda _: None)
        started = time.perf_counter()
        self.model.train()
        losses = []
        for step in range(s.H):
            if self.stopping.is_set():
                raise Stopped(f"stopped in round {r} at inner step {step}")
            rows = round_batch(self.corpus, s.seed, r, self.key, step, s.batch)
            loss = lm_loss(self.model, rows)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.clip)
            self.optimizer.step()
            losses.append(float(loss.detach()))
            self.tokens += rows[:, 1:].numel()
            report({"phase": "train", "round": r, "step": step + 1, "loss": losses[-1]})
        train_s = time.perf_counter() - started
        x = self.state.params - self.layout.flatten(self.named)
        if s.error_feedback:
            x = x + self.residual
        before = state_hash(self.state)
        report({"phase": "average", "round": r})
        averaging = time.perf_counter()
        error, agreement, sent = "", None, 0
        try:
            result = self.client.average(r, x, before, s.round_timeout_s, self.identity)
            shared, sums, group = result.exponents, result.sums, result.group_size
            agreement = all(h == before for h in result.peer_hashes.values())
            sent = result.sent_bytes
        except AveragerError as exc:  # a group of one: keep training, say so (specs/diloco.md section 1)
            if self.stopping.is_set():
                raise Stopped(f"stopped in round {r} while averaging") from None
            error = str(exc)[:500]
            log.warning("round %d: %s; applying this peer's own pseudo-gradient", r, error)
            shared, group = grid.exponents(x, s.levels), 1
            sums = grid.quantize(x, shared, s.levels).to(torch.int32)
        allreduce_s = time.perf_counter() - averaging
        averaged = grid.average(sums, shared, group)
        if s.error_feedback:
            self.residual = grid.residual(x, grid.quantize(x, shared, s.levels), shared)
        outer_step(self.state, averaged, s.outer_lr, s.outer_momentum)
        self._load_global()
        digest = self._save()
        self.diverged = bool(error) or agreement is False
        self._publish(digest)
        tokens = s.H * s.batch * (self.corpus.shape[1] - 1)
        return RoundRecord(r, s.H, sum(losses) / len(losses), tokens, tokens / max(train_s, 1e-9), train_s, allreduce_s,
                           sent, group, bool(error),
                           agreement, digest.hex(), error)

    def _save(self) -> bytes:
        if self.checkpoint is None:
            return state_hash(self.state)
        exp_avg, exp_avg_sq, step = adamw_vectors(self.optimizer, self.named, self.layout)
        return save_checkpoint(self.checkpoint, PeerState(self.state, self.residual, exp_avg, exp_avg_sq, step, self.tokens))
