"""Run untrusted Python (model-written code) under kernel isolation: bubblewrap plus seccomp.

Why the kernel and not the interpreter: a PEP 578 audit hook is no boundary (frame walks, ``gc``,
``__code__`` swaps and ctypes switched it off in measured attacks), so every run now happens in a
fresh set of namespaces that ``bwrap`` builds, and the verdict is decided outside the program's
process (``intellect_node.node.tasks.assert_check``).

What each run gets:

- namespaces: user, pid, network (no interface but a down loopback), ipc, uts, cgroup, mount;
  ``--die-with-parent`` and ``--new-session``; the node kills the launcher's process group at the
  end of every run, and as the sandbox's pid 1 dies with it, every process inside dies too;
- files: read-only binds of ``/usr`` (and ``/lib*``, ``/bin`` as on the host) and of the real
  Python prefix (``sys.base_prefix``, never a venv or a home); a fresh ``/proc`` that shows only
  the run's own processes; a minimal ``/dev``; size-capped tmpfs ``/work`` (the cwd) and ``/tmp``;
  no ``/etc``, no home, no node keys, no sockets; an empty environment but for ``PATH``, ``LANG``;
- identity: uid/gid 65534 with every capability dropped; a root node starts bubblewrap as the
  host's ``nobody`` (in a private mount namespace where the Python prefix is bound somewhere
  ``nobody`` can reach), so even the kernel's view of the processes is unprivileged;
- ``intellect_node.node.tasks.seccomp``: no sockets, no new processes (threads only), no ptrace,
  namespaces, mounts, pidfds, mknod, xattrs, bpf, io_uring, keyrings, TIOCSTI...;
- limits set before the program runs (``_sandbox_boot.py``): address space (a memory bomb gets
  ``MemoryError``), CPU time, size of any file written (stdout and stderr included: they are
  files of the node's, handed over as descriptors), 64 open files, no core dumps, 16 threads;
  a wall-clock limit after which everything is killed.

Results come back only through descriptors the node opened, read back with ``read_capped``
(``O_NOFOLLOW``, non-blocking, regular files only, size-capped), never from a path the program
could have replaced. Where bubblewrap or user namespaces are missing the node refuses code tasks
(``SandboxUnavailable``); it never falls back to an unisolated run.

What remains possible, inside the limits: reading the bound system files (``/usr``, the Python
installation), burning its CPU and memory quota, exec'ing other programs from ``/usr`` (under the
same filter and limits), and hard-coding answers (no harness can tell that from solving).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from intellect_node.node.tasks.seccomp import SeccompUnsupported, build_filter

_BOOT = Path(__file__).with_name("_sandbox_boot.py")
SANDBOX_ID = 65534  # the uid and gid inside, and the host user a root node starts bubblewrap as
_TMPFS_BYTES = 64 << 20
_STARTUP_S = 2.0  # added to a run's wall-clock limit: namespaces and the interpreter start first
INSTALL_HINT = ("install bubblewrap (`apt-get install -y bubblewrap`) and allow user namespaces "
                "(sysctl user.max_user_namespaces > 0)")
# sysctls that stop an unprivileged process from creating a user namespace: (file, the value that blocks, fix)
_USERNS_SWITCHES = (
    ("user/max_user_namespaces", "0", "sysctl -w user.max_user_namespaces=15000"),
    ("kernel/unprivileged_userns_clone", "0", "sysctl -w kernel.unprivileged_userns_clone=1 (Debian, Ubuntu kernels)"),
    ("kernel/apparmor_restrict_unprivileged_userns", "1",
     "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for bwrap (Ubuntu 24.04+)"),
)


class SandboxUnavailable(RuntimeError):
    """Kernel isolation cannot be set up on this machine, so code tasks are refused."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits; the defaults suit competitive-programming style tests."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 1 << 20


@dataclass(frozen=True)
class SandboxResult:
    """What a run did.

    ``returncode`` is the program's exit status (128 + N when signal N killed it, as bubblewrap
    reports it); ``timed_out`` means the wall-clock or the CPU-time limit stopped it;
    ``network_namespace`` is always True now (kept for callers).
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    network_namespace: bool = True

    @property
    def ok(self) -> bool:
        """Exited normally with status 0 within the limits."""
        return self.returncode == 0 and not self.timed_out


def read_capped(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file; a symlink, FIFO or device reads as empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return handle.read(limit)


def _root_binds() -> list[str]:
    binds = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/", name)
        if path.is_symlink():
            binds += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            binds += ["--ro-bind", str(path), str(path)]
    return binds


def _python() -> tuple[str, str | None]:
    """The real interpreter, and the prefix to bind when it lies outside /usr."""
    executable = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not executable.startswith(prefix + os.sep):
        raise SandboxUnavailable(f"{executable} is not under sys.base_prefix {prefix}")
    return executable, None if prefix == "/usr" or prefix.startswith("/usr/") else prefix


class _Workspace:
    """A private temporary directory of the node's for one run's jobs, outputs and filter."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="ina-sandbox-")
        self.path = Path(self._tmp.name)
        self.mountpoint: Path | None = None
        if os.geteuid() == 0:  # bubblewrap runs as nobody, who must reach the prefix's bind point
            os.chmod(self.path, 0o711)
            self.mountpoint = self.path / "python"
            self.mountpoint.mkdir(mode=0o755)

    def file(self, name: str, data: bytes = b"") -> int:
        """A new file of ours with ``data``, opened for reading; the caller closes it."""
        path = self.path / name
        path.write_bytes(data)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def output(self, name: str) -> int:
        return os.open(self.path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    def close(self) -> None:
        self._tmp.cleanup()


@functools.lru_cache(maxsize=1)
def _boot_source() -> str:
    return _BOOT.read_text(encoding="utf-8")


def _command(job_fd: int, seccomp_fd: int, workspace: _Workspace) -> list[str]:
    executable, prefix = _python()
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--cap-drop", "ALL", "--hostname", "sandbox",
            *_root_binds()]
    if prefix is not None:
        source = str(workspace.mountpoint) if workspace.mountpoint else prefix
        argv += ["--ro-bind", source, prefix]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(_TMPFS_BYTES), "--tmpfs", "/tmp", "--size", str(_TMPFS_BYTES), "--tmpfs", "/work",
             "--chdir", "/work", "--remount-ro", "/", "--seccomp", str(seccomp_fd),
             "--", executable, "-I", "-B", "-S", "-c", _boot_source(), str(job_fd)]
    if workspace.mountpoint is None:
        return argv
    # root: bind the prefix where nobody can reach it, in a mount namespace of this run only
    script = 'mount --bind "$0" "$1" && shift && exec setpriv --reuid={0} --regid={0} --clear-groups -- "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script.format(SANDBOX_ID),
            prefix or "/usr", str(workspace.mountpoint), *argv]


