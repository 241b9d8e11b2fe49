"""The one configuration: defaults < TOML file < environment (INTELLECT_NODE_*) < command-line flags.

The TOML file is ``<home>/config.toml`` unless ``--config`` names another. It has one section per
concern, each read by one loader that names the key and the file on any mistake::

    [node]        # this node: log_level and node.swarm.settings.SwarmSettings' fields (top-level keys too)
    [run]         # run-wide values every role reads: run_id, async_level, max_tokens, group_size, temperature
    [shards]      # the checkpoint overlay (node.shards.config.ShardConfig)
    [inference]   # model, tasks, engine
    [validator]   # model, tasks, engine, verify_fraction
    [trainer]     # node.roles.trainer.config: batch_groups, ..., and [trainer.optim/loss/rewards]
    [diloco]      # the DiLoCo role
    [metagene]    # the genomic workload

The environment names a key ``INTELLECT_NODE_<KEY>`` for ``[node]`` and ``INTELLECT_NODE_<SECTION>_<KEY>``
for every other section (``INTELLECT_NODE_RUN_ASYNC_LEVEL``, ``INTELLECT_NODE_DILOCO_H``); lists are
comma-separated; a sub-table's key is named by its path (``INTELLECT_NODE_TRAINER_OPTIM_LR``). Each
role's options are assembled from these by node/app/join.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from intellect_node.node.config.base import ConfigError, build, field_types, values_of, whole_number
from intellect_node.node.config.loader import layered, load_section, read_toml
from intellect_node.node.home.layout import HomeLayout
from intellect_node.node.swarm.settings import SwarmSettings
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.run_spec import TORCH_TORCH, EnginePair

DEFAULT_HOME = Path(os.environ.get("INTELLECT_NODE_HOME", Path.home() / ".intellect-node"))
# The project's public bootstrap peers go here once they run. Until then the list is empty and a
# node needs --bootstrap, a peer cache from an earlier run, or --new-swarm; we never invent addresses.
DEFAULT_BOOTSTRAP_PEERS: tuple[str, ...] = ()
# The app's defaults for the swarm fields it decides (who this node is, where it finds the swarm);
# SwarmSettings writes every other knob's default, once.
APP_SWARM_DEFAULTS: dict[str, Any] = {"run_id": "intellect-public", "roles": ("inference",),
                                      "bootstrap": DEFAULT_BOOTSTRAP_PEERS}


SECTIONS = ("node", "run", "shards", "inference", "validator", "trainer", "diloco", "metagene")
ROLE_SECTION_KEYS = {"inference": {"model", "tasks", "engine", "groups_per_step"},
                     "validator": {"model", "tasks", "engine", "verify_fraction"}}


_DEFAULT_SHAPE = RolloutShape()


@dataclass(frozen=True)
class RunConfig:
    """Run-wide values: every role reads them from here, never from a per-role copy."""

    async_level: int = 2  # the oldest usable policy is step - async_level (0: synchronous)
    # The rollouts' shape, part of the run spec: a worker generating another shape than its
    # validators judge by has every batch refused, so the nodes of a run must agree on them.
    # Their defaults are the protocol's (protocol/rollout_shape.py), written there only.
    max_tokens: int = _DEFAULT_SHAPE.max_tokens
    group_size: int = _DEFAULT_SHAPE.group_size
    temperature: float = _DEFAULT_SHAPE.temperature
    # which engine may generate for which to judge, with the tolerances measured for that pair
    # (``[[run.engines]]`` tables, as ``intellect-node calibrate`` prints them; specs/sampling.md 4)
    engines: tuple[EnginePair, ...] = (TORCH_TORCH,)

    def __post_init__(self) -> None:
        whole_number("[run] async_level", self.async_level, 0)
        whole_number("[run] max_tokens", self.max_tokens, 1)
        whole_number("[run] group_size", self.group_size, 1)
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not temperature > 0:
            raise ConfigError(f"[run] temperature: {temperature!r} is not a number > 0")
        pairs = [(pair.worker, pair.validator) for pair in self.engines]
        if not pairs or len(set(pairs)) != len(pairs):
            raise ConfigError(f"[run] engines: want at least one pair and one per (worker, validator), got {pairs}")


def default_swarm(home: Path = DEFAULT_HOME) -> SwarmSettings:
    """The swarm settings of a node nobody configured: APP_SWARM_DEFAULTS, and SwarmSettings' own
    default for every other knob."""
    return SwarmSettings(home=home, **APP_SWARM_DEFAULTS)


@dataclass
class NodeConfig:
    """The whole configuration. ``[node]``'s keys are ``log_level`` and the fields of ``swarm``:
    each swarm knob is written once, in node/swarm/settings.py (type, default, bounds), and the
    file, the environment and the flags reach it by its field name, so a new knob is one field."""

    swarm: SwarmSettings = field(default_factory=default_swarm)
    log_level: str = "INFO"
    # The file's other sections, checked for unknown names; each concern's loader reads its own.
    sections: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    loaded_from: Path | None = None  # --config, or None: <home>/config.toml
    run: RunConfig = field(default_factory=RunConfig)

    # Who this node is lives in ``swarm`` (the swarm adverts it); every part of the app reads it.
    @property
    def home(self) -> Path:
        return self.swarm.home

    @property
    def run_id(self) -> str:
        return self.swarm.run_id

    @property
    def roles(self) -> tuple[str, ...]:
        return self.swarm.roles

    @property
    def layout(self) -> HomeLayout:
        return HomeLayout(self.home)

    @property
    def config_file(self) -> Path:
        """The file this config was read from (or would have been): every section's errors name it."""
        return self.loaded_from or self.layout.config_file


