"""``intellect-node calibrate --model DIR``: the tolerances of an engine pair, measured on this machine.

Thin: parses, builds the two engines and the task list, and calls
``node.roles.validator.calibrate.measure_engines`` and ``node.engine.calibration.calibrated_pair``.
Prints the figures and the ``EnginePair`` line the run's authority puts into its run spec
(specs/sampling.md section 4), as TOML (or JSON with ``--json``). Exit status 2 when an engine
cannot be built or the inputs are refused.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

err = Console(stderr=True)


def calibrate(
    model: Annotated[Path, typer.Option(
        "--model", help="The run's model (HF-layout directory)", exists=True, file_okay=False)],
    worker: Annotated[str, typer.Option(
        "--worker", help="Generating engine: torch or vllm, with :float32|bfloat16|float16")] = "torch:bfloat16",
    validator: Annotated[str, typer.Option("--validator", help="Judging engine, as --worker")] = "torch:float32",
    tasks: Annotated[str, typer.Option("--tasks", help="The run's tasks, as for join")] = "toy:seed=0,count=1000",
    groups: Annotated[int, typer.Option(
        "--groups", help="Honest groups measured (more groups: deeper tails seen)", min=8)] = 256,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="The run's max_tokens", min=1)] = 64,
    device: Annotated[str | None, typer.Option(
        "--device", help="Device for both engines [the engine's default]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print figures and pair as JSON")] = False,
) -> None:
    """Measure an engine pair on honest work and print the tolerances for the run spec."""
    from transformers import AutoTokenizer

    from intellect_node.node.engine import build_engine
    from intellect_node.node.engine.calibration import calibrated_pair
    from intellect_node.node.models.check import check_model_dir
    from intellect_node.node.roles.validator.calibrate import measure_engines
    from intellect_node.node.tasks.spec import TaskSpecError, load_task_spec
    from intellect_node.protocol.rollout_shape import RolloutShape

    try:
        task_list = load_task_spec(tasks)
        check_model_dir(model)
        worker_engine, validator_engine = build_engine(worker, model, device=device), build_engine(
            validator, model, device=device)
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (TaskSpecError, ValueError, RuntimeError, OSError) as exc:
        err.print(f"[red]refused:[/red] {type(exc).__name__}: {exc}")
        raise typer.Exit(2) from None
    settings = RolloutShape(max_tokens=max_tokens)
    err.print(f"measuring {groups} honest groups: {worker} generates, {validator} judges ...")
    figures = measure_engines(worker_engine, validator_engine, tokenizer, task_list, settings, groups)
    pair = calibrated_pair(worker_engine.name, validator_engine.name, figures)
    if as_json:
        print(json.dumps({"figures": dataclasses.asdict(figures), "engine_pair": dataclasses.asdict(pair)}, indent=2))
        return
    print(f"# {figures.summary()}")
    print("[[run.engines]]")
    for field in dataclasses.fields(pair):
        value = getattr(pair, field.name)
        print(f"{field.name} = {json.dumps(value) if isinstance(value, str) else repr(value)}")
