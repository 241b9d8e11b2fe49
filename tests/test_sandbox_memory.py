"""Every byte a sandboxed program holds counts against its run's memory budget, measured from outside.

Each hostile program tries to hold four times its budget in one place: ``/dev/shm``, ``/dev``,
``/tmp``, ``/work``, tmpfs inodes (empty files with long names), POSIX shared memory, a memfd
(written and ``fallocate``d), a loop of pipes,
SysV shared memory and message queues, the heap, ``mmap(MAP_SHARED | MAP_ANONYMOUS)``, and all of
the file places plus the heap at once. What it held is read by the kernel, not taken from the
program: the run is started by a helper process placed in a "meter" cgroup this test creates (no
limit, only counting; the run's own cgroup, when it has one, is made inside it), whose peak
(``memory.peak`` or ``memory.max_usage_in_bytes``) counts every page and kernel object charged,
tmpfs and shmem included. A hostile run may exceed a benign run's peak by at most the budget.

Both of the sandbox's paths run: with its cgroup limit (where this machine allows one; this
project's machine has the cgroup v1 memory controller, so v1) and with the caps alone
(``INTELLECT_NODE_SANDBOX_CGROUP=0``: tmpfs sizes, read-only ``/dev``, refusals, ``RLIMIT_AS``).
"""

# ruff: noqa: E501  (the hostile programs are table entries, kept whole to be read as written)
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from intellect_node.node.app.doctor import OK, WARN, check_sandbox_memory
from intellect_node.node.tasks.sandbox import SandboxLimits, memory_enforcement, run_python, sandbox_problem
from intellect_node.node.tasks.sandbox_cgroup import SWITCH, Hierarchy, RunCgroup, cgroup_problem, hierarchy

BUDGET_MB = 128
LIMITS = SandboxLimits(timeout_s=5.0, memory_mb=BUDGET_MB)
TARGET = 4 * BUDGET_MB << 20  # what each program tries to hold

LIBC = "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# fill files of 512 KiB (under the 1 MiB file-size limit) in a directory until TARGET
FILES = ("import os\nheld = 0\ntry:\n    while held < TARGET:\n"
         "        with open(f'{DIR}/f{held}', 'wb') as f:\n            f.write(b'x' * (512 << 10))\n"
         "        held += 512 << 10\nfinally:\n    print('HELD', held)\n")

