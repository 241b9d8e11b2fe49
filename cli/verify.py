"""``intellect-node verify BATCH_FILE --checkpoint DIR``: the validator's verdict on one stored batch.

Thin: parses, loads the run spec and tasks, and calls ``node.roles.validator.offline`` (the
validator's own ``verify_batch``). Exit status 0 when every group is accepted, 1 when any is
rejected, 2 when the inputs themselves are refused (a batch or spec that fails the wire checks,
a spec signed by another key, a task list that does not match the spec).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

err = Console(stderr=True)


def verify(
    batch_file: Annotated[Path, typer.Argument(
        help="A rollout batch envelope as stored (an inbox file)", exists=True, dir_okay=False)],
    checkpoint: Annotated[Path, typer.Option(
        "--checkpoint",
        help="The batch's checkpoint (HF-layout directory; with manifest.ine its hash is checked)",
        exists=True, file_okay=False)],
    run_spec: Annotated[Path | None, typer.Option(
        "--run-spec",
        help="The run's signed RunSpec envelope [default: the run's shared defaults]",
        exists=True, dir_okay=False)] = None,
    authority: Annotated[str | None, typer.Option(
        "--authority", help="Peer id that must have signed --run-spec [default: its signer, printed]")] = None,
    tasks: Annotated[str, typer.Option("--tasks", help="The run's tasks, as for join")] = "toy:seed=0,count=1000",
    engine: Annotated[str, typer.Option("--engine", help="The judging engine: torch or vllm")] = "torch",
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON")] = False,
) -> None:
    """Judge one stored rollout batch exactly as a validator would; print each group's verdict."""
    from intellect_node.node.models.check import check_model_dir
    from intellect_node.node.roles.validator.offline import judge_stored_batch, load_batch, naming_file
    from intellect_node.node.tasks.spec import TaskSpecError, load_task_spec
    from intellect_node.protocol.errors import Rejected
    from intellect_node.protocol.rollout_shape import RolloutShape
    from intellect_node.protocol.run_spec import RunSpec, build_run_spec, read_signed_spec

    try:
        signed = load_batch(batch_file)
        task_list = load_task_spec(tasks)
        if run_spec is None:
            spec = build_run_spec(run_id=signed.message.run_id, authority=signed.signer_peer_id, tasks=task_list,
                                  settings=RolloutShape(), async_window=2)
            signer = None
        else:
            spec, signer = naming_file(run_spec, partial(read_signed_spec, kind=RunSpec, authority=authority,
                                                         run_id=None))
        check_model_dir(checkpoint)
        result = judge_stored_batch(signed, checkpoint_dir=checkpoint, spec=spec, tasks=task_list,
                                    engine_name=engine)
    except (Rejected, TaskSpecError, ValueError, OSError) as exc:
        err.print(f"[red]refused:[/red] {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    verdict = result.verdict
    report = {
        "run_id": result.batch.run_id, "worker": verdict.worker, "policy_step": verdict.policy_step,
        "engine": result.batch.engine, "run_spec_signer": signer, "checkpoint_bound": result.checkpoint_bound,
        "groups": [{"counter": g.counter, "accepted": g.reason is None, "reason": g.reason, "detail": g.detail,
                    "rewards": list(g.rewards), "min_sampling_margin": g.min_sampling_margin,
                    "max_logprob_error": g.max_logprob_error} for g in verdict.groups],
    }
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    raise typer.Exit(1 if verdict.rejected else 0)


def _print(report: dict) -> None:
    console = Console()
    console.print(f"batch of {report['worker']} at step {report['policy_step']} (run {report['run_id']}, "
                  f"engine {report['engine']}); run spec: {report['run_spec_signer'] or 'shared defaults'}; "
                  f"checkpoint {'bound by its manifest' if report['checkpoint_bound'] else 'taken as given'}")
    table = Table("counter", "verdict", "rewards", "min margin", "max logprob err", "detail")
    for g in report["groups"]:
        table.add_row(str(g["counter"]), "accepted" if g["accepted"] else f"[red]{g['reason']}[/red]",
                      " ".join(f"{r:g}" for r in g["rewards"]),
                      "" if g["min_sampling_margin"] is None else f"{g['min_sampling_margin']:.3g}",
                      "" if g["max_logprob_error"] is None else f"{g['max_logprob_error']:.2g}", g["detail"])
    console.print(table)
