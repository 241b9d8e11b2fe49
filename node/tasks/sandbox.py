"""Run untrusted Python (model-written code) in a locked-down child process.

What is enforced, and by whom:

- by the kernel: address-space limit (``RLIMIT_AS``: a memory bomb gets ``MemoryError``), CPU
  time (``RLIMIT_CPU``), size of any file written (``RLIMIT_FSIZE``, stdout and stderr included:
  they go to files, not pipes, so a print loop cannot fill the parent's memory), 64 open files,
  no core dumps, no new processes for non-root users (``RLIMIT_NPROC``); a wall-clock limit after
  which the whole process group is killed; a private network namespace (``unshare``) with only
  a down loopback, when the kernel permits it (root, or unprivileged user namespaces);
- by the interpreter (a PEP 578 audit hook installed before the program runs): no sockets, no
  subprocess/exec/fork/spawn, no signals to other processes, no ctypes, no writes, renames or
  deletions outside the temporary working directory;
- by the launch: ``python -I -B`` (no environment variables, no user site, no bytecode written),
  an empty environment but for ``PATH`` and ``LANG``, a fresh temporary directory as cwd that is
  deleted afterwards.

Not enforced: an audit hook is not a security boundary against a Python-level escape (PEP 578
says so), and reads outside the directory are allowed (the interpreter needs its library). For a
permissionless swarm, run the node as an unprivileged user or inside a container (nsjail,
gVisor) so that the kernel layers above carry the weight.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_BOOT = Path(__file__).with_name("_sandbox_boot.py")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits; the defaults suit competitive-programming style tests."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 1 << 20


@dataclass(frozen=True)
class SandboxResult:
    """What a run did.

    ``returncode`` is negative when a signal killed it; ``timed_out`` means the wall-clock or the
    CPU-time limit stopped it.
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    network_namespace: bool

    @property
    def ok(self) -> bool:
        """Exited normally with status 0 within the limits."""
        return self.returncode == 0 and not self.timed_out


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


def run_python(source: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``source`` as ``__main__`` in the sandbox, fed ``stdin``; never raises for bad code."""
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="ina-sandbox-") as tmp:
        work = Path(tmp)
        program = work / "main.py"
        program.write_text(source, encoding="utf-8")
        (work / "stdin.txt").write_text(stdin, encoding="utf-8")
        config = {
            "program": str(program),
            "memory_bytes": limits.memory_mb << 20,
            "cpu_seconds": max(1, math.ceil(limits.timeout_s)),
            "file_bytes": limits.output_bytes,
        }
        started = time.monotonic()
        with (
            open(work / "stdin.txt", "rb") as fin,
            open(work / "stdout.txt", "wb") as fout,
            open(work / "stderr.txt", "wb") as ferr,
        ):
            process = subprocess.Popen(
                [sys.executable, "-I", "-B", str(_BOOT), json.dumps(config)],
                cwd=work,
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,  # its own process group, killed as a whole
                close_fds=True,
            )
            timed_out = False
            try:
                returncode = process.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                returncode = process.wait()
        timed_out = timed_out or returncode == -signal.SIGXCPU
        wall = time.monotonic() - started
        status_file = work / "sandbox-status.json"
        try:
            network = bool(json.loads(status_file.read_text())["network_namespace"])
        except (OSError, ValueError, KeyError):
            network = False
        return SandboxResult(
            returncode=returncode,
            stdout=_read_capped(work / "stdout.txt", limits.output_bytes),
            stderr=_read_capped(work / "stderr.txt", limits.output_bytes),
            timed_out=timed_out,
            wall_s=wall,
            network_namespace=network,
        )
