"""Start one trainer as N processes with torchrun: rank 0 runs the node, the others follow it.

``intellect-node join --role trainer --nproc N ...`` calls ``launch_trainer``; torchrun then runs
this module's ``main`` once per process, with the join arguments (``--nproc`` removed) after it.
Across machines, each machine runs the same join command with ``--nnodes``, its ``--node-rank``
and rank 0's ``--master-addr``; only node rank 0's first process runs the node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist
from intellect_node.node.roles.trainer import ranks


def launch_trainer(nproc: int, join_args: Sequence[str], *, nnodes: int = 1, node_rank: int = 0,
                   master_addr: str = "127.0.0.1", master_port: int = 29500) -> int:
    """Run the trainer as ``nproc`` processes on this machine (``nnodes`` machines in all) and
    return the exit status of torchrun.

    ``join_args``: the ``intellect-node`` arguments rank 0 runs, e.g. ``["join", "--role",
    "trainer", "--model", DIR, ...]`` without ``--nproc`` (rank 0 must not start torchrun again).
    torchrun, not ``multiprocessing``, because it is what spans machines (static rendezvous at
    ``master_addr:master_port``) and what takes every process down when one fails."""
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError("nproc and nnodes must be >= 1, 0 <= node_rank < nnodes")
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
               f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={master_port}",
               "-m", __name__, *join_args]
    return subprocess.call(command)


def main(argv: Sequence[str] | None = None) -> int:
    """One torchrun process. gloo on CPU, nccl when this process has a GPU of its own."""
    argv = list(sys.argv[1:] if argv is None else argv)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    try:
        if dist.get_rank() != 0:
            ranks.follow()
            return 0
        from intellect_node.cli.main import app

        try:
            app(args=argv, prog_name="intellect-node", standalone_mode=False)
        finally:
            ranks.release()
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
