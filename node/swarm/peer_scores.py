"""Rejection counters and per-peer penalties.

Every refused network input is counted by its ``reason`` (the labels of ``intellect_node.protocol.errors``) and
charged to the peer that delivered it. A peer whose penalty passes the ban threshold is banned: the
node disconnects it, blacklists it in gossip and ignores its streams. Penalties decay, so an honest
peer with a clock hiccup or a flaky link recovers.

Two kinds of ban (specs/wire.md section 5). A peer that was ever charged for input no honest peer
sends (forged or malformed: ``PROVEN_COST`` points or more), or that a verdict proved a cheat, is
banned for the run, and the ban is written to ``ban_log`` so it survives a restart. A peer that
reached the threshold only by what an honest peer does when it, or we, are slow (timeouts, streams
closed unanswered, slots held) is banned for now: until its points decay below half the threshold,
and never written down. Before that split, a node whose loop stalled under load could charge an
honest peer's streams as timeouts (tests/test_loop_deadline.py) up to a ban it kept for good, across
restarts, and two peers resetting each other's streams charged each other's unanswered ones.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from intellect_node.node.home.durable import append_durably

log = logging.getLogger(__name__)

# Penalty points by reason; anything unlisted costs DEFAULT_PENALTY. specs/wire.md section 5 is the
# normative table and says why stale, superseded and newer-version input costs nothing;
# tests/test_codec.py checks that the two agree.
PENALTIES: dict[str, float] = {
    "bad_signature": 60.0,
    "signer_mismatch": 60.0,
    "unauthorized_signer": 60.0,  # a manifest signed by a key other than the run's trainer
    "bad_shard": 60.0,  # shard bytes that contradict the signed manifest's hash
    "bad_delta": 60.0,  # a delta body that contradicts the signed manifest's hash (specs/deltas.md)
    "malformed": 25.0,
    "malformed_body": 25.0,
    "oversize": 25.0,
    "expired": 0.0,
    "replayed": 0.0,
    "unknown_type": 0.0,  # a newer version's message: forwarded by honest peers, not evidence
    "unjudgeable": 0.0,  # e.g. a manifest at a node that knows no trainer: honest peers forward it
    "newer_version": 0.0,  # a newer protocol version: an upgraded honest peer
    "from_future": 5.0,
    "timeout": 5.0,
    # An exception escaped a stream handler (node/swarm/guard.py): input the handler could not
    # parse, as for malformed input; libp2p's own handlers raise it for garbage.
    "handler_error": 25.0,
    # A stream refused because the peer (or its IP) already holds all slots of that protocol:
    # cheap for us, but a peer that keeps trying is flooding, so it costs a little.
    "no_slot": 1.0,
    "member_table_full": 0.0,  # an honest relay forwards adverts our full table refuses
    # Closed before the first byte: what a busy or restarting honest peer, or one that banned us,
    # does too; at 10 points two honest demo nodes banned each other within minutes. Retried with
    # back-off by the caller; one that never answers still costs a little.
    "unanswered": 1.0,
}
DEFAULT_PENALTY = 10.0
# Forged or malformed input: a peer charged this much for one input is not an honest peer in trouble.
PROVEN_COST = 25.0
# A ban for now is lifted once the peer's decayed points fall below this share of the threshold.
LIFT_SHARE = 0.5


@dataclass
class PeerScores:
    ban_threshold: float = 100.0
    half_life_s: float = 600.0
    on_ban: Callable[[str], None] | None = None
    on_lift: Callable[[str], None] | None = None  # a ban for now ended
    # one JSON line per ban, appended (fsynced) as it happens and read back by ``restore``: a
    # proven cheat stays banned for the run across restarts
    ban_log: Path | None = None
    rejections: Counter[str] = field(default_factory=Counter)
    _penalty: dict[str, tuple[float, float]] = field(default_factory=dict)  # peer -> (points, at)
    banned: set[str] = field(default_factory=set)
    banned_for_now: set[str] = field(default_factory=set)  # the part of ``banned`` that will be lifted
    _proven: set[str] = field(default_factory=set)  # charged at least once with PROVEN_COST or more

    def penalty(self, peer_id: str, now: float | None = None) -> float:
        points, at = self._penalty.get(peer_id, (0.0, 0.0))
        elapsed = (time.monotonic() if now is None else now) - at
        return points * 0.5 ** (max(elapsed, 0.0) / self.half_life_s)

    def reject(self, peer_id: str | None, reason: str, detail: str = "") -> None:
        """Count a refused input and charge the peer that sent it (None when unknown)."""
        self.rejections[reason] += 1
        cost = PENALTIES.get(reason, DEFAULT_PENALTY)
        log.log(logging.INFO if cost else logging.DEBUG, "rejected input from %s: %s %s",
                peer_id or "unknown peer", reason, detail[:200])
        if peer_id is None or not cost:
            return
        # A banned peer gathers no more points (a ban for now must be able to end: two peers that
        # ban each other would otherwise keep charging each other's unanswered streams), unless it
        # sends forged or malformed input: then a ban for now becomes a ban for the run.
        if peer_id in self.banned and (peer_id not in self.banned_for_now or cost < PROVEN_COST):
            return
        if cost >= PROVEN_COST:
            self._proven.add(peer_id)
        now = time.monotonic()
        points = self.penalty(peer_id, now) + cost
        self._penalty[peer_id] = (points, now)
        if points < self.ban_threshold:
            return
        why = f"penalty {points:.0f}, last reason {reason}"
        if peer_id in self._proven:
            self.ban(peer_id, why)
        elif peer_id not in self.banned:
            self._ban_for_now(peer_id, why)

    def ban(self, peer_id: str, why: str) -> None:
        """The ban for the run: a proven cheat, or points past the threshold with forged or malformed
        input among them. Written to ``ban_log``; a ban for now becomes this one."""
        if peer_id in self.banned and peer_id not in self.banned_for_now:
            return
        self.banned_for_now.discard(peer_id)
        if self.ban_log is not None:
            try:
                append_durably(self.ban_log, json.dumps({"peer_id": peer_id, "why": why[:200], "at": time.time()}))
            except OSError as exc:
                log.warning("could not record the ban of %s: %s", peer_id, exc)
        self._impose(peer_id, why)

    def _ban_for_now(self, peer_id: str, why: str) -> None:
        self.banned_for_now.add(peer_id)
        self._impose(peer_id, f"for now (until its points halve; nothing it sent was forged): {why}")

    def _impose(self, peer_id: str, why: str) -> None:
        """What both kinds of ban do: the peer is banned, logged, and ``on_ban`` cuts it off."""
        self.banned.add(peer_id)
        log.warning("banned peer %s: %s", peer_id, why)
        if self.on_ban is not None:
            self.on_ban(peer_id)

    def is_banned(self, peer_id: str) -> bool:
        if peer_id in self.banned_for_now:
            self._lift_if_due(peer_id)
        return peer_id in self.banned

    def is_banned_for_the_run(self, peer_id: str) -> bool:
        """Banned for forged or malformed input or a proven cheat: what it delivered and was accepted
        is dropped too. A peer banned for now was only slow: what it delivered was checked on its
        own merits and stays."""
        return peer_id in self.banned and peer_id not in self.banned_for_now

    def lift_due(self) -> list[str]:
        """Lift every ban for now whose points have decayed below the lift line (the node's upkeep
        calls it each second, so a lifted peer's gossip comes back without waiting for its stream)."""
        return [peer_id for peer_id in list(self.banned_for_now) if self._lift_if_due(peer_id)]

    def _lift_if_due(self, peer_id: str) -> bool:
        if self.penalty(peer_id) >= self.ban_threshold * LIFT_SHARE:
            return False
        self.banned_for_now.discard(peer_id)
        self.banned.discard(peer_id)
        log.info("lifted the ban for now of %s", peer_id)
        if self.on_lift is not None:
            self.on_lift(peer_id)
        return True

    def restore(self, max_lines: int = 1_000_000) -> int:
        """Read the bans of earlier runs of this node from ``ban_log`` (without ``on_ban``: the
        caller applies them once its transports exist); a damaged line is skipped. Returns how
        many peers are banned now."""
        if self.ban_log is None:
            return 0
        try:
            with open(self.ban_log, encoding="utf-8", errors="replace") as handle:
                for number, line in enumerate(handle):
                    if number >= max_lines:
                        break
                    try:
                        peer_id = json.loads(line)["peer_id"]
                    except (ValueError, KeyError, TypeError):
                        continue
                    if type(peer_id) is str and len(peer_id) <= 128:
                        self.banned.add(peer_id)
        except FileNotFoundError:
            pass
        return len(self.banned)
