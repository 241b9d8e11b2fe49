"""The demo's live terminal view: training progress and the swarm's nodes, redrawn each poll.

Read-only: built from the trainer's metrics lines and the nodes' control sockets, so what it shows
is what any operator could query. With ``enabled=False`` (tests, CI logs) it prints one line per
new trainer step instead of redrawing the screen.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

if TYPE_CHECKING:
    from intellect_node.node.demo.local_swarm import LocalSwarm
    from intellect_node.node.demo.swarm import DemoOptions

RATE_WINDOW = 10  # steps over which tokens/s is averaged


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def training_table(lines: list[dict[str, Any]], options: DemoOptions, elapsed_s: float, shipped: str = "-") -> Table:
    trained = [line for line in lines if "task_reward" in line]
    measured = [line for line in lines if line.get("eval_measured")]
    last = trained[-1] if trained else {}
    window = trained[-RATE_WINDOW:]
    span = window[-1]["wall_s"] - window[0]["wall_s"] if len(window) > 1 else 0.0
    rate = sum(line["tokens"] for line in window[1:]) / span if span > 0 else None
    minutes, seconds = divmod(int(elapsed_s), 60)
    of_steps = "" if options.steps is None else f"/{options.steps}"
    limit_m, limit_s = divmod(int(options.minutes * 60), 60)
    table = Table(title=f"training: step {last.get('step', 0)}{of_steps}, "
                        f"{minutes}:{seconds:02d} of {limit_m}:{limit_s:02d}",
                  show_header=False, expand=True)
    table.add_column(style="bold")
    table.add_column()
    start = measured[0]["eval_accuracy"] if measured else None
    now = measured[-1]["eval_accuracy"] if measured else None
    table.add_row("held-out accuracy", f"{_fmt(start)} at start -> {_fmt(now)} now")
    table.add_row("task reward (kept groups)", _fmt(last.get("task_reward")))
    table.add_row("length reward", _fmt(last.get("length_reward"), 4))
    table.add_row("groups accepted / rejected / stale / filtered",
                  " / ".join(_fmt(last.get(k, 0)) for k in ("accepted_groups", "rejected_groups", "stale_groups",
                                                            "filtered_groups")))
    table.add_row("trained tokens/s", _fmt(rate, 0))
    table.add_row("staleness (steps)", _fmt(last.get("staleness_mean"), 2))
    table.add_row("trainer busy (not waiting)", _fmt(last.get("utilization"), 2))
    table.add_row("shipped per step", shipped)
    table.add_row("grad norm / clip fraction / entropy",
                  " / ".join(_fmt(last.get(k)) for k in ("grad_norm", "clip_fraction", "entropy")))
    return table


def nodes_table(swarm: LocalSwarm) -> Table:
    table = Table(title="nodes", expand=True)
    for column in ("node", "peer", "step held", "members", "state"):
        table.add_column(column)
    for node in list(swarm.nodes.values()):
        if node.process.poll() is not None:
            table.add_row(node.name, node.peer_id[-10:], "-", "-", f"[red]exited {node.process.returncode}[/red]")
            continue
        try:
            status = node.status()
        except OSError:
            table.add_row(node.name, node.peer_id[-10:], "-", "-", "starting")
            continue
        own = next((m for m in status["members"] if m["peer_id"] == status["peer_id"]), None)
        step = own.get("policy_step") if own else None
        banned = f", {len(status['banned'])} banned" if status.get("banned") else ""
        table.add_row(node.name, node.peer_id[-10:], _fmt(step), str(len(status["members"])), f"running{banned}")
    return table


class Dashboard:
    def __init__(self, options: DemoOptions, enabled: bool) -> None:
        self.options = options
        self.enabled = enabled and sys.stderr.isatty()
        self.console = Console(stderr=True)
        self.live: Live | None = None
        self._printed_step = -1

    def __enter__(self) -> Dashboard:
        if self.enabled:
            self.live = Live(console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def update(self, lines: list[dict[str, Any]], swarm: LocalSwarm, elapsed_s: float, shipped: str = "-") -> None:
        if self.live is not None:
            self.live.update(Panel(Group(training_table(lines, self.options, elapsed_s, shipped), nodes_table(swarm)),
                                   title="intellect-node demo (Ctrl-C stops)"))
            return
        for line in lines:
            if "task_reward" in line and line["step"] > self._printed_step:
                self._printed_step = line["step"]
                self.console.print(f"step {line['step']}: task reward {line['task_reward']:.3f}, held-out accuracy "
                                   f"{_fmt(line.get('eval_accuracy'))}, staleness {line['staleness_mean']:.1f}, "
                                   f"{int(line['tokens'])} tokens, {elapsed_s:.0f} s", soft_wrap=True)
