"""The seccomp filter the code sandbox hands to bubblewrap (``bwrap --seccomp FD``), built here.

Why build the BPF program by hand: libseccomp's Python binding is not on PyPI in a form that
installs cleanly everywhere, and the filter is small. It is a classic BPF program over
``struct seccomp_data`` (``nr`` at offset 0, ``arch`` at 4, ``args[i]`` at ``16 + 8 * i``,
little-endian), for x86_64 and aarch64, chosen by ``platform.machine()``.

What it refuses (``EPERM`` unless noted), for the untrusted program and everything it execs:

- sockets of every family (``socket``, ``socketpair``): no network, no unix sockets;
- new processes: ``fork``/``vfork`` and ``clone`` without ``CLONE_THREAD`` or with any
  namespace flag (threads stay possible; a fork bomb or a daemon cannot even start);
  ``clone3`` gets ``ENOSYS`` so that glibc falls back to ``clone``, whose flags BPF can see;
- reaching other processes or the kernel's namespaces: ``ptrace``, ``process_vm_readv/writev``,
  ``pidfd_open/send_signal/getfd``, ``kcmp``, ``unshare``, ``setns``, ``mount`` and the new mount
  API, ``umount2``, ``pivot_root``, ``chroot``;
- kernel attack surface the programs never need: ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring_*``, key management, ``open_by_handle_at``, modules, ``kexec``, ``reboot``, clock,
  swap, accounting, quota, ``syslog``, ``personality``, NUMA page moves, fanotify;
- filesystem tricks: ``mknod``/``mknodat``, the ``*setxattr``/``*removexattr`` family;
- ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)`` (typing into a terminal);
- memory that ``RLIMIT_AS`` and the tmpfs caps would not count: ``memfd_create``,
  ``memfd_secret``, SysV shared memory, message queues and semaphores (``shm*``, ``msg*``,
  ``sem*``), POSIX message queues (``mq_*``), ``vmsplice`` (pages pinned in a pipe), and
  ``fcntl(F_SETPIPE_SZ)`` (a pipe keeps 64 KiB); where the run also has a memory cgroup
  (``intellect_node.node.tasks.sandbox_cgroup``) these are refused all the same;
- any other architecture's system call numbers (the x32 ABI on x86_64, a foreign ``arch``):
  the process is killed.
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF instruction classes and modes (linux/filter.h, linux/bpf_common.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
# seccomp return actions (linux/seccomp.h)
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000

_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24
CLONE_THREAD = 0x00010000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
F_SETPIPE_SZ = 1031  # F_LINUX_SPECIFIC_BASE + 7
X32_SYSCALL_BIT = 0x40000000

# System calls refused with EPERM, by name; numbers per architecture below.
DENIED = (
    "socket", "socketpair", "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "kcmp", "unshare", "setns", "mount",
    "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "name_to_handle_at",
    "open_by_handle_at", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "settimeofday", "clock_settime", "adjtimex", "swapon", "swapoff",
    "acct", "quotactl", "syslog", "personality", "move_pages", "migrate_pages", "mbind",
    "fanotify_init", "sethostname", "setdomainname", "vhangup", "mknod", "mknodat", "setxattr",
    "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "iopl", "ioperm",
    # memory a run could hold outside its address space (RLIMIT_AS) and its tmpfs caps
    "memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv",
    "msgctl", "semget", "semop", "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr", "vmsplice",
)

_X86_64 = {
    "socket": 41, "socketpair": 53, "fork": 57, "vfork": 58, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    "kcmp": 312, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "keyctl": 250, "add_key": 248, "request_key": 249, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "settimeofday": 164,
    "clock_settime": 227, "adjtimex": 159, "swapon": 167, "swapoff": 168, "acct": 163,
    "quotactl": 179, "syslog": 103, "personality": 135, "move_pages": 279, "migrate_pages": 256,
    "mbind": 237, "fanotify_init": 300, "sethostname": 170, "setdomainname": 171, "vhangup": 153,
    "mknod": 133, "mknodat": 259, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
    "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199, "iopl": 172, "ioperm": 173,
    "clone": 56, "clone3": 435, "ioctl": 16, "fcntl": 72,
    "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67,
    "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semget": 64, "semop": 65, "semtimedop": 220,
    "semctl": 66, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
    "mq_notify": 244, "mq_getsetattr": 245, "vmsplice": 278,
}
# asm-generic numbering; aarch64 has no fork, vfork, mknod, iopl or ioperm
_AARCH64 = {
    "socket": 198, "socketpair": 199, "ptrace": 117, "process_vm_readv": 270,
    "process_vm_writev": 271, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    "kcmp": 272, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
    "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 280, "perf_event_open": 241,
    "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "keyctl": 219, "add_key": 217, "request_key": 218, "name_to_handle_at": 264,
    "open_by_handle_at": 265, "init_module": 105, "finit_module": 273, "delete_module": 106,
    "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "settimeofday": 170,
    "clock_settime": 112, "adjtimex": 171, "swapon": 224, "swapoff": 225, "acct": 89,
    "quotactl": 60, "syslog": 116, "personality": 92, "move_pages": 239, "migrate_pages": 238,
    "mbind": 235, "fanotify_init": 262, "sethostname": 161, "setdomainname": 162, "vhangup": 58,
    "mknodat": 33, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14,
    "lremovexattr": 15, "fremovexattr": 16, "clone": 220, "clone3": 435, "ioctl": 29, "fcntl": 25,
    "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197,
    "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "semget": 190, "semop": 193, "semtimedop": 192,
    "semctl": 191, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183,
    "mq_notify": 184, "mq_getsetattr": 185, "vmsplice": 75,
}
# (AUDIT_ARCH_*, syscall table, whether to refuse the x32 bit)
ARCHES = {
    "x86_64": (0xC000003E, _X86_64, True),
    "aarch64": (0xC00000B7, _AARCH64, False),
}


class SeccompUnsupported(RuntimeError):
    """No filter is defined for this machine's architecture."""


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """The filter as packed ``struct sock_filter`` entries, ready for ``bwrap --seccomp``."""
    machine = machine or platform.machine()
    if machine == "arm64":
        machine = "aarch64"
    if machine not in ARCHES:
        raise SeccompUnsupported(f"no seccomp filter for {machine!r} (only {', '.join(ARCHES)})")
    arch, table, x32 = ARCHES[machine]
    eperm = _ERRNO | errno.EPERM
    prog = [_insn(_LD_W_ABS, _ARCH), _insn(_JEQ_K, arch, jt=1), _insn(_RET_K, _KILL_PROCESS),
            _insn(_LD_W_ABS, _NR)]
    if x32:
        prog += [_insn(_JGE_K, X32_SYSCALL_BIT, jf=1), _insn(_RET_K, _KILL_PROCESS)]
    for name in DENIED:
        if name in table:
            prog += [_insn(_JEQ_K, table[name], jf=1), _insn(_RET_K, eperm)]
    prog += [_insn(_JEQ_K, table["clone3"], jf=1), _insn(_RET_K, _ERRNO | errno.ENOSYS)]
    # clone: a thread (CLONE_THREAD) without namespace flags, nothing else
    prog += [
        _insn(_JEQ_K, table["clone"], jf=5),
        _insn(_LD_W_ABS, _ARG0),
        _insn(_JSET_K, CLONE_NAMESPACES, jt=2),
        _insn(_JSET_K, CLONE_THREAD, jf=1),
        _insn(_RET_K, _ALLOW),
        _insn(_RET_K, eperm),
    ]
    # ioctl: the request number is 32 bits wide in the kernel, so the low word is the whole of it
    prog += [
        _insn(_JEQ_K, table["ioctl"], jf=5),
        _insn(_LD_W_ABS, _ARG1),
        _insn(_JEQ_K, TIOCSTI, jt=2),
        _insn(_JEQ_K, TIOCLINUX, jt=1),
        _insn(_RET_K, _ALLOW),
        _insn(_RET_K, eperm),
    ]
    # fcntl: a pipe keeps its default 16 pages (64 KiB); 32 pipes (64 descriptors) then hold 2 MiB
    prog += [
        _insn(_JEQ_K, table["fcntl"], jf=3),
        _insn(_LD_W_ABS, _ARG1),
        _insn(_JEQ_K, F_SETPIPE_SZ, jf=1),
        _insn(_RET_K, eperm),
        _insn(_LD_W_ABS, _NR),  # reload: whatever follows compares the call number again
    ]
    prog.append(_insn(_RET_K, _ALLOW))
    return b"".join(prog)
