"""``join``'s typer options made from node/app/join_flags.py's table, so a flag is written once.

Why a decorator and not hand-written parameters: typer reads a command's options from its
signature, and a signature written by hand repeats every row of the table (name, type, help,
bounds) and must be kept in step with it. ``with_join_flags`` appends one keyword parameter per row
to the command's own parameters (those that are not config keys: ``--role``, ``--home``, the
sharded trainer's launch options) and hands the command the values the user gave as one mapping.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from intellect_node.node.app.join_flags import JOIN_FLAGS, JoinFlag


def _parameter(flag: JoinFlag) -> inspect.Parameter:
    kind: Any = list[flag.kind] if flag.repeatable else flag.kind
    option = typer.Option(flag.option, help=flag.help, min=flag.min, max=flag.max)
    return inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind | None, option])


def with_join_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command(..., join_flags)`` as a typer command taking every row of JOIN_FLAGS as an option;
    ``join_flags`` receives ``{python name: value}`` of all of them (None: not given)."""
    own = inspect.signature(command, eval_str=True)
    kept = [p for name, p in own.parameters.items() if name != "join_flags"]
    names = [flag.name for flag in JOIN_FLAGS]
    clash = set(names) & {p.name for p in kept}
    if clash:
        raise TypeError(f"{command.__name__}: parameters {sorted(clash)} are also rows of JOIN_FLAGS")

    @functools.wraps(command)
    def wrapper(**values: Any) -> Any:
        flags = {name: values.pop(name) for name in names}
        return command(**values, join_flags=flags)

    parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept]
    wrapper.__signature__ = own.replace(parameters=parameters + [_parameter(f) for f in JOIN_FLAGS])
    wrapper.__annotations__ = {}
    del wrapper.__wrapped__  # typer must read the signature above, not the command's own
    return wrapper
