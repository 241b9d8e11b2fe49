"""Verdicts from validators this node trusts: bans, and (for a trainer) verification it can skip.

A node trusts itself and every ``--trust-validator`` peer. A trusted verdict that proves a cheat
bans the worker, unless this node judged the same batch itself and accepted the very groups the
verdict calls cheats: two trusted judgements then conflict, and the node keeps its own (it did
the recomputation; a verdict is only a claim) and counts the conflict.

A trainer that verifies only a fraction of batches (``--verify-fraction``) adopts trusted verdicts
for the rest: when every trusted verdict on a batch agrees (same accepted counters, same rewards,
same rejections) their accepted groups are used as if the trainer had accepted them; when they
disagree, or none arrives within the wait, the trainer verifies the batch itself.
specs/validation.md section 5 is normative.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from intellect_node.protocol import codec
from intellect_node.protocol.verdicts import Verdict

if TYPE_CHECKING:
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)
MAX_BATCHES_KEPT = 10_000  # trusted verdicts remembered for adoption (oldest dropped first)
OwnAccepted = Callable[[str], set[int] | None]  # batch digest -> counters this node accepted, None if not judged


def ban_worker(node: NodeContext, peer_id: str, why: str) -> None:
    """Ban ``peer_id`` for the run: the receiver ignores its streams, its gossip is dropped."""
    if peer_id != node.peer_id:
        node.scores.ban(peer_id, f"worker proven to cheat: {why}")


def _opinion(verdict: Verdict) -> tuple:
    """What a verdict says about a batch, comparable across validators."""
    return (tuple(sorted((g.counter, g.rewards) for g in verdict.accepted)),
            tuple(sorted((g.counter, g.reason) for g in verdict.rejected)))


class TrustedVerdicts:
    """Receives verdict gossip; register with ``listen`` before ``intellect_node.node.run``."""

    def __init__(self, node: NodeContext, trusted: Iterable[str], own_accepted: OwnAccepted | None = None,
                 on_verdict: Callable[[str], None] | None = None) -> None:
        self.node = node
        self.trusted = set(trusted)
        self.own_accepted = own_accepted
        self.on_verdict = on_verdict  # woken with the batch digest of each stored trusted verdict
        self.by_batch: OrderedDict[str, dict[str, Verdict]] = OrderedDict()
        self.conflicts = 0

    def listen(self) -> None:
        self.node.on_announcement(Verdict, self._on_verdict)

    def _on_verdict(self, signed: codec.Signed[Verdict], raw: bytes) -> bool:
        verdict = signed.message
        if verdict.run_id != self.node.config.run_id:
            return True
        own = verdict.validator == self.node.peer_id
        if not own and verdict.validator not in self.trusted:
            return True  # relayed, changes nothing here
        digest = verdict.batch_digest.hex()
        if verdict.cheats:
            self._judge_cheat(verdict, digest, own)
        if not own:
            self.by_batch.setdefault(digest, {})[verdict.validator] = verdict
            self.by_batch.move_to_end(digest)
            while len(self.by_batch) > MAX_BATCHES_KEPT:
                self.by_batch.popitem(last=False)
            if self.on_verdict is not None:
                self.on_verdict(digest)
        return True

    def _judge_cheat(self, verdict: Verdict, digest: str, own: bool) -> None:
        accused = {g.counter for g in verdict.rejected if g.reason in verdict.cheats}
        mine = self.own_accepted(digest) if self.own_accepted is not None and not own else None
        if mine is not None and accused & mine:
            self.conflicts += 1
            log.warning("validator %s calls groups %s of batch %s cheats (%s), which this node verified and "
                        "accepted: keeping its own judgement, no ban", verdict.validator, sorted(accused & mine),
                        digest[:12], ", ".join(verdict.cheats))
            return
        who = "own verdict" if own else f"verdict by {verdict.validator}"
        ban_worker(self.node, verdict.worker, f"{', '.join(verdict.cheats)} ({who})")

    def agreed(self, digest: str) -> Verdict | None | bool:
        """The trusted verdicts on ``digest``: one of them if all agree, False if they conflict,
        None if there is none yet."""
        verdicts = list(self.by_batch.get(digest, {}).values())
        if not verdicts:
            return None
        if len({_opinion(v) for v in verdicts}) > 1:
            return False
        return verdicts[0]


def listen_for_verdicts(node: NodeContext, trusted: Iterable[str]) -> TrustedVerdicts:
    """Ban workers that a trusted validator (or this node) proved to cheat; call before ``intellect_node.node.run``."""
    verdicts = TrustedVerdicts(node, trusted)
    verdicts.listen()
    return verdicts