class Sandboxes:
    """Start sandboxes in one workspace and make sure that none outlives ``close``."""

    def __init__(self, limits: SandboxLimits, *, probing: bool = False) -> None:
        if not probing:
            require_sandbox()
        self.limits = limits
        self.workspace = _Workspace()
        self._processes: list[subprocess.Popen] = []
        self._seccomp = build_filter()

    def start(self, name: str, job: dict, stdin: bytes = b"", pass_fds: Sequence[int] = ()) -> subprocess.Popen:
        job = {**job, "memory_bytes": self.limits.memory_mb << 20,
               "cpu_seconds": max(1, math.ceil(self.limits.timeout_s)), "file_bytes": self.limits.output_bytes}
        job_fd = self.workspace.file(f"{name}-job.json", json.dumps(job).encode())
        seccomp_fd = self.workspace.file(f"{name}-seccomp.bpf", self._seccomp)
        stdin_fd = self.workspace.file(f"{name}-stdin", stdin)
        stdout_fd, stderr_fd = self.workspace.output(f"{name}-stdout"), self.workspace.output(f"{name}-stderr")
        try:
            process = subprocess.Popen(
                _command(job_fd, seccomp_fd, self.workspace),
                stdin=stdin_fd, stdout=stdout_fd, stderr=stderr_fd,
                pass_fds=(job_fd, seccomp_fd, *pass_fds),
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,  # its own process group, killed as a whole
            )
        finally:
            for fd in (job_fd, seccomp_fd, stdin_fd, stdout_fd, stderr_fd):
                os.close(fd)
        self._processes.append(process)
        return process

    def output(self, name: str, stream: str) -> str:
        data = read_capped(self.workspace.path / f"{name}-{stream}", self.limits.output_bytes)
        return data.decode("utf-8", errors="replace")

    def close(self) -> None:
        for process in self._processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        self.workspace.close()

    def __enter__(self) -> Sandboxes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait(process: subprocess.Popen, deadline: float) -> int | None:
    """The exit status, or None when ``deadline`` (monotonic) passed first."""
    try:
        return process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def run_python(source: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``source`` as ``__main__`` in the sandbox, fed ``stdin``; never raises for bad code.

    Raises ``SandboxUnavailable`` when the machine cannot isolate it.
    """
    limits = limits or SandboxLimits()
    started = time.monotonic()
    with Sandboxes(limits) as boxes:
        process = boxes.start("main", {"mode": "run", "program": source}, stdin=stdin.encode())
        returncode = wait(process, started + limits.timeout_s + _STARTUP_S)
        wall = time.monotonic() - started
        timed_out = returncode is None or returncode == 128 + signal.SIGXCPU
        return SandboxResult(
            returncode=-signal.SIGKILL if returncode is None else returncode,
            stdout=boxes.output("main", "stdout"),
            stderr=boxes.output("main", "stderr"),
            timed_out=timed_out,
            wall_s=wall,
        )


def userns_blocked(proc_sys: Path = Path("/proc/sys")) -> str | None:
    """Which sysctl forbids unprivileged user namespaces here, with the fix; None when none does."""
    for name, blocking, fix in _USERNS_SWITCHES:
        try:
            value = (proc_sys / name).read_text().strip()
        except OSError:
            continue  # this kernel has no such switch
        if value == blocking:
            return f"{name.replace('/', '.')} = {value} forbids user namespaces: {fix}"
    return None


@functools.lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """Why code cannot be isolated here (and how to fix it), or None when it can; probed once."""
    missing = [tool for tool in ("bwrap", *(("unshare", "setpriv", "mount") if os.geteuid() == 0 else ()))
               if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found: {INSTALL_HINT}"
    try:
        build_filter()
    except SeccompUnsupported as exc:
        return str(exc)
    try:
        with Sandboxes(SandboxLimits(), probing=True) as boxes:
            process = boxes.start("probe", {"mode": "run", "program": "print('ok')"})
            returncode = wait(process, time.monotonic() + 30)
            if returncode != 0 or boxes.output("probe", "stdout") != "ok\n":
                cause = userns_blocked() or INSTALL_HINT
                return f"bubblewrap fails here ({boxes.output('probe', 'stderr').strip()[-300:]}): {cause}"
    except (OSError, SandboxUnavailable) as exc:
        return f"bubblewrap cannot start ({exc}): {INSTALL_HINT}"
    return None


def require_sandbox() -> None:
    """Raise ``SandboxUnavailable`` naming what is missing when code cannot be isolated."""
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailable(f"code tasks need the sandbox: {problem}")
