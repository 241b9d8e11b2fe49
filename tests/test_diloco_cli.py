"""``join --role diloco`` refuses a bad ``[diloco]`` section before starting anything, naming the
file and the key."""

from __future__ import annotations

import subprocess
import sys


def _join(home, config: str) -> subprocess.CompletedProcess[str]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(config)
    return subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "join", "--role", "diloco", "--new-swarm",
                           "--home", str(home), "--listen", "/ip4/127.0.0.1/tcp/0"],
                          capture_output=True, text=True, timeout=60)


def test_bad_diloco_section_is_a_clear_error(tmp_path) -> None:
    done = _join(tmp_path / "a", "[diloco]\nH = 0\n")
    assert done.returncode == 2 and "H = 0 is out of bounds" in done.stderr and "config.toml" in done.stderr
    done = _join(tmp_path / "b", "[diloco]\ncompresion = \"int8\"\n")
    assert done.returncode == 2 and "unknown keys ['compresion']" in done.stderr
