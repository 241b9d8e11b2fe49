"""Role assembly (node/app/roles.py): one table decides which services a node runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from intellect_node.node.app.config import InferenceOptions, NodeConfig
from intellect_node.node.app.roles import RoleOptions, assemble
from intellect_node.node.shards.config import ShardConfig
from tests.support.inprocess_nodes import make_node


def test_relay_only_roles_run_the_overlay_and_the_inbox(tmp_path: Path) -> None:
    node = make_node(tmp_path, "relay", "assembly-run")
    config = NodeConfig(dataclasses.replace(node.config, run_id="assembly-run", roles=("inference", "validator")))
    shards = ShardConfig(data_dir=config.layout.shards)
    services = assemble(node, config, RoleOptions(shards=shards))
    assert [s.name for s in services] == ["shards", "rollouts"]
    assert services[1].on_stored is None  # no verifier on this node: nothing judges the inbox here


def test_a_role_that_needs_checkpoints_refuses_to_run_without_the_overlay(tmp_path: Path) -> None:
    node = make_node(tmp_path, "worker", "assembly-run")
    config = NodeConfig(dataclasses.replace(node.config, run_id="assembly-run", roles=("inference",)))
    options = RoleOptions(inference=InferenceOptions(model_dir=tmp_path, task_spec="toy:seed=0,count=4"))
    with pytest.raises(ValueError, match="inference role needs the shard overlay"):
        assemble(node, config, options)


def test_the_runs_rollout_shape_reaches_the_worker_and_the_validator(tmp_path: Path) -> None:
    """[run] max_tokens, group_size and temperature: what the worker generates is what the validator's spec
    demands (a mismatch would have every honest batch refused)."""
    from intellect_node.node.app.config import RunConfig
    from intellect_node.node.roles.validator.config import ValidatorOptions

    node = make_node(tmp_path, "both", "assembly-run")
    config = NodeConfig(dataclasses.replace(node.config, run_id="assembly-run", roles=("inference", "validator")),
                        run=RunConfig(max_tokens=128, group_size=4, temperature=0.5))
    shards = ShardConfig(data_dir=config.layout.shards)
    tasks = "toy:seed=0,count=4"
    options = RoleOptions(shards=shards, inference=InferenceOptions(model_dir=tmp_path, task_spec=tasks),
                          validator=ValidatorOptions(model_dir=tmp_path, task_spec=tasks))
    services = {s.name: s for s in assemble(node, config, options)}
    worker, validator = services["inference"], services["validator"]
    assert (worker.settings.max_tokens, worker.settings.group_size, worker.settings.temperature) == (128, 4, 0.5)
    spec = validator.run_context.spec
    assert (spec.max_tokens, spec.group_size, spec.temperature) == (128, 4, 0.5)
    assert spec.engines == config.run.engines


def test_a_trainer_asked_to_validate_too_runs_one_verifier(tmp_path: Path) -> None:
    """Trainer and validator roles on one node: the trainer's own verification judges the inbox,
    so no second validator service judges (and charges) every batch twice."""
    from intellect_node.node.app.config import RunConfig
    from intellect_node.node.roles.trainer.config import TrainerOptions
    from intellect_node.node.roles.validator.config import ValidatorOptions
    from intellect_node.protocol.run_spec import TORCH_TORCH

    node = make_node(tmp_path, "trainer", "assembly-run")
    wide = dataclasses.replace(TORCH_TORCH, sampling_slack=0.5, margin_noise=0.02)  # a calibrated bf16 pair
    config = NodeConfig(dataclasses.replace(node.config, run_id="assembly-run", roles=("trainer", "validator")),
                        run=RunConfig(engines=(wide,)))
    shards = ShardConfig(data_dir=config.layout.shards, publish_dir=tmp_path / "publish")
    tasks = "toy:seed=0,count=4"
    options = RoleOptions(shards=shards, trainer=TrainerOptions(model_dir=tmp_path, task_spec=tasks,
                                                                publish_dir=tmp_path / "publish"),
                          validator=ValidatorOptions(model_dir=tmp_path, task_spec=tasks))
    services = assemble(node, config, options)
    names = [s.name for s in services]
    assert names.count("trainer") == 1 and "validator" not in names
    trainer = next(s for s in services if s.name == "trainer")
    receiver = next(s for s in services if s.name == "rollouts")
    assert receiver.on_stored == trainer.validator.notify
    assert trainer.validator.run_context.spec.engines == config.run.engines == (wide,)
