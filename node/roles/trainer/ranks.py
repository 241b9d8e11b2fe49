"""One trainer in N processes: rank 0 leads, the other ranks follow its learner calls.

The rest of the node sees one trainer: only rank 0 runs the node (key, networking, verification,
pool, state file, publishing). Its ``TrainerService`` holds a ``LeadLearner``, which announces
every call that touches the weights or the step (step, bridge, state, weights, load) to the followers before running
it, so all ranks issue the same collectives in the same order; a follower only repeats them.

Announcements travel on a process group of their own with a long timeout: a follower waits for
the next one as long as the pool takes to fill, while the collectives inside a call keep the
default group's timeout, so a dead rank still surfaces as an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from intellect_node.node.roles.trainer.config import LossConfig, OptimConfig, RewardConfig
from intellect_node.node.roles.trainer.groups import TrainingGroup
from intellect_node.node.roles.trainer.learner import GRPOLearner
from intellect_node.node.roles.trainer.sharded import ShardedLearner

ANNOUNCE_TIMEOUT = timedelta(days=7)
_announcements: dist.ProcessGroup | None = None


def _channel() -> dist.ProcessGroup:
    """The announcement group; created collectively (every rank calls this once, at set-up)."""
    global _announcements
    if _announcements is None:
        _announcements = dist.new_group(backend="gloo", timeout=ANNOUNCE_TIMEOUT)
    return _announcements


def _announce(message: Any = None) -> Any:
    """Rank 0's ``message``, on every rank."""
    box = [message]
    dist.broadcast_object_list(box, src=0, group=_channel())
    return box[0]


def distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _sharded(model: nn.Module, pad_id: int, setup: dict[str, Any], reference: nn.Module | None) -> ShardedLearner:
    """Rank 0's weights on every rank, then sharded: followers start from a model built from the
    config alone, so no other machine needs the model directory."""
    for module in (model, reference):
        if module is not None:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)
    mesh = init_device_mesh(next(model.parameters()).device.type, (dist.get_world_size(),))
    return ShardedLearner(model, pad_id, mesh, optim=setup["optim"], loss=setup["loss"], rewards=setup["rewards"],
                          reference=reference, seed=setup["seed"])


def make_learner(model: nn.Module, pad_id: int, *, optim: OptimConfig, loss: LossConfig, rewards: RewardConfig,
                 reference: nn.Module | None, seed: int) -> GRPOLearner | LeadLearner:
    """The service's learner: a plain one in one process, a ``LeadLearner`` on rank 0 of several."""
    if not distributed():
        return GRPOLearner(model, pad_id, optim=optim, loss=loss, rewards=rewards, reference=reference, seed=seed)
    setup = {"config": model.config, "pad_id": pad_id, "optim": optim, "loss": loss, "rewards": rewards,
             "seed": seed, "reference": reference is not None}
    _announce(setup)
    return LeadLearner(_sharded(model, pad_id, setup, reference))


class LeadLearner:
    """Rank 0's view of the sharded learner, with ``GRPOLearner``'s interface for the service."""

    def __init__(self, learner: ShardedLearner) -> None:
        self.learner = learner
        self._plain: nn.Module | None = None

    @property
    def updates(self) -> int:
        return self.learner.updates

    def step(self, groups: Sequence[TrainingGroup]) -> dict[str, float]:
        _announce(("step", list(groups)))
        return self.learner.step(groups)

    def bridge(self) -> None:
        _announce(("bridge", None))
        self.learner.bridge()

    def state_dict(self) -> dict[str, Any]:
        _announce(("state_dict", None))
        return self.learner.state_dict()

    def weights(self) -> dict[str, Any]:
        _announce(("weights", None))
        return self.learner.weights()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _announce(("load_state_dict", None))
        self.learner.load_state_dict(state)

    def inference_model(self) -> nn.Module:
        """A plain copy of the policy on rank 0, to generate with (evaluation): a sharded model's
        forward would need every rank. Built once, refreshed from the gathered weights per call."""
        if self._plain is None:
            from transformers import AutoModelForCausalLM

            self._plain = AutoModelForCausalLM.from_config(self.learner.model.config).eval()
        self._plain.load_state_dict(self.weights())
        return self._plain


def release() -> None:
    """Rank 0, once its node is done: the followers return from ``follow``, wherever they wait."""
    _announce(None)
    _close_channel()


def _close_channel() -> None:
    """Every rank, at the release: meet once more, then tear the announcement group down here and
    now. Left to interpreter exit, a group's gloo threads were once destroyed still joinable
    (``terminate called without an active exception``: a follower killed by SIGABRT in CI)."""
    global _announcements
    if _announcements is not None:
        dist.barrier(group=_announcements)
        dist.destroy_process_group(_announcements)
        _announcements = None


def follow() -> None:
    """A follower rank's whole life: build the learner rank 0 describes, repeat its calls until
    it stops."""
    from transformers import AutoModelForCausalLM

    setup = _announce()
    if setup is None:
        _close_channel()
        return
    model = AutoModelForCausalLM.from_config(setup["config"])
    reference = AutoModelForCausalLM.from_config(setup["config"]).eval() if setup["reference"] else None
    learner = _sharded(model, setup["pad_id"], setup, reference)
    while True:
        message = _announce()
        if message is None:
            _close_channel()
            return
        command, groups = message
        if command == "step":
            learner.step(groups)
        elif command == "bridge":
            learner.bridge()
        elif command == "state_dict":
            learner.state_dict()
        elif command == "weights":
            learner.weights()
        elif command == "load_state_dict":
            learner.load_state_dict(None)
        else:
            raise ValueError(f"unknown announcement {command!r}")
