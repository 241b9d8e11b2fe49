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
  the run's own processes; a minimal ``/dev``, read-only (its tmpfs has no size cap, so no
  ``/dev/shm`` either); tmpfs ``/work`` (the cwd) and ``/tmp``, capped in bytes and in inodes;
  no ``/etc``, no home, no node keys, no sockets; an empty environment but for ``PATH``, ``LANG``;
- identity: uid/gid 65534 with every capability dropped; a root node starts bubblewrap as the
  host's ``nobody`` (in a private mount namespace where the Python prefix is bound somewhere
  ``nobody`` can reach), so even the kernel's view of the processes is unprivileged;
- ``intellect_node.node.tasks.seccomp``: no sockets, no new processes (threads only), no ptrace,
  namespaces, mounts, pidfds, mknod, xattrs, bpf, io_uring, keyrings, TIOCSTI, memfd, SysV IPC,
  POSIX message queues, vmsplice, pipe resizing...;
- limits set before the program runs (``_sandbox_boot.py``): address space (a memory bomb gets
  ``MemoryError``), CPU time, size of any file written (stdout and stderr included: they are
  files of the node's, handed over as descriptors), 64 open files, no core dumps, 16 threads;
  a wall-clock limit after which everything is killed.

Memory: one budget per run, ``memory_mb``, for every place a program can put bytes. Where the
kernel and the node's rights allow it, each sandbox process runs in a memory cgroup of its own
(``intellect_node.node.tasks.sandbox_cgroup``, v2 or v1) limited to the budget, which counts
tmpfs and shared pages and kernel objects too. Whether or not there is one, the caps hold alone:
the budget is split into ``RLIMIT_AS`` (7/8) and the two tmpfs mounts (1/16 each, of which 7/8
data and 1/8 inodes: ``--tmpfs`` of bubblewrap caps bytes only, so the launcher mounts them itself
from an fstab, ``mount -a -T``, in a mount namespace of its own, and bubblewrap binds them);
``/dev`` (and ``/dev/shm``) is read-only; memfd, SysV shared memory, message queues and
semaphores, POSIX message queues and ``vmsplice`` are refused and a pipe keeps its default 64 KiB.
Measured (tests/test_sandbox_memory.py, budget 128 MiB, each program aiming at 512 MiB): before
this, ``/dev/shm``, ``/dev``, POSIX shm, SysV shm and empty-file (inode) floods held 457 to 538 MiB
and all places at once 838 MiB; now at most the budget in every place, with and without the cgroup.
An unprivileged node makes its mounts in a user namespace of its own (``unshare --user
--map-root-user``), where bubblewrap then nests the sandbox's.

Results come back only through descriptors the node opened, read back with ``read_capped``
(``O_NOFOLLOW``, non-blocking, regular files only, size-capped), never from a path the program
could have replaced. Where bubblewrap or user namespaces are missing the node refuses code tasks
(``SandboxUnavailable``); it never falls back to an unisolated run.

What remains possible, inside the limits: reading the bound system files (``/usr``, the Python
installation), burning its CPU and memory quota, exec'ing other programs from ``/usr`` (under the
same filter and limits), and hard-coding answers (no harness can tell that from solving). Without
a cgroup, small kernel memory goes uncounted: at most 32 pipes of 64 KiB, 16 threads' kernel
stacks, page tables (within the address space), and caches the kernel reclaims (dentries).
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from intellect_node.node.tasks.sandbox_cgroup import RunCgroup, hierarchy
from intellect_node.node.tasks.seccomp import SeccompUnsupported, build_filter

