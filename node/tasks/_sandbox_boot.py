"""First code the sandboxed child runs: lock the process down, then run the untrusted program.

Run as ``python -I -B _sandbox_boot.py CONFIG_JSON`` by ``intellect_node.node.tasks.sandbox``; uses the standard
library only. Order matters: limits and the network namespace need ``resource`` and ``ctypes``,
which the audit hook forbids afterwards.
"""

import ctypes
import json
import os
import resource
import runpy
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# Audit events refused outright: network, new processes, signals to other processes, native calls.
_BLOCKED_PREFIXES = (
    "socket.",
    "subprocess.",
    "os.exec",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "os.system",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "ctypes.",
    "pty.",
    "sys.addaudithook",
)
# Audit events whose first argument is a path that must stay inside the working directory.
_PATH_EVENTS = (
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.link",
    "os.symlink",
    "os.utime",
    "shutil.rmtree",
    "shutil.move",
)


def _limit(which: int, value: int, hard: int | None = None) -> None:
    resource.setrlimit(which, (value, value if hard is None else hard))


def _private_network() -> bool:
    """Move into a new network namespace (only a down loopback); False if the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    return libc.unshare(flags) == 0


def main() -> None:
    config = json.loads(sys.argv[1])
    workdir = os.path.realpath(os.getcwd())
    network = _private_network()
    with open("sandbox-status.json", "w") as status:
        json.dump({"network_namespace": network}, status)

    _limit(resource.RLIMIT_AS, config["memory_bytes"])
    # SIGXCPU at the soft limit (reported as a timeout), SIGKILL a second later if it is caught
    _limit(resource.RLIMIT_CPU, config["cpu_seconds"], config["cpu_seconds"] + 1)
    _limit(resource.RLIMIT_FSIZE, config["file_bytes"])
    _limit(resource.RLIMIT_NOFILE, 64)
    _limit(resource.RLIMIT_CORE, 0)
    if os.geteuid() != 0:  # root ignores RLIMIT_NPROC; the audit hook still refuses fork
        _limit(resource.RLIMIT_NPROC, 0)
    for name in ("ctypes", "_ctypes", "ctypes._endian"):
        sys.modules.pop(name, None)

    def inside(path: object) -> bool:
        if isinstance(path, int):  # an already-open descriptor
            return True
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        real = os.path.realpath(path)
        return real == workdir or real.startswith(workdir + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event.startswith(_BLOCKED_PREFIXES):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and args[0] in ("ctypes", "_ctypes"):
            raise PermissionError("sandbox: ctypes is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed")
        elif event in _PATH_EVENTS and args and not all(
            inside(a) for a in args[:2] if isinstance(a, (str, bytes))
        ):
            raise PermissionError(f"sandbox: {event} outside the working directory")

    sys.addaudithook(hook)
    sys.argv = [config["program"]]
    runpy.run_path(config["program"], run_name="__main__")


if __name__ == "__main__":
    main()
