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
from intellect_node.node.diloco.data import GeneratedData, PeerData, peer_key
from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.outer import GlobalState, outer_step
from intellect_node.node.diloco.recipe import Recipe, make_optimizer
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.diloco.state_hash import state_hash

log = logging.getLogger(__name__)


def own_contribution(x: torch.Tensor, s: DilocoSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """This peer's grid alone, as a group of one would use it: (its own exponents, its int32 values)."""
    shared = grid.exponents(x, s.levels)
    return shared, grid.quantize(x, shared, s.levels, s.sparse_k).to(torch.int32)


def eager_point(state: GlobalState, x: torch.Tensor, s: DilocoSettings) -> torch.Tensor:
    """Where the outer parameters would go if the group's average were this peer's own
    pseudo-gradient ``x`` on the grid: an overlapped peer trains its next round from here while
    the real average travels (``state`` is untouched).

    Why not from the round's own end point: that round's progress is later put on top of the real
    θ_{r+1}, so it should be made near there, and the end point is far from it wherever the outer
    step is not plain averaging of nearly all of ``x``: Nesterov momentum, or a sparse grid (a few
    values per chunk sent, the rest left in the residual). The own average as the proxy of the
    group's is Kale, Douillard and Donchev's "eager updates" (arXiv 2502.12996), here for the local
    parameters only: the global state stays exact."""
    shared, own = own_contribution(x, s)
    preview = GlobalState(state.layout, state.params.clone(), state.momentum.clone(), state.round)
    outer_step(preview, grid.average(own, shared, 1), s.outer_lr, s.outer_momentum)
    return preview.params


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
    allreduce_attempts: int  # attempts its all-reduce took (a failed one is retried, its bytes sent again)
    group_size: int
    solo: bool
    hash_agreement: bool | None
    state_hash: str
    error: str = ""

    def line(self) -> str:
        agree = {True: "agree", False: "DIVERGED", None: "-"}[self.hash_agreement]
        return (f"round {self.round} | steps {self.inner_steps} | loss {self.loss:.4f} | "
                f"{self.tokens_per_s:,.0f} tok/s | "
                f"all-reduce {self.allreduce_s:.2f}s {self.allreduce_bytes / 2**20:.2f} MiB"
                f"{f' ({self.allreduce_attempts} attempts)' if self.allreduce_attempts > 1 else ''} | "
                f"peers {self.group_size}{' (solo)' if self.solo else ''} | hash {self.state_hash[:12]} {agree}")


@dataclass(frozen=True)
class Outcome:
    """What averaging one round gave: the group's shared grid and exact sums (or this peer's own)."""

    x: torch.Tensor
    exponents: torch.Tensor
    sums: torch.Tensor
    group: int
    error: str
    agreement: bool | None
    sent: int
    attempts: int
    seconds: float


class Pending:
    """A round's averaging running in a thread while the next round trains (``overlap``)."""

    def __init__(self, average: Callable[[torch.Tensor], Outcome], x: torch.Tensor) -> None:
        self._result: Outcome | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(average, x), daemon=True, name="diloco-average")
        self._thread.start()

    def _run(self, average: Callable[[torch.Tensor], Outcome], x: torch.Tensor) -> None:
        try:
            self._result = average(x)
        except BaseException as exc:  # handed to the round that waits for it
            self._result = exc

    def result(self) -> Outcome:
        self._thread.join()
        if isinstance(self._result, BaseException):
            raise self._result
        assert self._result is not None
        return self._result


class Stopped(Exception):
    """The peer was asked to stop: the round in progress is dropped, nothing is applied or saved."""


