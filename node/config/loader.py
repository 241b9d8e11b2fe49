"""The one section loader: defaults < the TOML file's ``[section]`` < environment < flags.

``load_section`` builds every section's dataclass (``[shards]``, ``[trainer]``, ``[diloco]``,
``[metagene]``, the role sections); ``layered`` gives the same layers as typed values, for a root
that adds its own (node/app/config.py's ``[node]`` and ``[run]``). The environment names a key
``<prefix><KEY>``: ``INTELLECT_NODE_<KEY>`` for ``[node]`` (as before sections existed),
``INTELLECT_NODE_<SECTION>_<KEY>`` for the others (``[shards]``'s ``INTELLECT_NODE_SHARDS_*``), and
a sub-table's key by its path (``INTELLECT_NODE_TRAINER_OPTIM_LR`` for ``[trainer.optim] lr``).
Flags hold only what the user gave (None: not given), a sub-table's as a nested mapping
(``{"optim": {"lr": 2e-4}}``). A sub-table (a field whose type is a dataclass) is merged key by key
across the layers, so a flag for one of its keys keeps the file's others.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from intellect_node.node.config.base import ConfigError, build, field_types, parse_text, typed, values_of

T = TypeVar("T")

ENV_PREFIX = "INTELLECT_NODE_"
MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a config file with every section written out is a few KB


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the user's file at ``path``, refused (ValueError, for the caller to prefix with
    the file's name) once it passes ``limit``: no more than ``limit`` + 1 bytes are read, whatever
    the file's size. A directory, a missing file or a symlink loop is the caller's OSError."""
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    return data


def read_json_bounded(path: Path, limit: int) -> Any:
    """The JSON value in the user's file at ``path``, read as ``read_bounded`` reads it. Every way
    the content can be wrong (too large, not UTF-8, not JSON, nested past the parser's recursion)
    is a ValueError for the caller to prefix with the file's name; OSError as ``read_bounded``."""
    data = read_bounded(path, limit)
    try:
        return json.loads(data.decode("utf-8"))  # UnicodeDecodeError and JSONDecodeError are ValueErrors
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def read_toml(path: Path, *, explicit: bool) -> dict[str, Any]:
    """The file's tables; a missing file is empty unless the user named it (``--config``).
    Read bounded, decoded strictly; tomllib recurses per nesting level, so a deeply nested
    value is refused as RecursionError, not left to end the command with a traceback."""
    if not path.exists():
        if explicit:
            raise ConfigError(f"config file {path} does not exist")
        return {}
    try:
        return tomllib.loads(read_bounded(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"cannot read {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"cannot read {path}: nested too deeply") from None


def env_prefix(section: str) -> str:
    """``INTELLECT_NODE_`` for ``node``, ``INTELLECT_NODE_<SECTION>_`` for the others."""
    return ENV_PREFIX if section == "node" else f"{ENV_PREFIX}{section.upper()}_"


def load_section(cls: type[T], section: str, table: Mapping[str, Any], source: str,
                 flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
                 settable: Iterable[str] | None = None, **fixed: Any) -> T:
    """``cls`` from ``[section]``'s layers: ``table`` (read from ``source``), the environment, then
    the flags given. ``settable`` limits the keys the layers may set (default: every field);
    ``fixed`` values (a directory under the home, the checked model) are no setting at all. Every
    mistake is a ConfigError naming the key and where it came from; a bound the class refuses (its
    ``__post_init__``) is prefixed with ``source``."""
    keys = set(field_types(cls) if settable is None else settable) - set(fixed)
    values = layered(cls, section, table, source, flags or {}, environ, keys)
    return build(cls, {}, source, f"[{section}]", **values, **fixed)


def layered(cls: type, section: str, table: Mapping[str, Any], source: str, flags: Mapping[str, Any],
            environ: Mapping[str, str] | None = None, settable: Iterable[str] | None = None) -> dict[str, Any]:
    """The typed values of ``[section]`` for the dataclass ``cls``: ``table`` (from ``source``),
    the environment, then the flags given; ``settable`` limits the keys (default: every field)."""
    environ = os.environ if environ is None else environ
    keys = set(field_types(cls) if settable is None else settable)
    _check_file_values(cls, table, f"{source} [{section}]".strip(), keys)
    given = merge_tables(_environment_layer(cls, env_prefix(section), environ, keys),
                         _flag_layer(cls, flags, keys))
    return values_of(cls, merge_tables(table, given), source, f"[{section}]", keys)


def merge_tables(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    """``high`` over ``low``; where both hold a table under one key, those merge key by key too."""
    merged = dict(low)
    for name, value in high.items():
        below = merged.get(name)
        both = isinstance(value, Mapping) and isinstance(below, Mapping)
        merged[name] = merge_tables(below, value) if both else value
    return merged


def _check_file_values(cls: type, table: Mapping[str, Any], place: str, keys: Iterable[str]) -> None:
    """Every value of the file's table typed and every unknown key refused, before a later layer may
    replace one: a mistake in the file is named even where the environment or a flag wins. A
    sub-table is checked key by key; it is built only once its layers are merged."""
    kinds = field_types(cls)
    tables = {name for name, value in table.items()
              if name in keys and _is_table(kinds[name]) and isinstance(value, Mapping)}
    values_of(cls, {name: value for name, value in table.items() if name not in tables}, place, "", keys)
    for name in sorted(tables):
        _check_file_values(kinds[name], table[name], f"{place} {name}", field_types(kinds[name]))


def _is_table(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _environment_layer(cls: type, prefix: str, environ: Mapping[str, str], keys: Iterable[str],
                       path: str = "") -> dict[str, Any]:
    """The typed values ``environ`` sets for ``keys`` of ``cls`` (a sub-table's by its path)."""
    kinds = field_types(cls)
    layer: dict[str, Any] = {}
    for name in sorted(keys):
        variable = prefix + name.upper()
        if _is_table(kinds[name]):
            inner = _environment_layer(kinds[name], variable + "_", environ, field_types(kinds[name]), f"{path}{name}.")
            if inner:
                layer[name] = inner
        elif variable in environ:
            layer[name] = parse_text(kinds[name], environ[variable], f"{path}{name} from environment")
    return layer


def _flag_layer(cls: type, flags: Mapping[str, Any], keys: Iterable[str], path: str = "") -> dict[str, Any]:
    """The typed values of the flags given for ``keys`` of ``cls`` (a sub-table's as a mapping)."""
    kinds = field_types(cls)
    layer: dict[str, Any] = {}
    for name in sorted(keys):
        value = flags.get(name)
        if value is None:
            continue
        if _is_table(kinds[name]) and isinstance(value, Mapping):
            inner = _flag_layer(kinds[name], value, field_types(kinds[name]), f"{path}{name}.")
            if inner:
                layer[name] = inner
        else:
            layer[name] = typed(kinds[name], value, f"{path}{name} from command line")
    return layer