PROGRAMS: dict[str, str] = {
    "dev-shm": FILES.replace("{DIR}", "/dev/shm"),
    "dev": FILES.replace("{DIR}", "/dev"),
    "tmp": FILES.replace("{DIR}", "/tmp"),
    "work": FILES.replace("{DIR}", "/work"),
    "posix-shm": (
        "import _posixshmem, mmap, os\nheld = 0\ntry:\n    while held < TARGET:\n"
        "        fd = _posixshmem.shm_open(f'/s{held}', os.O_CREAT | os.O_RDWR, 0o600)  # shm_open(3): /dev/shm\n"
        "        os.ftruncate(fd, 512 << 10)  # under the file-size limit\n        m = mmap.mmap(fd, 512 << 10)\n"
        "        for i in range(0, 512 << 10, 4096):\n            m[i] = 1\n"
        "        m.close()\n        os.close(fd)  # unmapped and closed; the segment stays\n        held += 512 << 10\n"
        "finally:\n    print('HELD', held)"
    ),
    "memfd": LIBC + (
        "import os\nheld, fds = 0, []\ntry:\n    while held < TARGET:\n        fd = os.memfd_create('m')\n"
        "        fds.append(fd)\n        os.write(fd, b'x' * (512 << 10))\n        held += 512 << 10\n"
        "        if libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(64 << 20)) == 0:  # FALLOC_FL_KEEP_SIZE\n"
        "            held += 64 << 20\nfinally:\n    print('HELD', held)"
    ),
    "pipe-loop": (
        "import fcntl, os\nheld, pipes = 0, []\ntry:\n    while held < TARGET:\n        r, w = os.pipe()\n"
        "        pipes.append((r, w))\n        try:\n            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ\n"
        "        except OSError:\n            pass\n        os.set_blocking(w, False)\n        try:\n"
        "            while True:\n                held += os.write(w, b'x' * 65536)\n"
        "        except BlockingIOError:\n            pass\nfinally:\n    print('HELD', held)"
    ),
    "sysv-shm": LIBC + (
        "libc.shmat.restype = ctypes.c_void_p\nheld = 0\ntry:\n    while held < TARGET:\n"
        "        sid = libc.shmget(0, ctypes.c_size_t(32 << 20), 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600\n"
        "        if sid < 0:\n            raise OSError(ctypes.get_errno(), 'shmget')\n"
        "        addr = libc.shmat(sid, None, 0)\n        if addr in (None, ctypes.c_void_p(-1).value):\n"
        "            raise OSError(ctypes.get_errno(), 'shmat')\n        ctypes.memset(addr, 1, 32 << 20)\n"
        "        libc.shmdt(ctypes.c_void_p(addr))  # the segment stays, out of the address space\n"
        "        held += 32 << 20\nfinally:\n    print('HELD', held)"
    ),
    "sysv-msg": LIBC + (
        "held = 0\nbody = ctypes.create_string_buffer(8 + 8192)\nbody[0] = 1\ntry:\n    while held < TARGET:\n"
        "        q = libc.msgget(0, 0o1600)\n        if q < 0:\n            raise OSError(ctypes.get_errno(), 'msgget')\n"
        "        while libc.msgsnd(q, body, 8192, 0o4000) == 0:  # IPC_NOWAIT\n            held += 8192\n"
        "finally:\n    print('HELD', held)"
    ),
    "heap": (
        "held, chunks = 0, []\ntry:\n    while held < TARGET:\n        chunks.append(bytearray(b'x' * (16 << 20)))\n"
        "        held += 16 << 20\nfinally:\n    print('HELD', held)"
    ),
    "mmap-shared-anonymous": (
        "import mmap\nheld, maps = 0, []\ntry:\n    while held < TARGET:\n"
        "        m = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
        "        for i in range(0, 16 << 20, 4096):\n            m[i] = 1\n        maps.append(m)\n"
        "        held += 16 << 20\nfinally:\n    print('HELD', held)"
    ),
    "tmpfs-inodes": (
        "import os\nheld = 0\ntry:\n    while held < TARGET:\n        for d in ('/tmp', '/work'):\n"
        "            os.close(os.open(f'{d}/{held:x}'.ljust(250, 'y'), os.O_CREAT | os.O_WRONLY, 0o600))\n"
        "            held += 1400  # measured kernel memory of one such file\nfinally:\n    print('HELD', held)"
    ),
    "every-place-at-once": (
        "import os\nheld, chunks = 0, []\nfor d in ('/tmp', '/work', '/dev/shm', '/dev'):\n    try:\n"
        "        for i in range(TARGET // (512 << 10)):\n            with open(f'{d}/g{i}', 'wb') as f:\n"
        "                f.write(b'x' * (512 << 10))\n            held += 512 << 10\n    except OSError:\n"
        "        pass\ntry:\n    while held < TARGET:\n        chunks.append(bytearray(b'x' * (4 << 20)))\n"
        "        held += 4 << 20\nfinally:\n    print('HELD', held)"
    ),
}

# run in the helper: one sandboxed run, what the sandbox reported, as JSON on stdout
HELPER = (
    "import json, sys\nfrom intellect_node.node.tasks.sandbox import SandboxLimits, run_python\n"
    "r = run_python(sys.argv[1], limits=SandboxLimits(timeout_s=float(sys.argv[2]), memory_mb=int(sys.argv[3])))\n"
    "print(json.dumps({'returncode': r.returncode, 'stdout': r.stdout[-2000:], 'stderr': r.stderr[-2000:],"
    " 'peak_bytes': getattr(r, 'peak_bytes', None)}))"
)


def _need_sandbox() -> None:
    if sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {sandbox_problem()}")


def _meter_place() -> Hierarchy | None:
    where = hierarchy()
    return None if isinstance(where, str) else where


def measured_run(program: str, *, cgroup: bool) -> tuple[dict, int]:
    """Run ``program`` (TARGET defined) from a helper in a fresh meter cgroup: the sandbox's report
    and the meter's peak in bytes (the helper's interpreter included)."""
    where = _meter_place()
    assert where is not None
    meter = RunCgroup(where, "meter", None)
    try:
        join = meter.path
        if meter.version == 2:  # v2: processes only in leaves; the run's cgroup goes beside the helper's
            (meter.path / "cgroup.subtree_control").write_text("+memory")
            join = meter.path / "helper"
            join.mkdir()
        env = {**os.environ, SWITCH: "1" if cgroup else "0"}
        source = f"TARGET = {TARGET}\n{program}"
        helper = subprocess.run(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(join / "cgroup.procs"), sys.executable, "-c", HELPER,
             source, str(LIMITS.timeout_s), str(LIMITS.memory_mb)],
            env=env, capture_output=True, text=True, timeout=120)
        assert helper.returncode == 0, helper.stderr[-2000:]
        peak = meter.peak_bytes()
        if peak is None:
            pytest.skip("this kernel keeps no peak figure for a cgroup (memory.peak: Linux 5.19)")
        return json.loads(helper.stdout), peak
    finally:
        if meter.version == 2:
            (meter.path / "helper").rmdir()
        meter.close()