class DilocoPeer:
    def __init__(self, model: torch.nn.Module, settings: DilocoSettings, client: AveragerClient,
                 data: PeerData | torch.Tensor, identity: Identity, checkpoint: Path | None = None) -> None:
        """``data``: a source from ``settings.open_data()``, or the generated corpus's rows."""
        self.model, self.settings, self.client = model, settings, client
        self.data = GeneratedData(data, settings.seed, settings.batch) if isinstance(data, torch.Tensor) else data
        self.round_tokens = 0  # target tokens of the last trained round
        self.identity = identity  # the node's key: names this peer's data and signs it into rounds
        self.key = peer_key(identity.peer_id)
        self.checkpoint = checkpoint
        self.stopping = threading.Event()  # set from another thread: the round in progress is dropped
        self.named = dict(model.named_parameters())
        self.layout = Layout.of(self.named)
        self.recipe = Recipe.constant(settings.inner_lr, settings.weight_decay, settings.betas)
        self.optimizer = make_optimizer(model, self.recipe)
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
        self.pending: Pending | None = None  # overlap: the previous round's averaging, in flight
        self.anchor = self.layout.flatten(self.named)  # overlap: where the round in flight's successor started

    def adopt(self, theirs: GlobalState | None) -> bool:
        """Take ``theirs`` (the state most live members vouch for, fetched through the overlay and
        hash-checked: ``state_overlay``) when it is ahead of ours, or at our round after we
        diverged; the error-feedback residual restarts, the inner AdamW moments stay. True when
        taken; the caller then serves our (new) state."""
        if theirs is None or theirs.layout != self.layout:
            return False
        if not (theirs.round > self.state.round or (
                theirs.round == self.state.round and self.diverged and state_hash(theirs) != state_hash(self.state))):
            return False
        log.info("adopting the swarm's state at round %d (ours: round %d)", theirs.round, self.state.round)
        self.state, self.residual, self.diverged = theirs, torch.zeros_like(self.residual), False
        self._load_global()
        self._save()
        return True

    def _load_global(self) -> None:
        self._load(self.state.params)

    def _load(self, flat: torch.Tensor) -> None:
        """The model's parameters := ``flat`` (layout order)."""
        with torch.no_grad():
            for name, view in self.layout.views(flat).items():
                self.named[name].copy_(view)

    def _train(self, round_: int, report: Callable[[dict[str, Any]], None]) -> list[float]:
        """H inner AdamW steps on this peer's samples of ``round_``; the losses."""
        s = self.settings
        self.model.train()
        losses, self.round_tokens = [], 0
        for step in range(s.H):
            if self.stopping.is_set():
                raise Stopped(f"stopped in round {round_} at inner step {step}")
            loss, tokens = self.data.loss(self.model, self.data.draw(round_, self.key, step))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.clip)
            self.optimizer.step()
            losses.append(float(loss.detach()))
            self.tokens += tokens
            self.round_tokens += tokens
            report({"phase": "train", "round": round_, "step": step + 1, "loss": losses[-1]})
        return losses

    def _pseudo_gradient(self) -> torch.Tensor:
        x = self.state.params - self.layout.flatten(self.named)
        return x + self.residual if self.settings.error_feedback else x

    def _average(self, x: torch.Tensor) -> Outcome:
        """The round's exact group result for ``x``, or this peer's own (a group of one) on failure."""
        s, r = self.settings, self.state.round
        before = state_hash(self.state)
        started = time.perf_counter()
        try:
            result = self.client.average(r, x, before, s.round_timeout_s, self.identity)
            agreement = all(h == before for h in result.peer_hashes.values())
            return Outcome(x, result.exponents, result.sums, result.group_size, "", agreement, result.sent_bytes,
                           result.attempts, time.perf_counter() - started)
        except AveragerError as exc:  # a group of one: keep training, say so (specs/diloco.md section 1)
            if self.stopping.is_set():
                raise Stopped(f"stopped in round {r} while averaging") from None
            log.warning("round %d: %s; applying this peer's own pseudo-gradient", r, exc)
            shared, own = own_contribution(x, s)
            return Outcome(x, shared, own, 1, str(exc)[:500], None, 0, 0, time.perf_counter() - started)

    def _apply(self, outcome: Outcome) -> bytes:
        """The outer step with the group's average, the residual and the checkpoint; the state hash."""
        s = self.settings
        if s.error_feedback:
            self.residual = grid.residual(outcome.x, grid.quantize(outcome.x, outcome.exponents, s.levels, s.sparse_k),
                                          outcome.exponents)
        outer_step(self.state, grid.average(outcome.sums, outcome.exponents, outcome.group), s.outer_lr,
                   s.outer_momentum)
        digest = self._save()
        self.diverged = bool(outcome.error) or outcome.agreement is False
        return digest

    def _record(self, round_: int, losses: list[float], train_s: float, outcome: Outcome, digest: bytes,
                waited_s: float) -> RoundRecord:
        tokens = self.round_tokens
        return RoundRecord(round_, self.settings.H, sum(losses) / len(losses), tokens, tokens / max(train_s, 1e-9),
                           train_s, waited_s, outcome.sent, outcome.attempts, outcome.group, bool(outcome.error),
                           outcome.agreement, digest.hex(), outcome.error)

    def run_round(self, on_progress: Callable[[dict[str, Any]], None] | None = None) -> RoundRecord | None:
        """One round: with ``overlap``, the delayed variant below; else train, average, step (blocking)."""
        report = on_progress or (lambda _: None)
        if self.settings.overlap:
            return self._overlapped_round(report)
        r, started = self.state.round, time.perf_counter()
        losses = self._train(r, report)
        train_s = time.perf_counter() - started
        report({"phase": "average", "round": r})
        outcome = self._average(self._pseudo_gradient())
        digest = self._apply(outcome)
        self._load_global()
        return self._record(r, losses, train_s, outcome, digest, outcome.seconds)

    def finish(self) -> RoundRecord | None:
        """Overlap: wait for the round in flight and apply it (the run's last outer step)."""
        if self.pending is None:
            return None
        waited = time.perf_counter()
        outcome = self.pending.result()
        self.pending = None
        applied = self.state.round
        progress = self.layout.flatten(self.named) - self.anchor
        digest = self._apply(outcome)
        self._load(self.state.params + progress)
        return self._record(applied, [float("nan")], 0.0, outcome, digest, time.perf_counter() - waited)

    def _overlapped_round(self, report: Callable[[dict[str, Any]], None]) -> RoundRecord | None:
        """One-round-delayed outer step: the average of round r travels while round r+1 trains.

        Round r+1's inner steps start at once, from an estimate of θ_{r+1} (``_eager_point``)
        instead of waiting for it; when θ_{r+1} arrives, the progress made meanwhile is kept on
        top of it (local := θ_{r+1} + (φ - φ_start)), and round r+1's pseudo-gradient is that progress. The
        outer state (θ, m, round) is still the same bits on every peer; only local params lag.
        Returns the record of the outer step applied now, or None on the first call."""
        training = self.state.round + (1 if self.pending is not None else 0)
        started = time.perf_counter()
        losses = self._train(training, report)
        train_s = time.perf_counter() - started
        record = None
        if self.pending is not None:
            report({"phase": "average", "round": self.state.round})
            waited = time.perf_counter()
            outcome = self.pending.result()
            self.pending = None
            waited_s = time.perf_counter() - waited
            progress = self.layout.flatten(self.named) - self.anchor
            applied = self.state.round
            digest = self._apply(outcome)
            if self.diverged:  # start over from θ; the next round re-syncs before it launches anything
                self._load_global()
                return self._record(applied, losses, train_s, outcome, digest, waited_s)
            self._load(self.state.params + progress)
            record = self._record(applied, losses, train_s, outcome, digest, waited_s)
        x = self._pseudo_gradient()
        self.pending = Pending(self._average, x)
        self.anchor = eager_point(self.state, x, self.settings)
        self._load(self.anchor)
        return record
    def _save(self) -> bytes:
        if self.checkpoint is None:
            return state_hash(self.state)
        exp_avg, exp_avg_sq, step = adamw_vectors(self.optimizer, self.named, self.layout)
        return save_checkpoint(self.checkpoint, PeerState(self.state, self.residual, exp_avg, exp_avg_sq, step,
                                                          self.tokens))
