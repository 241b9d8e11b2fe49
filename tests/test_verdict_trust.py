"""Trusted verdicts: bans, conflicts with this node's own judgement, and agreement for adoption.

The node here is a stand-in with exactly what ``TrustedVerdicts`` touches (run id, peer id, real
PeerScores, the announcement registry): the verdicts are real signed envelopes and go through the
real codec, as they would from gossip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from intellect_node.crypto.identity import Identity
from intellect_node.node.roles.validator.verdict_trust import TrustedVerdicts
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec
from intellect_node.protocol.rollouts import pack_logprobs
from intellect_node.protocol.verdicts import AcceptedGroup, RejectedGroup, Verdict

RUN = "trust-test"
WORKER = Identity.generate()
ALICE, BOB, MALLORY = Identity.generate(), Identity.generate(), Identity.generate()
DIGEST = bytes(range(32))


@dataclass
class _Config:
    run_id: str = RUN
    home: Path = Path("/nonexistent")


@dataclass
class StandInNode:
    peer_id: str = field(default_factory=lambda: Identity.generate().peer_id)
    config: _Config = field(default_factory=_Config)
    scores: PeerScores = field(default_factory=PeerScores)
    handlers: dict[type, Any] = field(default_factory=dict)

    def on_announcement(self, kind: type, handler: Any) -> None:
        self.handlers[kind] = handler

    def deliver(self, verdict: Verdict, signer: Identity) -> None:
        self.handlers[Verdict](codec.decode(codec.encode(verdict, signer, lifetime_s=600), Verdict), b"")


def verdict(by: Identity, accepted=((1, (1.0, 0.0)),), rejected=(), digest: bytes = DIGEST) -> Verdict:
    return Verdict(run_id=RUN, batch_digest=digest, worker=WORKER.peer_id, policy_step=3, validator=by.peer_id,
                   accepted=tuple(AcceptedGroup(counter=c, rewards=r) for c, r in accepted),
                   rejected=tuple(RejectedGroup(counter=c, reason=why) for c, why in rejected))


def listening(own_accepted=None) -> tuple[StandInNode, TrustedVerdicts, list[str]]:
    node = StandInNode()
    woken: list[str] = []
    trusted = TrustedVerdicts(node, [ALICE.peer_id, BOB.peer_id], own_accepted=own_accepted, on_verdict=woken.append)
    trusted.listen()
    return node, trusted, woken


def test_agreeing_trusted_verdicts_are_adoptable_and_untrusted_ones_ignored() -> None:
    node, trusted, woken = listening()
    assert trusted.agreed(DIGEST.hex()) is None
    node.deliver(verdict(MALLORY, accepted=((1, (1.0, 1.0)),)), MALLORY)  # not trusted: changes nothing
    assert trusted.agreed(DIGEST.hex()) is None and woken == []
    node.deliver(verdict(ALICE), ALICE)
    node.deliver(verdict(BOB), BOB)
    adopted = trusted.agreed(DIGEST.hex())
    assert isinstance(adopted, Verdict) and adopted.accepted[0].rewards == (1.0, 0.0)
    assert woken == [DIGEST.hex()] * 2


def test_disagreeing_trusted_verdicts_are_a_conflict() -> None:
    node, trusted, _ = listening()
    node.deliver(verdict(ALICE), ALICE)
    node.deliver(verdict(BOB, accepted=((1, (1.0, 1.0)),)), BOB)  # other rewards for the same group
    assert trusted.agreed(DIGEST.hex()) is False


def test_trusted_cheat_verdict_bans_the_worker() -> None:
    node, _, _ = listening()
    node.deliver(verdict(ALICE, accepted=(), rejected=((1, "toploc"),)), ALICE)
    assert WORKER.peer_id in node.scores.banned
    assert node.scores.is_banned_for_the_run(WORKER.peer_id)  # its accepted groups and waiting batches go too


def test_stale_rejection_is_no_cheat_and_bans_nobody() -> None:
    node, _, _ = listening()
    node.deliver(verdict(ALICE, accepted=(), rejected=((1, "stale_step"),)), ALICE)
    assert not node.scores.banned


def test_cheat_verdict_against_own_acceptance_is_a_conflict_not_a_ban() -> None:
    """This node verified the batch and accepted group 1: a trusted validator calling it a cheat
    does not override the node's own recomputation."""
    node, trusted, _ = listening(own_accepted=lambda digest: {1} if digest == DIGEST.hex() else None)
    node.deliver(verdict(ALICE, accepted=(), rejected=((1, "logprobs"),)), ALICE)
    assert not node.scores.banned and trusted.conflicts == 1
    other = bytes(32)
    node.deliver(verdict(ALICE, accepted=(), rejected=((1, "logprobs"),), digest=other), ALICE)
    assert WORKER.peer_id in node.scores.banned  # a batch it never judged: the trusted verdict holds


def test_an_adopted_verdict_carries_the_workers_vouched_logprobs_for_accepted_groups_only() -> None:
    """The trainer trains adopted groups on the worker's claimed logprobs (bounded by the trusted
    validators' check 14), one per completion token, so its GRPO ratio still sees the rollout's lag."""
    from intellect_node.node.roles.validator.service import adopted_result
    from intellect_node.protocol.rollouts import RolloutBatch, RolloutGroup, SamplingSettings, pack_tokens
    from tests.support.protocol_samples import sample_completion

    claimed = [-0.25, -1.5, -0.125]
    batch = RolloutBatch(
        run_id=RUN, worker=WORKER.peer_id, policy_step=3, manifest_hash=bytes(32), engine="torch",
        sampling=SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=64),
        groups=(RolloutGroup(counter=1, task_id="t1", length_target=None, prompt_ids=pack_tokens([4]),
                             completions=(sample_completion(3, logprobs=pack_logprobs(claimed)), sample_completion(2))),
                RolloutGroup(counter=2, task_id="t2", length_target=None, prompt_ids=pack_tokens([5]),
                             completions=(sample_completion(1),))))
    result = adopted_result(batch, verdict(ALICE, accepted=((1, (1.0, 0.0)),), rejected=((2, "toploc"),)))
    accepted = {g.counter: g for g in result.groups if g.reason is None}
    assert set(accepted) == {1} and accepted[1].rewards == (1.0, 0.0)
    assert accepted[1].logprobs == (tuple(claimed), (-0.5, -0.5))
    assert [(g.counter, g.reason, g.logprobs) for g in result.groups if g.reason] == [(2, "toploc", ())]
    assert result.worker == WORKER.peer_id and result.policy_step == 3
