"""Start one trainer as N processes with torchrun: rank 0 runs the node, the others follow it.

``intellect-node join --role trainer --nproc N ...`` loads the configuration once and calls
``launch_trainer`` with what rank 0 runs: the node function with its loaded config, a picklable
callable (``partial(serve, config, roles)``), handed over in a private file. torchrun then runs
this module's ``main`` once per process; rank 0 calls that function directly, with no command line
parsed again. Across machines, each machine runs the same join command with ``--nnodes``, its
``--node-rank`` and rank 0's ``--master-addr``; only node rank 0's first process runs the node.
Why a callable and not an import of the app: roles sit below node/app in the dependency arrows.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from intellect_node.node.roles.trainer import ranks


def launch_trainer(nproc: int, entry: Callable[[], None] | None, *, nnodes: int = 1, node_rank: int = 0,
                   master_addr: str = "127.0.0.1", master_port: int = 29500) -> int:
    """Run the trainer as ``nproc`` processes on this machine (``nnodes`` machines in all) and
    return the exit status of torchrun.

    ``entry``: what global rank 0 calls (it runs on node rank 0; None on the other machines), a
    picklable callable such as ``partial(serve, config, roles)``. torchrun, not
    ``multiprocessing``, because it is what spans machines (static rendezvous at
    ``master_addr:master_port``) and what takes every process down when one fails."""
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes or (entry is None) != (node_rank > 0):
        raise ValueError("nproc and nnodes must be >= 1, 0 <= node_rank < nnodes, an entry on node rank 0 only")
    with tempfile.TemporaryDirectory(prefix="intellect-trainer-") as private:  # 0700: this user's alone
        plan = Path(private) / "rank0.pickle"
        plan.write_bytes(pickle.dumps(entry))
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
                   f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={master_port}",
                   "-m", __name__, str(plan)]
        # torchrun dies with this process, and Ctrl-C or SIGTERM sent here reaches it: it forwards them
        # to the ranks, where rank 0 stops the node and releases the followers
        launcher = subprocess.Popen(command, preexec_fn=_die_with_launcher)

        def forward(signum: int, _frame: object) -> None:
            launcher.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return launcher.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _die_with_launcher() -> None:
    """SIGKILL this process when its parent goes (Linux): a launcher killed with SIGKILL must not
    leave torchrun or a rank behind, waiting on a collective for days."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    """One torchrun process (``argv``: the file ``launch_trainer`` wrote). gloo on CPU, nccl when
    this process has a GPU of its own.

    Shutdown belongs to rank 0: Ctrl-C or SIGTERM stops its node, whose ``release`` ends every
    follower. Followers ignore those signals (torchrun forwards them to every rank), so that none
    leaves rank 0's last collective without a partner."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _die_with_launcher()
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    try:
        if dist.get_rank() != 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            ranks.follow()
            return 0
        entry = pickle.loads(Path(argv[0]).read_bytes())  # written by this user's launcher, above
        try:
            entry()
        finally:
            ranks.release()
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