@pytest.fixture(scope="module")
def benign_peaks() -> dict[bool, int]:
    """What a helper and a run that holds nothing peak at, with and without the run's cgroup."""
    _need_sandbox()
    if _meter_place() is None:
        pytest.skip(f"no cgroup to measure in: {hierarchy()}")
    peaks = {}
    for cgroup in (True, False):
        report, peak = measured_run("import ctypes, mmap, fcntl, multiprocessing.shared_memory\nprint('HELD', 0)",
                                    cgroup=cgroup)
        assert report["returncode"] == 0 and "HELD 0" in report["stdout"], report
        peaks[cgroup] = peak
    return peaks


def _held(report: dict) -> int:
    lines = [line for line in report["stdout"].splitlines() if line.startswith("HELD ")]
    return int(lines[-1].split()[1]) if lines else 0


@pytest.mark.slow
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "caps-only"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_hostile_program_holds_no_more_than_its_budget(benign_peaks: dict[bool, int], name: str,
                                                       cgroup: bool) -> None:
    if cgroup and cgroup_problem() is not None:
        pytest.skip(f"no cgroup memory limit here: {cgroup_problem()}")
    report, peak = measured_run(PROGRAMS[name], cgroup=cgroup)
    budget = BUDGET_MB << 20
    held = peak - benign_peaks[cgroup]
    # the kernel's count, from outside: never more than the budget above a run that holds nothing
    assert held <= budget, f"{name}: held {held >> 20} MiB over a benign run (budget {BUDGET_MB}), {report}"
    # and the program was stopped short of its aim (refused, out of room, or killed)
    assert _held(report) < TARGET, report
    if cgroup:
        assert report["peak_bytes"] is not None and report["peak_bytes"] <= budget, report
    else:
        assert report["peak_bytes"] is None, report


