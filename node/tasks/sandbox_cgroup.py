"""A memory cgroup per sandbox process: every page a run holds counts against its budget.

Why a cgroup and not only rlimits: ``RLIMIT_AS`` counts a process's address space, so pages that
live outside it are free: files on a tmpfs (``/dev/shm``, ``/tmp``), a memfd filled by ``write``,
SysV segments after ``shmdt``, pipe buffers, inodes and dentries. The kernel charges each of those
to the memory cgroup of the process that allocated it, so a cgroup limit is the one budget that
sees them all; at the limit the kernel reclaims, then refuses the allocation or OOM-kills inside
the cgroup, never outside it.

Where it is created (probed once, ``cgroup_problem`` says why not):

- cgroup v2: a child of the node's own cgroup when ``memory`` is, or can be, enabled in its
  ``cgroup.subtree_control`` (a root or delegated cgroup without processes of its own), else a
  sibling when the parent enables ``memory`` for its children (root under systemd); the run gets
  ``memory.max`` = the budget, ``memory.swap.max`` = 0 and ``memory.oom.group`` = 1;
- cgroup v1 (hybrid hosts, e.g. this project's 2-core machine, older Docker hosts): a child of
  the node's own ``memory`` cgroup with ``memory.limit_in_bytes`` and, where swap is accounted,
  ``memory.memsw.limit_in_bytes`` both = the budget.

``INTELLECT_NODE_SANDBOX_CGROUP=0`` turns it off (the sandbox then relies on the caps alone:
see ``intellect_node.node.tasks.sandbox``). The launcher joins its cgroup (``echo $$ >
cgroup.procs``) before it execs bubblewrap, so nothing the run does is charged elsewhere. At the
end the node kills what is left in the cgroup and removes it; one that cannot be removed yet (a
process still exiting) is retried at the end of the next run.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

SWITCH = "INTELLECT_NODE_SANDBOX_CGROUP"
_PREFIX = "ina-sandbox-"
_REMOVE_WAIT_S = 1.0
_counter = itertools.count()
_leftovers: list[Path] = []


@dataclass(frozen=True)
class Hierarchy:
    """Where run cgroups are made: ``version`` 1 or 2, and the directory that holds them."""

    version: int
    parent: Path

    def describe(self) -> str:
        files = "memory.max, memory.swap.max = 0" if self.version == 2 else "memory.limit_in_bytes, memsw"
        return f"cgroup v{self.version} memory limit per run ({files}) under {self.parent}"


def _mounts(mountinfo: Path) -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount."""
    found = []
    for line in mountinfo.read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) > 4 and len(extra) > 2 and extra[0] in ("cgroup", "cgroup2"):
            found.append((parts[4], extra[0], set(extra[2].split(","))))
    return found


def _own_paths(proc_cgroup: Path) -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _writable_with_memory(parent: Path, version: int) -> bool:
    """Whether a child made here gets a memory limit: made, limited and removed again."""
    probe = parent / f"{_PREFIX}probe-{os.getpid()}-{next(_counter)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(64 << 20))
        return True
    except OSError:
        return False
    finally:
        try:
            probe.rmdir()
        except OSError:
            _leftovers.append(probe)


def _v2_parent(root: Path, own: str) -> Path | str:
    here = root / own.lstrip("/")
    if "memory" not in (here / "cgroup.controllers").read_text().split():
        return f"the memory controller is not enabled for {here} (cgroup.controllers)"
    enabled = "memory" in (here / "cgroup.subtree_control").read_text().split()
    if not enabled:
        try:
            (here / "cgroup.subtree_control").write_text("+memory")
            enabled = True
        except OSError:
            pass  # processes in this cgroup (the no-internal-processes rule) or no permission
    if enabled and _writable_with_memory(here, 2):
        return here
    if own != "/" and _writable_with_memory(here.parent, 2):
        return here.parent
    return f"cannot create a child cgroup with memory.max under {here} or its parent (permission, or processes " \
           "in it: delegate a cgroup to the node, e.g. systemd-run --user -p Delegate=yes, or run as root)"


def _find(mountinfo: Path, proc_cgroup: Path) -> Hierarchy | str:
    mounts, own = _mounts(mountinfo), _own_paths(proc_cgroup)
    v1 = next((point for point, kind, options in mounts if kind == "cgroup" and "memory" in options), None)
    v2 = next((point for point, kind, _ in mounts if kind == "cgroup2"), None)
    reasons = []
    if v2 is not None and "" in own:
        parent = _v2_parent(Path(v2), own[""])
        if isinstance(parent, Path):
            return Hierarchy(2, parent)
        reasons.append(f"v2: {parent}")
    elif v2 is None:
        reasons.append("v2: no cgroup2 mount")
    if v1 is not None and "memory" in own:
        here = Path(v1) / own["memory"].lstrip("/")
        if _writable_with_memory(here, 1):
            return Hierarchy(1, here)
        reasons.append(f"v1: cannot create a child of {here} with a memory limit (not root?)")
    return "; ".join(reasons) or "no memory cgroup controller mounted"


@functools.lru_cache(maxsize=1)
def hierarchy() -> Hierarchy | str:
    """Where this node makes run cgroups, or why it cannot (probed once; ``cache_clear`` to re-probe)."""
    if os.environ.get(SWITCH, "").strip() == "0":
        return f"turned off by {SWITCH}=0"
    try:
        return _find(Path("/proc/self/mountinfo"), Path("/proc/self/cgroup"))
    except (OSError, ValueError) as exc:
        return f"cannot read this process's cgroups: {exc}"


def cgroup_problem() -> str | None:
    """Why runs get no cgroup memory limit here, or None when they do."""
    found = hierarchy()
    return found if isinstance(found, str) else None


class RunCgroup:
    """One sandbox process's cgroup: ``limit_bytes`` for everything it holds (None: only counted)."""

    def __init__(self, where: Hierarchy, name: str, limit_bytes: int | None) -> None:
        self.version = where.version
        self.path = where.parent / f"{_PREFIX}{os.getpid()}-{next(_counter)}-{name}"
        self.path.mkdir()
        try:
            if limit_bytes is not None:
                self._limit(limit_bytes)
        except OSError:
            self.close()
            raise

    def _limit(self, limit: int) -> None:
        if self.version == 2:
            (self.path / "memory.max").write_text(str(limit))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
            (self.path / "memory.oom.group").write_text("1")
            return
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        memsw = self.path / "memory.memsw.limit_in_bytes"  # present where swap is accounted
        if memsw.exists():
            memsw.write_text(str(limit))

    @property
    def procs(self) -> Path:
        """The file a process writes its pid to, to join."""
        return self.path / "cgroup.procs"

    def peak_bytes(self) -> int | None:
        """The most memory the cgroup held at once (v2 ``memory.peak``, v1 ``max_usage_in_bytes``);
        None where the kernel keeps no such figure (v2 before Linux 5.19)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def oom_kills(self) -> int:
        """How many processes the kernel killed at this cgroup's limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def _kill_all(self) -> None:
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            (self.path / "cgroup.kill").write_text("1")
            return
        for pid in self.procs.read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Kill whatever is left inside and remove the cgroup (later, if it is not empty yet)."""
        try:
            self._kill_all()
        except OSError:
            pass
        if not _remove(self.path, _REMOVE_WAIT_S):
            _leftovers.append(self.path)
        for path in list(_leftovers):
            if _remove(path, 0.0):
                _leftovers.remove(path)


def _remove(path: Path, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
