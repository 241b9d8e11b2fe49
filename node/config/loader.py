"""The layers of every section: defaults < the TOML file < environment < flags.

The environment names a key ``<prefix><KEY>``: ``INTELLECT_NODE_<KEY>`` for ``[node]`` (as
before sections existed), ``INTELLECT_NODE_<SECTION>_<KEY>`` for the others (``[shards]``'s
``INTELLECT_NODE_SHARDS_*``). Flags hold only what the user gave (None: not given).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from intellect_node.node.config.base import ConfigError, field_types, parse_text, typed, values_of

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


def layered(cls: type, section: str, table: Mapping[str, Any], source: str, flags: Mapping[str, Any],
            environ: Mapping[str, str] | None = None, settable: Iterable[str] | None = None) -> dict[str, Any]:
    """The typed values of ``[section]`` for the dataclass ``cls``: ``table`` (from ``source``),
    the environment, then the flags given; ``settable`` limits the keys (default: every field)."""
    environ = os.environ if environ is None else environ
    kinds = field_types(cls)
    keys = set(kinds if settable is None else settable)
    values = values_of(cls, table, source, f"[{section}]", keys)
    prefix = env_prefix(section)
    for name in sorted(keys):
        if prefix + name.upper() in environ:
            values[name] = parse_text(kinds[name], environ[prefix + name.upper()], f"{name} from environment")
        if flags.get(name) is not None:
            values[name] = typed(kinds[name], flags[name], f"{name} from command line")
    return values
