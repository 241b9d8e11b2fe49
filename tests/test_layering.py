"""The dependency arrows hold, and every package's map names its modules.

The direction, written once (node/__init__.py says it in words): ``cli -> node -> protocol ->
crypto``, and inside ``node`` the tiers below, each importing only tiers under it (and, inside one
tier, without a cycle). Imports inside functions count: a deferred import is still an arrow.
The source is read with ``ast``, nothing is imported (but the package maps, where one test asks
where an import path is found), so the test sees the tree as it is written.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_PACKAGES = ("cli", "node", "protocol", "crypto")

# Highest first. A unit is a top-level package, or a sub-package of node.
TIERS: tuple[frozenset[str], ...] = (
    frozenset({"cli"}),
    frozenset({"node", "node.demo"}),  # node: its __init__, a map that imports nothing
    frozenset({"node.app"}),
    frozenset({"node.metagene"}),  # a workload plugged into diloco: it imports diloco, never the reverse
    frozenset({"node.roles", "node.diloco"}),
    frozenset({"node.rollouts", "node.shards", "node.engine", "node.tasks", "node.models"}),
    frozenset({"node.swarm"}),
    frozenset({"node.home", "node.config"}),
    frozenset({"protocol"}),
    frozenset({"crypto"}),
)
TIER_OF = {unit: depth for depth, tier in enumerate(TIERS) for unit in tier}


def unit_of(module: str) -> str | None:
    """The unit a dotted ``intellect_node`` module belongs to; None outside the project."""
    parts = module.split(".")
    if parts[0] != "intellect_node" or len(parts) < 2:
        return None
    if parts[1] == "node" and len(parts) > 2:
        return f"node.{parts[2]}"
    return parts[1]


def source_files() -> Iterator[Path]:
    for top in TOP_PACKAGES:
        yield from sorted((ROOT / top).rglob("*.py"))


def imports_of(path: Path) -> Iterator[tuple[str, int]]:
    """Every project module ``path`` imports, module-level or inside a function, with its line."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno


def module_unit(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    unit = unit_of("intellect_node." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert unit is not None
    return unit


def arrows() -> dict[tuple[str, str], list[str]]:
    """(importer unit, imported unit) -> where, for every arrow between two units."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in source_files():
        source = module_unit(path)
        for module, line in imports_of(path):
            target = unit_of(module)
            if target is not None and target != source:
                found.setdefault((source, target), []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def test_every_unit_has_a_tier() -> None:
    units = {module_unit(path) for path in source_files()}
    assert units <= set(TIER_OF), f"place these in TIERS (and node/__init__.py): {sorted(units - set(TIER_OF))}"


def test_imports_point_down_the_tiers() -> None:
    upward = {f"{a} -> {b}": where for (a, b), where in arrows().items()
              if a in TIER_OF and b in TIER_OF and TIER_OF[b] < TIER_OF[a]}
    assert not upward, f"imports against the arrows: {upward}"


def test_no_cycle_inside_a_tier() -> None:
    same_tier = {(a, b) for a, b in arrows() if a in TIER_OF and TIER_OF.get(b) == TIER_OF[a]}
    cycles = sorted(f"{a} <-> {b}" for a, b in same_tier if (b, a) in same_tier and a < b)
    assert not cycles, f"units of one tier importing each other: {cycles}"


def packages() -> list[Path]:
    return sorted(init.parent for top in TOP_PACKAGES for init in (ROOT / top).rglob("__init__.py"))


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_map_names_every_module(package: Path) -> None:
    """A reader finds each module from its package's docstring (``name`` or `name` in backticks)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    children = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    children += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = [name for name in children if not re.search(rf"`(?:[\w.]*\.)?{re.escape(name)}`", doc)]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not name {missing}"


MAX_CLASS_LINES = 300


def test_no_class_in_node_is_over_300_lines() -> None:
    """A class past 300 lines does more than one job (issue 49): move one out into its own module.
    Counted from the class statement to its last line, docstrings and comments included."""
    long = [f"{path.relative_to(ROOT)}: {node.name} is {node.end_lineno - node.lineno + 1} lines"
            for path in sorted((ROOT / "node").rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]
    assert not long, f"classes over {MAX_CLASS_LINES} lines: {long}"


def test_tests_share_code_through_tests_support_only() -> None:
    """A test module imported by another would run its tests twice and tie unrelated files together;
    what tests share lives in ``tests/support`` (and its map names it, checked below)."""
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {module}"
                 for path in sorted((ROOT / "tests").rglob("*.py"))
                 for module, line in imports_of(path)
                 if module.startswith("tests.") and not module.startswith("tests.support")]
    assert not offenders, offenders


def test_the_tests_support_map_names_every_module() -> None:
    test_the_package_map_names_every_module(ROOT / "tests" / "support")


def test_the_import_path_is_the_folder_path() -> None:
    """intellect_node/ links to each code folder, and the package is found there with no remapping:
    an import names the file it loads (intellect_node/__init__.py)."""
    for folder in ("node", "protocol", "crypto", "cli"):
        link = ROOT / "intellect_node" / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), link
    assert not (ROOT / "setup.py").exists(), "setup.py would remap the folders again"
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find == {"include": ["intellect_node*"]}, find
    found = importlib.util.find_spec("intellect_node.node.swarm.runtime")  # imports the package maps only
    assert found is not None and Path(found.origin).resolve() == (ROOT / "node" / "swarm" / "runtime.py").resolve()
