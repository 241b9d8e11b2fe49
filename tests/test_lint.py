"""ruff over the whole tree (rules F and I, lines of at most 120 characters; pyproject.toml): the
README's test command is the one place CI runs, so the linter runs as a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "cli", "node", "protocol",
                             "crypto", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
