"""Running a node as a process: identity, hardware, logging, and a clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
from intellect_node.crypto.identity import load_or_create_identity
from intellect_node.node.app.config import InferenceOptions, NodeConfig
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.swarm.hardware import detect_hardware
from intellect_node.node.swarm.host import quiet_libp2p_logs

if TYPE_CHECKING:
    from intellect_node.node.roles.trainer.service import TrainerOptions
    from intellect_node.node.roles.validator.service import ValidatorOptions

log = logging.getLogger(__name__)
RECEIVER_ROLES = frozenset({"trainer", "validator"})


def setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=numeric, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    quiet_libp2p_logs(verbose=numeric <= logging.DEBUG)


async def _until_signal(cancel: Callable[[], None]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            cancel()
            return


def run_node(config: NodeConfig, on_ready: Callable[[list[str]], None], shards: ShardConfig | None = None,
             inference: InferenceOptions | None = None, validator: ValidatorOptions | None = None,
             trusted_validators: tuple[str, ...] = (), trainer: TrainerOptions | None = None) -> None:
    """Run a node until SIGINT or SIGTERM; ``on_ready`` receives its listen multiaddrs.

    With ``shards`` the node also runs the weight broadcast overlay (node.shards); trainers and
    validators receive rollout batches into ``<home>/inbox``; with ``inference`` it generates them;
    with ``trainer`` it verifies them and trains (the trainer's checks replace a validator's).
    """
    from intellect_node.node.rollouts.exchange import RolloutReceiver
    from intellect_node.node.rollouts.inbox import RolloutInbox
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.swarm.runtime import (
        Node,  # libp2p is imported only by commands that run a node
    )

    config.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    identity, created = load_or_create_identity(config.layout.identity_key)
    if created:
        log.info("created a new identity %s at %s", identity.peer_id, config.layout.identity_key)
    node = Node(config, identity, detect_hardware(config.home))
    shard_service = ShardService(node, shards) if shards is not None else None  # registers gossip handlers
    if shard_service is not None:
        node.services.append(shard_service)
    if RECEIVER_ROLES & set(config.roles):
        receiver = RolloutReceiver(RolloutInbox(config.layout.inbox))
        node.services.append(receiver)
    if trainer is not None:  # judges the inbox itself, then trains (node/roles/trainer/service.py)
        from intellect_node.node.roles.trainer.service import TrainerService
        from intellect_node.node.tasks.spec import load_task_spec

        if shard_service is None:
            raise ValueError("the trainer role needs the shard overlay to publish its checkpoints")
        trainer_service = TrainerService(node, shard_service, trainer, load_task_spec(trainer.task_spec))
        receiver.on_stored = trainer_service.validator.notify
        node.services.append(trainer_service)
    elif validator is not None:  # judges the receiver's inbox (node/roles/validator/service.py)
        from intellect_node.node.roles.validator.service import ValidatorService
        from intellect_node.node.tasks.spec import load_task_spec

        if shard_service is None:
            raise ValueError("the validator role needs the shard overlay for its checkpoints")
        validator_service = ValidatorService(node, shard_service, validator, load_task_spec(validator.task_spec),
                                             async_window=config.run.async_level)
        receiver.on_stored = validator_service.notify
        node.services.append(validator_service)
    elif trusted_validators:  # bans the workers these validators prove to cheat
        from intellect_node.node.roles.validator.verdict_trust import (
            listen_for_verdicts,
        )

        listen_for_verdicts(node, trusted_validators)
    if inference is not None:
        from intellect_node.node.roles.inference.worker import InferenceWorker
        from intellect_node.node.tasks.spec import load_task_spec

        if shard_service is None:
            raise ValueError("the inference role needs the shard overlay for its checkpoints")
        node.services.append(InferenceWorker(shard_service, inference.model_dir, load_task_spec(inference.task_spec),
                                             engine=inference.engine, async_window=config.run.async_level))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_signal, nursery.cancel_scope.cancel)
            addrs = await nursery.start(node.run)
            on_ready(addrs)

    trio.run(main)
    log.info("node %s stopped", identity.peer_id)
