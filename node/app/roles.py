"""Role assembly: one table maps each role a node is asked to take to the services that do it.

The CLI parses and checks the options; this module alone decides which services a node runs, so a
combination of roles is handled in one place (a trainer also validates: its own verification is
the validator, so asking for both adds nothing and says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from intellect_node.node.app.config import InferenceOptions, NodeConfig
from intellect_node.node.shards.config import ShardConfig

if TYPE_CHECKING:
    from intellect_node.node.diloco.settings import DilocoSettings
    from intellect_node.node.roles.trainer.config import TrainerOptions
    from intellect_node.node.roles.validator.config import ValidatorOptions
    from intellect_node.node.rollouts.exchange import RolloutReceiver
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.swarm.runtime import Node, Service
    from intellect_node.node.tasks.schema import Task
    from intellect_node.protocol.rollout_shape import RolloutShape
    from intellect_node.protocol.run_spec import RunSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoleOptions:
    """What each role needs beyond the node; None where the role only relays (no ``--model``)."""

    shards: ShardConfig | None = None
    inference: InferenceOptions | None = None
    validator: ValidatorOptions | None = None
    trainer: TrainerOptions | None = None
    trusted_validators: tuple[str, ...] = ()
    diloco: DilocoSettings | None = None


@dataclass
class Assembly:
    """What the role builders share: the node, its options, and the services others hand work to."""

    node: Node
    config: NodeConfig
    options: RoleOptions
    overlay: ShardService | None = None
    receiver: RolloutReceiver | None = None
    verifier: Any = None  # the ValidatorService judging this node's inbox, once one is built
    services: list[Service] = field(default_factory=list)

    def rollout_settings(self) -> RolloutShape:
        """The run's rollout shape ([run]): what workers generate and every verifier judges by."""
        from intellect_node.protocol.rollout_shape import RolloutShape

        run = self.config.run
        return RolloutShape(group_size=run.group_size, max_tokens=run.max_tokens, temperature=float(run.temperature))

    def run_spec(self, tasks: list[Task], async_window: int) -> RunSpec:
        """The spec this node judges by: the run's rollout shape and calibrated engine pairs ([run]).
        Built by each judge until the overlay distributes the authority's signed spec."""
        from intellect_node.protocol.run_spec import build_run_spec

        return build_run_spec(run_id=self.config.run_id, authority=self.node.peer_id, tasks=tasks,
                              settings=self.rollout_settings(), async_window=async_window,
                              engines=self.config.run.engines)

    def require_overlay(self, role: str) -> ShardService:
        if self.overlay is None:
            raise ValueError(f"the {role} role needs the shard overlay for its checkpoints")
        return self.overlay


def _trainer(a: Assembly) -> None:
    """Verifies the inbox itself (the validator's checks, node/roles/trainer/service.py), then trains."""
    if a.options.trainer is None:
        return
    from intellect_node.node.roles.trainer.service import TrainerService
    from intellect_node.node.tasks.spec import load_task_spec

    options = a.options.trainer
    tasks = load_task_spec(options.task_spec)
    service = TrainerService(a.node, a.require_overlay("trainer"), options, tasks, rollout=a.rollout_settings(),
                             run_spec=a.run_spec(tasks, options.async_level))
    a.verifier = service.validator
    a.services.append(service)


def _validator(a: Assembly) -> None:
    """Judges the receiver's inbox, signs and gossips verdicts (node/roles/validator/service.py)."""
    if a.options.validator is None:
        return
    if a.verifier is not None:
        log.info("the trainer's own verification is this node's validator: one verifier judges the inbox")
        return
    from intellect_node.node.roles.validator.service import ValidatorService
    from intellect_node.node.tasks.spec import load_task_spec

    tasks = load_task_spec(a.options.validator.task_spec)
    service = ValidatorService(a.node, a.require_overlay("validator"), a.options.validator, tasks,
                               async_window=a.config.run.async_level, settings=a.rollout_settings(),
                               run_spec=a.run_spec(tasks, a.config.run.async_level))
    a.verifier = service
    a.services.append(service)


def _inference(a: Assembly) -> None:
    """Generates, proves and delivers rollouts on the newest verified checkpoint."""
    if a.options.inference is None:
        return
    from intellect_node.node.roles.inference.worker import InferenceWorker
    from intellect_node.node.tasks.spec import load_task_spec

    options = a.options.inference
    a.services.append(InferenceWorker(a.require_overlay("inference"), options.model_dir,
                                      load_task_spec(options.task_spec), engine=options.engine,
                                      settings=a.rollout_settings(), async_window=a.config.run.async_level,
                                      groups_per_step=options.groups_per_step))


def _diloco(a: Assembly) -> None:
    """DiLoCo pretraining: inner steps here, the exact group average in a hivemind child process."""
    if a.options.diloco is None:
        return
    from intellect_node.node.diloco.service import DilocoService

    a.services.append(DilocoService(a.config.layout.diloco, a.config.run_id, a.options.diloco))


# In this order: the trainer's verifier must exist before the validator role looks for one.
# "seeder" (a light member, no model) has no builder: the swarm and the overlay every node runs are its whole job.
ROLE_BUILDERS: dict[str, Callable[[Assembly], None]] = {
    "trainer": _trainer,
    "validator": _validator,
    "inference": _inference,
    "diloco": _diloco,
}


def assemble(node: Node, config: NodeConfig, options: RoleOptions) -> list[Service]:
    """The services ``node`` runs for ``config.roles``: overlay, rollout inbox, then each role's."""
    from intellect_node.node.rollouts.exchange import RECEIVER_ROLES, RolloutReceiver
    from intellect_node.node.rollouts.inbox import shared_inbox
    from intellect_node.node.shards.service import ShardService
    from intellect_node.protocol.rollouts import RolloutAnnouncement

    a = Assembly(node, config, options)
    if options.shards is not None:
        a.overlay = ShardService(node, options.shards)  # registers its gossip handlers now
        a.services.append(a.overlay)
    if RECEIVER_ROLES & set(config.roles):
        a.receiver = RolloutReceiver(shared_inbox(config.layout.inbox))
        node.on_announcement(RolloutAnnouncement, a.receiver.on_announcement)
        a.services.append(a.receiver)
    for role, build in ROLE_BUILDERS.items():
        if role in config.roles:
            build(a)
    if a.receiver is not None and a.verifier is not None:
        a.receiver.on_stored = a.verifier.notify
        a.receiver.on_commitment = a.verifier.offer_commitment
    elif options.trusted_validators:  # no verifier here: ban the workers these validators prove to cheat
        from intellect_node.node.roles.validator.verdict_trust import (
            listen_for_verdicts,
        )

        listen_for_verdicts(node, options.trusted_validators)
    return a.services
