"""Work commitment: a worker's signed promise of how many groups it will deliver for a step.

Sent to every judge (validators and trainer) before the step's checkpoint exists. Its only use
is that the task assignment mixes in the checkpoint's manifest_hash (``protocol.assignment``):
a judge credits a group of (worker, step) only under a commitment it stored before it knew
checkpoint ``step``, so no key, counter or step can be chosen by looking at its task, and a
committed counter never delivered is settled as reward 0 (specs/rollouts.md, "Committed
assignments"). Fixed size: a few hundred bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from intellect_node.protocol.errors import SignerMismatch
from intellect_node.protocol.messages import PEER_ID_PATTERN, RUN_ID_PATTERN, Message
from intellect_node.protocol.schema import Int, Str, wire

MAX_COMMITTED_GROUPS = 2**20  # the run spec's max_groups_per_step bound; a judge caps at its run's


@dataclass(frozen=True)
class WorkCommitment(Message):
    TYPE: ClassVar[str] = "work_commitment"
    MAX_SIZE: ClassVar[int] = 1024
    MAX_LIFETIME_S: ClassVar[float] = 3600.0

    run_id: str = wire(Str(64, pattern=RUN_ID_PATTERN))
    worker: str = wire(Str(64, pattern=PEER_ID_PATTERN))
    step: int = wire(Int(0, 2**40))
    groups: int = wire(Int(1, MAX_COMMITTED_GROUPS))

    def check_signer(self, signer_peer_id: str) -> None:
        if self.worker != signer_peer_id:
            raise SignerMismatch("commitment names a worker other than its signer")
