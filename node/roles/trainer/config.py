"""The ``[trainer]`` section: defaults < the config file's ``[trainer]`` < an old ``--trainer-config``
file (deprecated: the same keys, without the ``trainer.`` prefix) < environment
(``INTELLECT_NODE_TRAINER_BATCH_GROUPS``, ...: the top-level keys) < command-line flags.

``async_level`` is run-wide: it comes from ``[run]`` unless the trainer's section names it. The
section holds the knobs a user tunes rarely; the flags the ones a demo or a quick run sets::

    [trainer]
    batch_groups = 16
    [trainer.optim]     # node.roles.trainer.learner.OptimConfig: lr, betas, weight_decay, warmup_steps, ...
    lr = 5e-4
    [trainer.loss]      # node.roles.trainer.loss.LossConfig: clip_eps, ratio_cap, normalization, ...
    [trainer.rewards]   # node.roles.trainer.rewards.RewardConfig: length_coef, length_form

Typed by node/config: unknown keys are errors that name the key, so a typo never silently trains
with a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from intellect_node.node.config.base import build
from intellect_node.node.config.loader import layered, read_toml
from intellect_node.node.roles.trainer.service import TrainerOptions

SECTIONS = ("optim", "loss", "rewards")
TOP_LEVEL = ("batch_groups", "async_level", "max_steps", "eval_every", "eval_every_s", "first_eval_s", "eval_tasks",
             "engine", "seed", "verify_fraction", "bridge_after_s", "policy_dtype", "lora_rank", "lora_alpha",
             "lora_targets")
DEPRECATED_FILE = ("--trainer-config is deprecated: move the file's keys into config.toml's [trainer] section "
                   "([optim] becomes [trainer.optim], and so on)")


def load_trainer_options(*, model_dir: Path, task_spec: str, publish_dir: Path, config_file: Path | None,
                         flags: Mapping[str, Any], trusted: tuple[str, ...] = (),
                         section: Mapping[str, Any] | None = None,
                         run_async_level: int | None = None, source: str = "config file",
                         environ: Mapping[str, str] | None = None) -> TrainerOptions:
    """``flags``: top-level keys and sub-tables (``{"optim": {"lr": ...}}``; None = not given);
    ``section``: ``[trainer]`` of ``source``;
    ``config_file``: an old ``--trainer-config`` file, still read; the environment
    (``INTELLECT_NODE_TRAINER_<KEY>``, top-level keys) over both."""
    table = _merged({} if run_async_level is None else {"async_level": run_async_level}, section or {})
    if config_file is not None:
        table, source = _merged(table, read_toml(config_file, explicit=True)), str(config_file)
    table |= layered(TrainerOptions, "trainer", {}, source, {}, environ, TOP_LEVEL)
    given = {k: v for k, v in flags.items() if k in (*TOP_LEVEL, *SECTIONS) and v is not None}
    return build(TrainerOptions, _merged(table, given), source, "[trainer]", (*TOP_LEVEL, *SECTIONS),
                 model_dir=model_dir, task_spec=task_spec, publish_dir=publish_dir, trusted=trusted)


def _merged(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    """``high`` over ``low``, sub-tables ([optim], [loss], [rewards]) merged key by key."""
    merged = dict(low)
    for name, value in high.items():
        both = name in SECTIONS and isinstance(value, Mapping) and isinstance(low.get(name), Mapping)
        merged[name] = {**low[name], **value} if both else value
    return merged
