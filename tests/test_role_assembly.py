"""Role assembly (node/app/roles.py): one table decides which services a node runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect_node.node.app.config import InferenceOptions
from intellect_node.node.app.roles import RoleOptions, assemble
from intellect_node.node.shards.config import load_shard_config
from tests.inprocess_nodes import make_node


def test_relay_only_roles_run_the_overlay_and_the_inbox(tmp_path: Path) -> None:
    node = make_node(tmp_path, "relay", "assembly-run")
    node.config.roles = ["inference", "validator"]
    shards = load_shard_config(node.config.home, {}, environ={})
    services = assemble(node, node.config, RoleOptions(shards=shards))
    assert [s.name for s in services] == ["shards", "rollouts"]
    assert services[1].on_stored is None  # no verifier on this node: nothing judges the inbox here


def test_a_role_that_needs_checkpoints_refuses_to_run_without_the_overlay(tmp_path: Path) -> None:
    node = make_node(tmp_path, "worker", "assembly-run")
    node.config.roles = ["inference"]
    options = RoleOptions(inference=InferenceOptions(model_dir=tmp_path, task_spec="toy:seed=0,count=4"))
    with pytest.raises(ValueError, match="inference role needs the shard overlay"):
        assemble(node, node.config, options)
