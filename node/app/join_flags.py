"""``join``'s options as one table: each flag, the config key it sets, its type, bounds and help.

Why a table: a flag used to be written three times (a typer parameter, a field of a flags class,
the call filling it) and mapped to its key by hand in each role's loader. Here a flag is one row;
cli/join_options.py makes the typer options from the rows, ``flag_values`` turns what the user gave
into ``{config path: value}``, and node/app/join.py reads every section's flag layer from that
mapping. Adding a ``join`` option for a key that exists is one row here.

A path is ``<section>.<key>`` of config.toml (``trainer.batch_groups``; ``trainer.optim.lr`` for a
sub-table). ``roles.<key>`` is the value a node's roles share (``model``, ``tasks``, ``engine``,
``trust_validator``): node/app/join.py takes it over the ``[inference]``/``[validator]`` sections.
Flags in the table default to "not given" (None, or an empty list for repeatable ones): the config
file and the environment decide then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class JoinFlag:
    option: str  # "--batch-groups"
    path: str  # the config key it sets: "trainer.batch_groups"
    kind: type  # the value type: str, int, float, Path; a repeatable flag's element type
    help: str
    repeatable: bool = False
    min: float | None = None
    max: float | None = None

    @property
    def name(self) -> str:
        """The Python name of the option's value (``--batch-groups``: ``batch_groups``)."""
        return self.option.removeprefix("--").replace("-", "_")


JOIN_FLAGS: tuple[JoinFlag, ...] = (
    JoinFlag("--trainer", "shards.trainer", str,
             "Peer id of the run's trainer: the only key whose checkpoint manifests are accepted"),
    JoinFlag("--publish-dir", "shards.publish_dir", Path, "Trainer: publish each step-<N>.safetensors written here"),
    JoinFlag("--max-delta-fraction", "shards.max_delta_fraction", float,
             "Trainer: publish a step as a sparse delta when it is at most this fraction of the checkpoint; "
             "0 ships whole checkpoints (specs/deltas.md) [0.5]", min=0.0, max=1.0),
    JoinFlag("--model", "roles.model", str,
             "Base model directory (HF layout), or 'tiny' to build the project's tiny model. Inference: without it "
             "the node relays checkpoints but generates nothing; trainer: without it the node publishes what is "
             "written to --publish-dir; diloco: a model preset ([diloco] model)"),
    JoinFlag("--tasks", "roles.tasks", str,
             "toy:seed=S,count=N[,kinds=add+reverse], math:seed=S,count=N, humaneval[:count=N] or a tasks .jsonl "
             "file [toy:seed=0,count=1000]"),
    JoinFlag("--engine", "roles.engine", str,
             "Inference engine: auto, torch or vllm, optionally with :float32|bfloat16|float16 (torch:bfloat16); "
             "the run's [[run.engines]] pairs must cover it [auto]"),
    JoinFlag("--trust-validator", "roles.trust_validator", str,
             "Ban workers whose cheats this validator's verdicts prove; repeatable", repeatable=True),
    JoinFlag("--verify-fraction", "validator.verify_fraction", float,
             "Validator, trainer: fraction of batches verified, drawn from a local secret (a trainer takes agreeing "
             "--trust-validator verdicts for the rest) [1.0]", min=0.0, max=1.0),
    JoinFlag("--groups-per-step", "inference.groups_per_step", int,
             "Inference: informative groups (completions scored differently) generated on one policy step before "
             "waiting (up to 10 s at a time) for the next; 0: no limit [0]", min=0),
    JoinFlag("--steps", "trainer.max_steps", int, "Trainer: stop training after this step (keeps serving)", min=1),
    JoinFlag("--batch-groups", "trainer.batch_groups", int, "Trainer: GRPO groups per step [16]", min=1),
    JoinFlag("--async-level", "run.async_level", int,
             "Run-wide ([run] async_level): the oldest usable policy is step - this; 0 is synchronous [2]", min=0),
    JoinFlag("--lr", "trainer.optim.lr", float, "Trainer: AdamW learning rate", min=0.0),
    JoinFlag("--trainer-config", "trainer.config_file", Path,
             "Deprecated (still read): a TOML file with [optim], [loss], [rewards]; use config.toml's [trainer] "
             "section"),
    JoinFlag("--data", "diloco.data", str,
             "DiLoCo: the data, generated:sequences=N,seq_len=L,vocab=V,seed=S or metagene:store=DIR[,seq_len=L] "
             "(a store from `metagene store`; use a metagene --model such as tiny) ([diloco] data)"),
    JoinFlag("--workload", "diloco.workload", str,
             "DiLoCo: 'metagene' pretrains a genomic model on --reads: the tokenizer and store are built once in "
             "the home and reused on re-joins (also chosen by [metagene] reads)"),
    JoinFlag("--reads", "metagene.reads", str,
             "DiLoCo --workload metagene: FASTQ/FASTA file (plain or .gz), directory or glob; repeatable "
             "([metagene] reads)", repeatable=True),
    JoinFlag("--tokenizer", "metagene.tokenizer", Path,
             "DiLoCo --workload metagene: a `metagene tokenizer` directory every peer shares; without it one is "
             "trained on the reads ([metagene] tokenizer)"),
)
BY_NAME = {flag.name: flag for flag in JOIN_FLAGS}


def flag_values(given: Mapping[str, Any]) -> dict[str, Any]:
    """``{config path: value}`` of the flags given (by Python name); None and empty lists are "not
    given". A name outside the table is a programming error (KeyError), never a silent drop."""
    values: dict[str, Any] = {}
    for name, value in given.items():
        flag = BY_NAME[name]
        if value is None or (flag.repeatable and not value):
            continue
        values[flag.path] = tuple(value) if flag.repeatable else value
    return values


def section_flags(values: Mapping[str, Any], section: str) -> dict[str, Any]:
    """The flag layer of ``[section]``: its keys from ``flag_values``'s mapping (sub-tables nested)."""
    layer: dict[str, Any] = {}
    prefix = section + "."
    for path, value in values.items():
        if path.startswith(prefix):
            *tables, key = path.removeprefix(prefix).split(".")
            target = layer
            for table in tables:
                target = target.setdefault(table, {})
            target[key] = value
    return layer