_BOOT = Path(__file__).with_name("_sandbox_boot.py")
SANDBOX_ID = 65534  # the uid and gid inside, and the host user a root node starts bubblewrap as
_TMPFS_SHARE = 16  # each writable tmpfs (/work, /tmp) may hold 1/16 of the run's budget
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

    @property
    def tmpfs_share_bytes(self) -> int:
        """What each of the two writable tmpfs mounts, ``/work`` and ``/tmp``, may cost: data and inodes."""
        return max(1 << 20, (self.memory_mb << 20) // _TMPFS_SHARE)

    @property
    def tmpfs_bytes(self) -> int:
        """The data a tmpfs mount holds (its ``size``): 7/8 of its share; inodes take the rest."""
        return self.tmpfs_share_bytes * 7 // 8

    @property
    def tmpfs_inodes(self) -> int:
        """Files, directories and symlinks a mount holds (``nr_inodes``): each costs at most 1.5 KiB of
        kernel memory (measured 0.9 KiB, 1.4 KiB with a 250-byte name), so 1/16 KiB of the share each."""
        return self.tmpfs_share_bytes // (16 << 10)

    @property
    def address_space_bytes(self) -> int:
        """``RLIMIT_AS``: the budget less both tmpfs shares, so that the three add up to the budget."""
        return (self.memory_mb << 20) - 2 * self.tmpfs_share_bytes


@dataclass(frozen=True)
class SandboxResult:
    """What a run did.

    ``returncode`` is the program's exit status (128 + N when signal N killed it, as bubblewrap
    reports it); ``timed_out`` means the wall-clock or the CPU-time limit stopped it;
    ``network_namespace`` is always True now (kept for callers); ``peak_bytes`` is the most memory
    the run held at once as its cgroup counted it (None where runs get no cgroup).
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    network_namespace: bool = True
    peak_bytes: int | None = None

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

    def file(self, name: str, data: bytes = b"") -> int:
        """A new file of ours with ``data``, opened for reading; the caller closes it."""
        path = self.path / name
        path.write_bytes(data)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def output(self, name: str) -> int:
        return os.open(self.path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    def close(self) -> None:
        self._tmp.cleanup()


class _MountPoints:
    """The directories each sandbox's launcher mounts on, in a mount namespace of its own: its
    ``/work`` and ``/tmp`` tmpfs and, for a root node, the Python prefix where ``nobody`` can reach
    it. Made once per node process and shared by every run (a mount in a private namespace is seen
    by that run only), so no run pays for making and removing directories on disk (measured: 8 ms
    a run under load, 4% of ``bench/sandbox.py``'s cost per program)."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="ina-sandbox-mounts-"))
        self.root = os.geteuid() == 0
        self.work, self.tmp, self.python = (self.path / name for name in ("work", "tmp", "python"))
        for point in (self.work, self.tmp, self.python):
            point.mkdir(mode=0o755)
        if self.root:  # bubblewrap runs as nobody, who must reach the prefix's bind point
            os.chmod(self.path, 0o711)
        atexit.register(shutil.rmtree, self.path, True)

    def fstab(self, limits: SandboxLimits) -> Path:
        """The mounts a launcher makes (``mount -a -T``): two tmpfs capped in bytes and in inodes
        (bubblewrap's ``--tmpfs`` caps bytes only) and, for a root node, the bind of the prefix."""
        path = self.path / f"fstab-{limits.tmpfs_bytes}-{limits.tmpfs_inodes}"
        if not path.exists():
            owner = SANDBOX_ID if self.root else 0  # unprivileged: root of the launcher's user namespace
            options = f"size={limits.tmpfs_bytes},nr_inodes={limits.tmpfs_inodes},mode=0755,uid={owner},gid={owner}"
            lines = [f"tmpfs {_fstab_path(point)} tmpfs {options} 0 0" for point in (self.work, self.tmp)]
            if self.root:
                lines.append(f"{_fstab_path(Path(_python()[1] or '/usr'))} {_fstab_path(self.python)} none bind 0 0")
            partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
            partial.write_text("\n".join(lines) + "\n")
            os.replace(partial, path)  # whole for a launcher that reads it while another run writes it
        return path


@functools.lru_cache(maxsize=1)
def _made_mount_points() -> _MountPoints:
    return _MountPoints()


def _mount_points() -> _MountPoints:
    """This process's mount points, made again if something removed them (a /tmp cleaner)."""
    if not _made_mount_points().path.is_dir():
        _made_mount_points.cache_clear()
    return _made_mount_points()


def _fstab_path(path: Path) -> str:
    """``path`` as an fstab field: space, tab, newline and backslash octal-escaped."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in str(path))


@functools.lru_cache(maxsize=1)
def _boot_source() -> str:
    return _BOOT.read_text(encoding="utf-8")


def _command(job_fd: int, seccomp_fd: int, limits: SandboxLimits, cgroup: RunCgroup | None) -> list[str]:
    executable, prefix = _python()
    points = _mount_points()
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--cap-drop", "ALL", "--hostname", "sandbox",
            *_root_binds()]
    if prefix is not None:
        argv += ["--ro-bind", str(points.python) if points.root else prefix, prefix]
    # /dev read-only: its tmpfs (and /dev/shm on it) has no size cap; the device nodes stay usable
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
             "--bind", str(points.tmp), "/tmp", "--bind", str(points.work), "/work",
             "--chdir", "/work", "--remount-ro", "/", "--seccomp", str(seccomp_fd),
             "--", executable, "-I", "-B", "-S", "-c", _boot_source(), str(job_fd)]
    # the launcher: joins the run's cgroup, makes the run's mounts in a mount namespace of its own
    # (an unprivileged node: in a user namespace of its own too), then becomes bubblewrap
    script = 'mount -a -T "$0" && exec "$@"'
    if cgroup is not None:
        script = f'echo $$ > {shlex.quote(str(cgroup.procs))} && {script}'
    if points.root:  # bubblewrap starts as nobody
        argv = ["setpriv", f"--reuid={SANDBOX_ID}", f"--regid={SANDBOX_ID}", "--clear-groups", "--", *argv]
        unshare = ["unshare", "--mount", "--propagation", "private"]
    else:
        unshare = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
    return [*unshare, "--", "sh", "-c", script, str(points.fstab(limits)), *argv]


class Sandboxes:
    """Start sandboxes in one workspace and make sure that none outlives ``close``."""

    def __init__(self, limits: SandboxLimits, *, probing: bool = False) -> None:
        if not probing:
            require_sandbox()
        self.limits = limits
        self.workspace = _Workspace()
        self._processes: list[subprocess.Popen] = []
        self._cgroups: list[RunCgroup] = []
        self._seccomp = build_filter()
        # the most the runs' cgroups held (summed over processes), read at close; None without them
        self.peak_bytes: int | None = None

    def start(self, name: str, job: dict, stdin: bytes = b"", pass_fds: Sequence[int] = ()) -> subprocess.Popen:
        job = {**job, "memory_bytes": self.limits.address_space_bytes,
               "cpu_seconds": max(1, math.ceil(self.limits.timeout_s)), "file_bytes": self.limits.output_bytes}
        job_fd = self.workspace.file(f"{name}-job.json", json.dumps(job).encode())
        seccomp_fd = self.workspace.file(f"{name}-seccomp.bpf", self._seccomp)
        stdin_fd = self.workspace.file(f"{name}-stdin", stdin)
        stdout_fd, stderr_fd = self.workspace.output(f"{name}-stdout"), self.workspace.output(f"{name}-stderr")
        try:
            cgroup = self._cgroup(name)
            process = subprocess.Popen(
                _command(job_fd, seccomp_fd, self.limits, cgroup),
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

    def _cgroup(self, name: str) -> RunCgroup | None:
        """A new cgroup limited to the budget, or None where there is none (the caps hold alone)."""
        where = hierarchy()
        if isinstance(where, str):
            return None
        try:
            cgroup = RunCgroup(where, name, self.limits.memory_mb << 20)
        except OSError:  # the parent went away since the probe: the caps still hold the budget
            return None
        self._cgroups.append(cgroup)
        return cgroup

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
        peaks = [cgroup.peak_bytes() for cgroup in self._cgroups]
        if peaks and None not in peaks and self.peak_bytes is None:
            self.peak_bytes = sum(peak for peak in peaks if peak is not None)
        for cgroup in self._cgroups:
            cgroup.close()
        self.workspace.close()

    def __enter__(self) -> Sandboxes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait(process: subprocess.Popen, deadline: float) -> int | None:
    """The exit status, or None when ``deadline`` (monotonic) passed first.

    Woken by the process's pidfd the moment it exits: ``Popen.wait(timeout)`` polls with sleeps
    that double up to 50 ms, which added up to 50 ms to a run that ended between two polls.
    """
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # reaped already, or no pidfd (Linux < 5.3)
        pidfd = None
    if pidfd is not None:
        try:
            ready = select.poll()
            ready.register(pidfd, select.POLLIN)
            ready.poll(max(0.0, deadline - time.monotonic()) * 1e3)
        finally:
            os.close(pidfd)
    try:
        return process.wait(timeout=0 if pidfd is not None else max(0.0, deadline - time.monotonic()))
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
        stdout, stderr = boxes.output("main", "stdout"), boxes.output("main", "stderr")
    return SandboxResult(
        returncode=-signal.SIGKILL if returncode is None else returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=returncode is None or returncode == 128 + signal.SIGXCPU,
        wall_s=wall,
        peak_bytes=boxes.peak_bytes,
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
    missing = [tool for tool in ("bwrap", "unshare", "mount", "sh", *(("setpriv",) if os.geteuid() == 0 else ()))
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


def memory_enforcement(limits: SandboxLimits | None = None) -> tuple[bool, str]:
    """Whether runs get a cgroup memory limit here, and every memory limit a run gets, in words."""
    limits = limits or SandboxLimits()
    caps = (f"/work and /tmp tmpfs capped at {limits.tmpfs_bytes >> 20} MiB and {limits.tmpfs_inodes} inodes "
            f"each, address space {limits.address_space_bytes >> 20} MiB, /dev read-only (no /dev/shm), memfd, "
            "SysV IPC, POSIX message queues and pipe resizing refused")
    where = hierarchy()
    if isinstance(where, str):
        return False, (f"no cgroup memory limit ({where}); a run of memory_mb={limits.memory_mb} is held by the "
                       f"caps alone: {caps}; small kernel memory (pipe buffers up to 2 MiB, thread stacks, "
                       "reclaimable dentries) goes uncounted")
    return True, f"{where.describe()} = memory_mb ({limits.memory_mb} MiB), and the caps: {caps}"


def require_sandbox() -> None:
    """Raise ``SandboxUnavailable`` naming what is missing when code cannot be isolated."""
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailable(f"code tasks need the sandbox: {problem}")
