"""ruff over the whole tree (pyproject.toml: F and I, lines of at most 120 characters, trio's ASYNC
rules and bugbear's B): the README's test command is the one place CI runs, so the linter runs as a
test, and the rule families it enforces are pinned here so that narrowing them is a visible change."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {"F", "I", "E501", "ASYNC", "B"}


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "cli", "node", "protocol",
                             "crypto", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_the_rule_families_stay_selected() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert FAMILIES <= set(lint["select"]), lint["select"]
    assert not lint.get("ignore"), f"rules switched off project-wide: {lint.get('ignore')}"


def test_ci_runs_the_readmes_test_command() -> None:
    """CI runs exactly what README.md tells a newcomer to run, so a lint failure fails both."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^\./scripts/setup\.sh --dev && (\.venv/bin/python -m pytest[^\n]*)$", readme, re.M)
    assert command, "README.md shows no test command"
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"&& {command.group(1)}\n" in ci, (command.group(1), ci)
