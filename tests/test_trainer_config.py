"""Trainer settings through the one section loader: defaults < TOML file < flags, and clear errors
for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect_node.node.config.base import ConfigError
from intellect_node.node.config.loader import load_section, read_toml
from intellect_node.node.roles.trainer.config import TrainerOptions

BASE = {"model_dir": Path("/m"), "task_spec": "toy:seed=0,count=10", "publish_dir": Path("/p")}


def load(tmp_path: Path, text: str | None, **flags):
    """``[trainer]`` from a file holding ``text`` (its keys at the top level) and ``flags``."""
    config_file = tmp_path / "trainer.toml"
    if text is not None:
        config_file.write_text(text)
    table = {} if text is None else read_toml(config_file, explicit=True)
    return load_section(TrainerOptions, "trainer", table, str(config_file), flags, {}, **BASE)


def test_defaults(tmp_path) -> None:
    options = load(tmp_path, None)
    assert options.batch_groups == 16 and options.async_level == 2 and options.optim.old_policy == "behavior"
    assert options.loss.ratio_cap == 4.0 and options.rewards.length_coef == 0.0003


def test_file_then_flags(tmp_path) -> None:
    text = "batch_groups = 8\n[optim]\nlr = 1e-3\nbetas = [0.9, 0.95]\n[loss]\nnormalization = 'constant'\n"
    options = load(tmp_path, text, optim={"lr": 2e-4}, async_level=0, batch_groups=None)
    assert options.batch_groups == 8 and options.async_level == 0
    assert options.optim.lr == 2e-4 and options.optim.betas == (0.9, 0.95)
    assert options.loss.normalization == "constant"


@pytest.mark.parametrize(("text", "flags", "message"), [
    ("[optim]\nlearning_rate = 1e-3\n", {}, "unknown key"),
    ("batchgroups = 3\n", {}, "unknown key"),
    ("[loss]\nnormalization = 'per-row'\n", {}, "normalization"),
    ("[optim]\nold_policy = 'newest'\n", {}, "old_policy"),
    ("batch_groups = 0\n", {}, "batch_groups"),
    ("not toml [", {}, "trainer.toml"),
    (None, {"verify_fraction": 0.5}, "trust-validator"),
])
def test_bad_settings_are_named(tmp_path, text, flags, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, text, **flags)


def test_rank_zero_gets_the_loaded_node_function_not_a_command_line(tmp_path) -> None:
    """What the launcher hands rank 0 survives pickling as the node function with its loaded
    config: rank 0 parses no flags again, so it cannot start torchrun again either."""
    import pickle
    from functools import partial

    from intellect_node.node.app.config import load_config
    from intellect_node.node.app.roles import RoleOptions
    from intellect_node.node.app.run import serve

    config = load_config({"home": str(tmp_path), "roles": ["trainer"]}, environ={})
    entry = pickle.loads(pickle.dumps(partial(serve, config, RoleOptions(trainer=load(tmp_path, None)))))
    assert entry.func is serve and entry.args[0] == config and entry.args[1].trainer.batch_groups == 16
