"""Trainer settings: defaults < the config file's ``[trainer]`` section < a TOML file
(``--trainer-config``, the same keys without the ``trainer.`` prefix) < command-line flags.

``async_level`` is run-wide: it comes from ``[run]`` unless the trainer's settings name it. The file holds the knobs a user tunes rarely; the flags the ones a demo or a quick run sets::

    batch_groups = 16
    async_level = 2
    [optim]      # node.trainer.learner.OptimConfig: lr, betas, weight_decay, warmup_steps, ...
    lr = 5e-4
    [loss]       # node.trainer.loss.LossConfig: clip_eps, ratio_cap, normalization, entropy_coef, kl_coef
    [rewards]    # node.trainer.rewards.RewardConfig: length_coef, length_form

Unknown keys are errors that name the key, so a typo never silently trains with a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from intellect_node.node.roles.trainer.learner import OptimConfig
from intellect_node.node.roles.trainer.loss import LossConfig
from intellect_node.node.roles.trainer.rewards import RewardConfig
from intellect_node.node.roles.trainer.service import TrainerOptions

SECTIONS: dict[str, type] = {"optim": OptimConfig, "loss": LossConfig, "rewards": RewardConfig}
TOP_LEVEL = {"batch_groups", "async_level", "max_steps", "eval_every", "eval_tasks", "engine", "seed", "verify_fraction"}


class TrainerConfigError(ValueError):
    """A trainer setting that cannot be used; the message names it."""


def _check_keys(data: Mapping[str, Any], source: str) -> None:
    unknown = sorted(set(data) - TOP_LEVEL - set(SECTIONS))
    if unknown:
        raise TrainerConfigError(f"{source}: unknown key(s) {unknown}; known: {sorted(TOP_LEVEL | set(SECTIONS))}")


def _section(name: str, cls: type, values: Mapping[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainerConfigError(f"[{name}] has unknown key(s) {unknown}; known: {sorted(known)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise TrainerConfigError(f"[{name}]: {exc}") from None


def load_trainer_options(*, model_dir: Path, task_spec: str, publish_dir: Path, config_file: Path | None,
                         flags: Mapping[str, Any], trusted: tuple[str, ...] = (),
                         section: Mapping[str, Any] | None = None, run_async_level: int | None = None) -> TrainerOptions:
    """``flags``: top-level keys and ``lr`` (None = not given); ``section``: the config file's ``[trainer]``."""
    _check_keys(section or {}, "config file [trainer]")
    data: dict[str, Any] = {name: dict(value) if name in SECTIONS else value for name, value in (section or {}).items()}
    if run_async_level is not None:
        data.setdefault("async_level", run_async_level)
    if config_file is not None:
        try:
            from_file = tomllib.loads(config_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TrainerConfigError(f"{config_file}: {exc}") from None
        _check_keys(from_file, str(config_file))
        for name, value in from_file.items():
            data[name] = {**data.get(name, {}), **value} if name in SECTIONS else value
    optim_values = dict(data.get("optim", {}))
    if flags.get("lr") is not None:
        optim_values["lr"] = flags["lr"]
    sections = {name: _section(name, cls, optim_values if name == "optim" else data.get(name, {}))
                for name, cls in SECTIONS.items()}
    top = {k: v for k, v in data.items() if k in TOP_LEVEL}
    top.update({k: v for k, v in flags.items() if k in TOP_LEVEL and v is not None})
    try:
        return TrainerOptions(model_dir=model_dir, task_spec=task_spec, publish_dir=publish_dir, trusted=trusted,
                              **top, **sections)
    except (TypeError, ValueError) as exc:
        raise TrainerConfigError(str(exc)) from None