def test_each_place_is_refused_or_capped_without_a_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caps alone, read from inside: no /dev/shm or /dev writes, no memfd, SysV or mqueue, no pipe
    resizing, and tmpfs mounts of 1/16 of the budget each, bytes and inodes (so that both mounts
    and the address space add up to the budget)."""
    _need_sandbox()
    monkeypatch.setenv(SWITCH, "0")
    hierarchy.cache_clear()
    try:
        program = LIBC + (
            "import os, fcntl\nfor path in ('/dev/shm/x', '/dev/x'):\n    try:\n        open(path, 'wb')\n"
            "        print('WROTE', path)\n    except OSError as e:\n        print('refused', path, e.errno)\n"
            "for name, call in (('memfd', lambda: os.memfd_create('m')), ('shmget', lambda: libc.shmget(0, 4096, 0o1600)),"
            " ('msgget', lambda: libc.msgget(0, 0o1600)), ('semget', lambda: libc.semget(0, 1, 0o1600)),"
            " ('mq_open', lambda: libc.mq_open(b'/q', 0o102, 0o600, None)),"
            " ('pipe-size', lambda: fcntl.fcntl(os.pipe()[1], 1031, 1 << 20))):\n"
            "    try:\n        ok = call()\n        print('ALLOWED' if ok is not None and ok >= 0 else 'refused', name)\n"
            "    except OSError as e:\n        print('refused', name, e.errno)\n"
            "for d in ('/tmp', '/work'):\n    s = os.statvfs(d)\n    print('SIZE', d, s.f_blocks * s.f_frsize, s.f_files)\n"
            "import resource\nprint('AS', resource.getrlimit(resource.RLIMIT_AS)[0])"
        )
        result = run_python(program, limits=LIMITS)
    finally:
        monkeypatch.delenv(SWITCH)
        hierarchy.cache_clear()
    assert result.returncode == 0, result
    assert result.peak_bytes is None  # no cgroup: nothing counted it
    lines = result.stdout.splitlines()
    assert "WROTE" not in result.stdout and "ALLOWED" not in result.stdout, result.stdout
    assert sum(line.startswith("refused") for line in lines) == 8, result.stdout
    sizes = [line.split()[2:] for line in lines if line.startswith("SIZE")]
    share = (BUDGET_MB << 20) // 16
    assert sizes == [[str(LIMITS.tmpfs_bytes), str(LIMITS.tmpfs_inodes)]] * 2 == [[str(share * 7 // 8), "512"]] * 2
    assert int(lines[-1].split()[1]) == LIMITS.address_space_bytes == (BUDGET_MB << 20) - 2 * share


def test_runs_leave_no_cgroup_behind() -> None:
    _need_sandbox()
    where = _meter_place()
    if where is None or cgroup_problem() is not None:
        pytest.skip(f"no cgroup memory limit here: {cgroup_problem()}")
    mine = f"ina-sandbox-{os.getpid()}-"
    for program in ("print(1)", "import os\nos._exit(3)", "while True:\n    pass"):
        result = run_python(program, limits=SandboxLimits(timeout_s=1.0, memory_mb=BUDGET_MB))
        assert result.peak_bytes is not None and 0 < result.peak_bytes <= BUDGET_MB << 20, result
    assert [p.name for p in Path(where.parent).iterdir() if p.name.startswith(mine)] == []


def test_doctor_says_which_memory_limits_this_machine_enforces(monkeypatch: pytest.MonkeyPatch) -> None:
    cgroup, detail = memory_enforcement()
    check = check_sandbox_memory()
    assert check.level == (OK if cgroup else WARN) and "/tmp" in check.detail and "/dev/shm" in check.detail
    assert ("cgroup v" in check.detail) == cgroup, check
    monkeypatch.setenv(SWITCH, "0")
    hierarchy.cache_clear()
    try:
        off = check_sandbox_memory()
    finally:
        monkeypatch.delenv(SWITCH)
        hierarchy.cache_clear()
    assert off.level == WARN and f"{SWITCH}=0" in off.detail and "uncounted" in off.detail and "inodes" in off.detail, off
    assert off.fix, off


@pytest.mark.parametrize("fill", ["heap", "tmpfs"])
def test_the_cgroup_limit_alone_holds_heap_and_tmpfs_pages(tmp_path: Path, fill: str) -> None:
    """The run's cgroup without the sandbox's caps: a process with no rlimit that fills the heap, or
    a private tmpfs of 1 GiB, holds no more than the cgroup's limit (the kernel charges tmpfs pages
    to the writer's cgroup): refused or OOM-killed."""
    where = _meter_place()
    if where is None or cgroup_problem() is not None or os.geteuid() != 0:
        pytest.skip(f"no cgroup memory limit here (or not root): {cgroup_problem()}")
    limit = 64 << 20
    box = RunCgroup(where, "limit-test", limit)
    try:
        if fill == "heap":
            work = f"exec {sys.executable} -c 'x = bytearray(256 << 20); print(len(x))'"
        else:
            work = (f"unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=1g ina {tmp_path} && "
                    f"head -c {256 << 20} /dev/zero > {tmp_path}/fill; ls -l {tmp_path}'")
        run = subprocess.run(["sh", "-c", f'echo $$ > "$0" && {work}', str(box.procs)], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode != 0 and str(256 << 20) not in run.stdout, run
        peak = box.peak_bytes()
        assert peak is None or 0 < peak <= limit, peak
        assert fill == "tmpfs" or box.oom_kills() >= 1  # a heap past the limit is OOM-killed
    finally:
        box.close()
    assert not box.path.exists()


def _fake_hierarchy(root: Path, v2_controllers: str, v2_subtree: str) -> tuple[Path, Path]:
    """A mountinfo and /proc/self/cgroup of a hybrid host whose cgroup trees are plain directories
    under ``root``: the choice between v2 and v1 and the paths it makes, without the kernel."""
    unified, memory = root / "unified", root / "memory"
    for tree in (unified / "node.service", memory / "node"):
        tree.mkdir(parents=True)
    (unified / "node.service" / "cgroup.controllers").write_text(v2_controllers + "\n")
    (unified / "node.service" / "cgroup.subtree_control").write_text(v2_subtree + "\n")
    mountinfo = root / "mountinfo"
    mountinfo.write_text(
        f"30 25 0:26 / {unified} rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
        f"31 25 0:27 / {memory} rw,relatime shared:10 - cgroup cgroup rw,memory\n"
        f"32 25 0:28 / {root / 'cpu'} rw,relatime shared:11 - cgroup cgroup rw,cpu\n")
    proc_cgroup = root / "cgroup"
    proc_cgroup.write_text("4:memory:/node\n1:cpu:/\n0::/node.service\n")
    return mountinfo, proc_cgroup


def test_the_hierarchy_is_v2_where_memory_is_delegated_there_else_v1(tmp_path: Path) -> None:
    from intellect_node.node.tasks.sandbox_cgroup import _find

    mountinfo, proc_cgroup = _fake_hierarchy(tmp_path / "a", "cpu memory pids", "memory")
    assert _find(mountinfo, proc_cgroup) == Hierarchy(2, tmp_path / "a" / "unified" / "node.service")
    mountinfo, proc_cgroup = _fake_hierarchy(tmp_path / "b", "hugetlb", "")  # this machine's shape
    assert _find(mountinfo, proc_cgroup) == Hierarchy(1, tmp_path / "b" / "memory" / "node")
    proc_cgroup.write_text("4:memory:/gone\n0::/node.service\n")  # no child can be made there: both reasons
    found = _find(mountinfo, proc_cgroup)
    assert isinstance(found, str) and "v2: the memory controller is not enabled" in found, found
    assert "v1: cannot create a child of" in found and "gone" in found, found