@dataclass(frozen=True)
class RoleSection:
    """The types of ``[inference]`` and ``[validator]`` (ROLE_SECTION_KEYS: which keys each takes);
    one node's roles share model, tasks and engine, the first section setting one decides."""

    model: str | None = None
    tasks: str | None = None
    engine: str | None = None
    groups_per_step: int | None = None
    verify_fraction: float | None = None


@dataclass(frozen=True)
class InferenceOptions:
    """What the inference role needs beyond the node: a base model (HF layout), tasks, an engine."""

    model_dir: Path
    task_spec: str
    engine: str = "auto"
    # informative groups (completions scored differently) generated on one policy step before the
    # worker waits for the next (0: no limit); past it, further groups mostly arrive stale,
    # costing every verifier and used by no trainer
    groups_per_step: int = 0


SWARM_KEYS = frozenset(field_types(SwarmSettings))
NODE_KEYS = SWARM_KEYS | {"log_level"}


def load_config(flags: dict[str, Any], config_file: Path | None = None,
                environ: dict[str, str] | None = None) -> NodeConfig:
    """Merge the layers; ``flags`` holds only options the user actually gave (None = not given)."""
    environ = dict(os.environ) if environ is None else environ
    given = {k: v for k, v in flags.items() if v is not None}
    home_layers = layered(SwarmSettings, "node", {}, "", {"home": given.get("home")}, environ, {"home"})
    home = home_layers.get("home", DEFAULT_HOME)
    path = config_file or HomeLayout(home).config_file
    node_table, sections = _split_sections(read_toml(path, explicit=config_file is not None), path)
    run_table = dict(sections.get("run", {}))
    if "run_id" in run_table:  # run-wide, so [run]; [node] run_id (older files) still wins over it
        node_table = {"run_id": run_table.pop("run_id")} | node_table
    engines = _engine_pairs(run_table.pop("engines", None), path)
    run_keys = set(field_types(RunConfig)) - {"engines"}  # tables: the file only
    run = load_section(RunConfig, "run", run_table, str(path), {}, environ, run_keys,
                       **({} if engines is None else {"engines": engines}))
    unknown = sorted(set(node_table) - NODE_KEYS)
    if unknown:
        raise ConfigError(f"{path} [node]: unknown keys {unknown}; known keys are {sorted(NODE_KEYS)}")
    swarm_table = {name: value for name, value in node_table.items() if name in SWARM_KEYS}
    swarm_values = layered(SwarmSettings, "node", swarm_table, str(path), given, environ, SWARM_KEYS)
    swarm = build(SwarmSettings, {}, f"{path} [node]", "", **(
        APP_SWARM_DEFAULTS | swarm_values | {"home": home}))
    if swarm.advert_refresh_s >= swarm.advert_lifetime_s:
        raise ConfigError("advert_refresh_s must be shorter than advert_lifetime_s, or adverts lapse")
    own_table = {name: value for name, value in node_table.items() if name not in SWARM_KEYS}
    own = layered(NodeConfig, "node", own_table, str(path), given, environ, NODE_KEYS - SWARM_KEYS)
    return NodeConfig(swarm=swarm, sections=sections, run=run, loaded_from=path, **own)


def _engine_pairs(tables: Any, path: Path) -> tuple[EnginePair, ...] | None:
    """``[[run.engines]]``: each table checked as the run spec's wire checks it (every field, its
    bounds), so a pair the spec would refuse is a configuration error naming the table."""
    if tables is None:
        return None
    if not isinstance(tables, list):
        raise ConfigError(f"{path} [run] engines: expected [[run.engines]] tables, got {tables!r}")
    pairs = []
    for index, table in enumerate(tables):
        try:
            pairs.append(EnginePair.from_wire(table, f"[[run.engines]] #{index + 1}"))
        except Rejected as exc:
            raise ConfigError(f"{path} {exc}") from None
    return tuple(pairs)


def _split_sections(data: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The node's own keys (``[node]`` or top level, as before sections existed) and the other
    sections; unknown sections and the role sections' unknown keys are errors naming the file."""
    tables = {name: value for name, value in data.items() if isinstance(value, dict)}
    node_values = {name: value for name, value in data.items() if not isinstance(value, dict)}
    unknown_sections = sorted(set(tables) - set(SECTIONS))
    if unknown_sections:
        hint = [n for n in unknown_sections if n in NODE_KEYS]
        raise ConfigError(f"{path}: unknown keys {unknown_sections}{' (a key, not a section)' if hint else ''}; "
                          f"sections are {list(SECTIONS)}, node keys are {sorted(NODE_KEYS)}")
    node_values.update(tables.pop("node", {}))
    for role, known in ROLE_SECTION_KEYS.items():
        if role in tables:
            tables[role] = values_of(RoleSection, tables[role], str(path), f"[{role}]", known)
    return node_values, tables
