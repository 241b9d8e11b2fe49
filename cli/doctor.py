"""`intellect-node doctor`: one line per check, OK / WARN / FAIL with the fix; exit 1 on any FAIL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def doctor(
    home: Annotated[Path | None, typer.Option("--home", help="Node home [default: ~/.intellect-node]")] = None,
    config: Annotated[Path | None,
                      typer.Option("--config", help="TOML config file [default: <home>/config.toml]")] = None,
    bootstrap: Annotated[list[str] | None,
                         typer.Option("--bootstrap", help="Bootstrap peer multiaddr; repeatable")] = None,
    listen: Annotated[list[str] | None, typer.Option("--listen", help="Listen multiaddr; repeatable")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of lines")] = False,
) -> None:
    """Check this machine before joining: identity, config, port, reachability, disk, GPU, code sandbox,
    bootstrap peers, clock."""
    from intellect_node.node.app.doctor import FAIL, run_checks
    from intellect_node.node.swarm.host import quiet_libp2p_logs

    quiet_libp2p_logs(verbose=False)
    checks = run_checks({"home": home, "bootstrap": bootstrap, "listen": listen}, config)
    if as_json:
        print(json.dumps([check.as_dict() for check in checks], indent=1))
    else:
        for check in checks:
            fix = f"\n     {'':<12} fix: {check.fix}" if check.fix else ""
            print(f"{check.level:<4} {check.name:<12} {check.detail}{fix}")
    if any(check.level == FAIL for check in checks):
        raise typer.Exit(1)
