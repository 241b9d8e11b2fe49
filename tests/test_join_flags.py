"""``join``'s options are one table (node/app/join_flags.py): every row names a config key that
exists, the CLI offers exactly the table's flags, and a flag given on the command line arrives at
its key (checked through the same errors a config file's value gets)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intellect_node.cli.main import app
from intellect_node.node.app.config import SECTIONS, RoleSection, RunConfig
from intellect_node.node.app.join_flags import JOIN_FLAGS, flag_values, section_flags
from intellect_node.node.config.base import field_types
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.metagene.job import MetageneJob
from intellect_node.node.roles.trainer.config import OptimConfig, TrainerOptions
from intellect_node.node.shards.config import ShardConfig

SECTION_TYPES = {"shards": ShardConfig, "inference": RoleSection, "validator": RoleSection, "run": RunConfig,
                 "trainer": TrainerOptions, "trainer.optim": OptimConfig, "diloco": DilocoSettings,
                 "metagene": MetageneJob, "roles": RoleSection}
# flags that choose how a section is read rather than set one of its keys
FLAG_ONLY_KEYS = {"trainer.config_file", "diloco.workload", "roles.trust_validator"}


@pytest.mark.parametrize("flag", JOIN_FLAGS, ids=lambda flag: flag.option)
def test_every_flag_sets_a_key_its_section_has(flag) -> None:
    section, key = flag.path.rsplit(".", 1)
    assert section.split(".")[0] in (*SECTIONS, "roles")
    if flag.path in FLAG_ONLY_KEYS:
        return
    kinds = field_types(SECTION_TYPES[section])
    assert key in kinds, f"{flag.option} sets {flag.path}, which {SECTION_TYPES[section].__name__} lacks"


def test_names_and_paths_are_unique_and_values_land_under_their_sections() -> None:
    assert len({f.name for f in JOIN_FLAGS}) == len({f.path for f in JOIN_FLAGS}) == len(JOIN_FLAGS)
    values = flag_values({"lr": 1e-3, "batch_groups": 4, "steps": None, "reads": [], "trust_validator": ["a"]})
    assert values == {"trainer.optim.lr": 1e-3, "trainer.batch_groups": 4, "roles.trust_validator": ("a",)}
    assert section_flags(values, "trainer") == {"optim": {"lr": 1e-3}, "batch_groups": 4}
    with pytest.raises(KeyError):
        flag_values({"no_such_flag": 1})


def test_the_cli_offers_every_row_with_its_help() -> None:
    result = CliRunner().invoke(app, ["join", "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    for flag in JOIN_FLAGS:
        assert flag.option in result.output
    assert "--role" in result.output and "--nproc" in result.output


@pytest.mark.parametrize(("argv", "match"), [
    (["--groups-per-step", "-1"], "Invalid value for '--groups-per-step'"),  # the table's bound, typer's message
    (["--verify-fraction", "2"], "Invalid value for '--verify-fraction'"),
    (["--workload", "metagene"], "are for --role diloco"),  # reaches node/app/join.py by its path
])
def test_a_flag_reaches_its_checks(tmp_path: Path, argv: list[str], match: str) -> None:
    result = CliRunner().invoke(app, ["join", "--role", "inference", "--home", str(tmp_path), "--new-swarm", *argv],
                                terminal_width=400)
    assert result.exit_code == 2 and match in " ".join(result.output.split()), result.output


def test_a_trainer_flag_overrides_its_sub_table_key_by_key(tmp_path: Path) -> None:
    from intellect_node.node.app.config import load_config
    from intellect_node.node.app.join import role_options
    from tests.support.engine_helpers import quick_tiny_model

    (tmp_path / "config.toml").write_text("[trainer.optim]\nlr = 1e-3\nweight_decay = 0.25\n")
    (tmp_path / "trainer.toml").write_text("[optim]\nwarmup_steps = 7\n")  # the deprecated --trainer-config
    given = {"model": str(quick_tiny_model()), "tasks": "toy:seed=0,count=4", "lr": 2e-4, "batch_groups": 3,
             "trainer_config": tmp_path / "trainer.toml"}
    said: list[str] = []
    options = role_options(load_config({"home": str(tmp_path)}, environ={}), ("trainer",), given, said.append,
                           {}).trainer
    assert (options.optim.lr, options.optim.weight_decay, options.optim.warmup_steps, options.batch_groups) == (
        2e-4, 0.25, 7, 3)
    assert dataclasses.is_dataclass(options) and any("--trainer-config is deprecated" in line for line in said)


def test_a_shards_flag_added_as_one_row_reaches_the_overlay_config(tmp_path: Path) -> None:
    from intellect_node.node.app.config import load_config
    from intellect_node.node.app.join import role_options

    (tmp_path / "config.toml").write_text("[shards]\nmax_delta_fraction = 0.25\n")
    config = load_config({"home": str(tmp_path)}, environ={})
    assert role_options(config, ("inference",), {}, print, {}).shards.max_delta_fraction == 0.25
    roles = role_options(config, ("inference",), {"max_delta_fraction": 0.0}, print, {})
    assert roles.shards.max_delta_fraction == 0.0
