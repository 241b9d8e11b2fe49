"""node/config/loader.py's ``load_section``, the one loader of every config section: its layers
(defaults < file < environment < flags), sub-tables merged key by key across them, fixed values
no layer sets, and errors naming the key and where it came from; and the modules of the section types
load without torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from intellect_node.node.config.base import ConfigError
from intellect_node.node.config.loader import load_section, merge_tables


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-4
    decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)


@dataclass(frozen=True)
class Section:
    home: Path
    steps: int = 1
    name: str = "a"
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps: {self.steps} is not at least 1")


def load(table, flags=None, environ=None, **fixed):
    return load_section(Section, "demo", table, "cfg.toml", flags, environ or {}, **({"home": Path("/h")} | fixed))


def test_a_sub_table_merges_key_by_key_across_file_environment_and_flags() -> None:
    table = {"steps": 2, "inner": {"lr": 1e-3, "decay": 0.5, "betas": [0.8, 0.9]}}
    environ = {"INTELLECT_NODE_DEMO_INNER_DECAY": "0.25", "INTELLECT_NODE_DEMO_INNER_LR": "2e-3",
               "INTELLECT_NODE_DEMO_NAME": "env"}
    section = load(table, {"inner": {"lr": 5e-3, "decay": None}, "steps": None}, environ)
    assert section.inner == Inner(lr=5e-3, decay=0.25, betas=(0.8, 0.9))  # flag < env < file, key by key
    assert (section.steps, section.name, section.home) == (2, "env", Path("/h"))
    assert load({}).inner == Inner() and load({}, {"inner": {"decay": 0.1}}).inner == Inner(decay=0.1)


def test_fixed_values_are_no_setting() -> None:
    with pytest.raises(ConfigError, match=r"cfg.toml \[demo\]: unknown keys \['home'\]"):
        load({"home": "/elsewhere"})
    assert load({}, {"home": "/elsewhere"}).home == Path("/h")  # a flag for it is not read either


@pytest.mark.parametrize(("table", "flags", "environ", "match"), [
    ({"inner": {"learning_rate": 1}}, {}, {}, r"cfg.toml \[demo\] inner: unknown keys \['learning_rate'\]"),
    ({"inner": {"lr": "fast"}}, {}, {}, r"cfg.toml \[demo\] inner lr: 'fast' is not a float"),
    ({"inner": 3}, {}, {}, r"cfg.toml \[demo\] inner: 3 is not a table"),
    ({}, {}, {"INTELLECT_NODE_DEMO_INNER_LR": "fast"}, "inner.lr from environment"),
    ({}, {"inner": {"lr": "fast"}}, {}, "inner.lr from command line"),
    ({}, {"steps": 0}, {}, r"cfg.toml: steps: 0 is not at least 1"),
    # a mistake in the file is named even where a later layer replaces the value
    ({"steps": "two", "inner": {"lr": "fast"}}, {"steps": 2, "inner": {"lr": 1.0}}, {},
     r"cfg.toml \[demo\] steps: 'two' is not a int"),
    ({"inner": {"lr": "fast"}}, {"inner": {"lr": 1.0}}, {}, r"cfg.toml \[demo\] inner lr: 'fast' is not a float"),
])
def test_mistakes_name_the_key_and_where_it_came_from(table, flags, environ, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load(table, flags, environ)


def test_merge_tables_is_nested() -> None:
    low = {"a": 1, "t": {"x": 1, "y": {"p": 1, "q": 2}}}
    high = {"b": 2, "t": {"y": {"q": 3}}}
    assert merge_tables(low, high) == {"a": 1, "b": 2, "t": {"x": 1, "y": {"p": 1, "q": 3}}}
    assert merge_tables({"t": {"x": 1}}, {"t": 5}) == {"t": 5}
    assert low == {"a": 1, "t": {"x": 1, "y": {"p": 1, "q": 2}}}  # neither input is changed


def test_every_section_has_the_one_loader() -> None:
    """No section grows its own loader again (issue 49): no ``load_<x>_config``/``load_<x>_options``
    function, no ``from_section`` method and no ``<X>Flags`` class in the shipped packages; a
    section is a dataclass, and node/app/join.py loads it with ``load_section``."""
    import intellect_node.cli
    import intellect_node.crypto
    import intellect_node.node
    import intellect_node.protocol

    own_loader = re.compile(r"load_\w+_(config|options)|from_section")
    found = []
    for package in (intellect_node.node, intellect_node.cli, intellect_node.protocol, intellect_node.crypto):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                functions = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and own_loader.fullmatch(node.name)
                flags = isinstance(node, ast.ClassDef) and node.name.endswith("Flags")
                if functions or flags:
                    found.append(f"{path}:{node.lineno} {node.name}")
    assert not found, f"per-section loaders; use node/config/loader.py's load_section: {found}"


# every module a section's type lives in (node/app/config.py holds [run] and the roles' sections), and
# join's option builder that loads them all
SECTION_TYPE_MODULES = (
    "intellect_node.node.app.config",
    "intellect_node.node.shards.config",
    "intellect_node.node.roles.trainer.config",
    "intellect_node.node.roles.validator.config",
    "intellect_node.node.app.join",
    "intellect_node.node.diloco.settings",
    "intellect_node.node.metagene.job",
    "intellect_node.node.swarm.settings",
)


def test_section_types_load_without_torch() -> None:
    """Loading the config (and ``--help``) never pays torch's import (issue 49): a section's type
    lives in a torch-free module of its package, not beside the code that runs it."""
    imports = "; ".join(f"import {module}" for module in SECTION_TYPE_MODULES)
    probe = f"import sys; {imports}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]", f"a section type's module imports torch: {result.stdout.strip()}"
