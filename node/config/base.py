"""Typed config sections: one frozen dataclass per section, its values checked against the field
annotations, unknown keys refused, and one error type that names the key and where it came from.

Why dataclasses and not pydantic (measured on the 2-core dev machine, Python 3.11): importing
pydantic and defining one strict model costs ~230 ms, ``dataclasses`` ~8 ms and is imported
anyway; checking a section is ~1.8 us per instance in pydantic, and the whole config (file,
environment, flags) loads here in ~0.2 ms, so validation speed decides nothing and
import time, paid by every ``intellect-node`` command, decides for dataclasses.

Strict means: a bool is not a number, a whole number is not a string, a float field takes ints
(TOML writes ``lr = 1``), a Path field takes a string, tuple and list fields take lists of the
element type. Environment values are text and are parsed by ``parse_text`` instead.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key and the source."""


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotation of each init field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _describe(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return "list" if typing.get_origin(hint) in (tuple, list) else str(hint)


def typed(hint: Any, value: Any, where: str) -> Any:
    """``value`` (from TOML or a typed flag) as the field type ``hint``, or ConfigError naming ``where``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return typed(inner, value, where)
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        kinds = [args[0]] * len(value) if origin is list or args[-1] is Ellipsis else list(args)
        if len(kinds) != len(value):
            raise ConfigError(f"{where}: expected a list of {len(kinds)}, got {value!r}")
        items = [typed(kind, item, where) for kind, item in zip(kinds, value, strict=True)]
        return tuple(items) if origin is tuple else items
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is Path:
        ok = isinstance(value, str | PathLike)
        value = Path(value).expanduser() if ok else value
    elif dataclasses.is_dataclass(hint):
        return build(hint, value, where, "") if isinstance(value, Mapping) else _refuse(where, value, "table")
    else:
        ok = isinstance(value, hint)
    return value if ok else _refuse(where, value, _describe(hint))


def _refuse(where: str, value: Any, kind: str) -> typing.NoReturn:
    raise ConfigError(f"{where}: {value!r} is not a {kind}")


def parse_text(hint: Any, text: str, where: str) -> Any:
    """An environment variable's text as the field type ``hint``; lists are comma-separated."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (hint,) = [a for a in args if a is not type(None)]
        origin = typing.get_origin(hint)
    try:
        if origin in (tuple, list):
            return typed(hint, [item.strip() for item in text.split(",") if item.strip()], where)
        if hint is bool:
            if text.lower() in TRUE_WORDS + FALSE_WORDS:
                return text.lower() in TRUE_WORDS
            raise ValueError(f"not a boolean: {text!r}")
        if hint in (int, float):
            return hint(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return typed(hint, text, where)


def values_of(cls: type, table: Mapping[str, Any], where: str, section: str,
              settable: Iterable[str] | None = None) -> dict[str, Any]:
    """The typed values of ``table`` for the dataclass ``cls``; unknown keys are refused by name.
    ``where`` names the source (a file), ``section`` the table (``"[diloco]"``; "" for none);
    ``settable`` limits the keys a file may set (default: every field)."""
    kinds = field_types(cls)
    keys = set(kinds if settable is None else settable)
    place = f"{where} {section}".strip()
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ConfigError(f"{place}: unknown keys {unknown}; known keys are {sorted(keys)}")
    return {name: typed(kinds[name], value, f"{place} {name}") for name, value in table.items()}


def build(cls: type[T], table: Mapping[str, Any], where: str, section: str,
          settable: Iterable[str] | None = None, **given: Any) -> T:
    """``cls`` from ``table`` with the already typed ``given`` on top; a bound the class refuses
    (its ``__post_init__``) comes back as ConfigError prefixed with ``where``."""
    values = values_of(cls, table, where, section, settable) | given
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}" if where and where not in str(exc) else str(exc)) from None


def check_bounds(section: str, config: Any, checks: Mapping[str, bool]) -> None:
    """ConfigError naming the first field of ``config`` whose check failed: the sections' one way
    of stating bounds (``{"H": 1 <= self.H <= 100_000, ...}``)."""
    bad = [name for name, ok in checks.items() if not ok]
    if bad:
        raise ConfigError(f"{section} {bad[0]} = {getattr(config, bad[0])!r} is out of bounds")


def whole_number(key: str, value: Any, minimum: int) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``; else ConfigError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: {value!r} is not a whole number >= {minimum}")
    return value
