"""DiLoCo bench: our DiLoCo (2 peers, each with its hivemind averager child, on 127.0.0.1) against
DDP (torch.distributed, gloo, 2 processes on loopback, gradients all-reduced every step), with the
same model (the tiny Llama preset), the same samples (node/diloco/data.py's assignment for the two
workers' identities), the same inner AdamW and the same token budget.

    .venv/bin/python bench/diloco.py [--quick]

Figures: held-out loss (rows of the generated corpus that no worker trains on), bytes each worker
sends (DDP: computed, ring all-reduce of fp32 gradients, 2 (n-1)/n 4P per step; ours: measured,
the packed tensor bytes our averagers sent, averaged over workers, framing excluded), wall time,
and our compute utilization (inner-step time / wall time). No bandwidth limit is applied (loopback). It also runs
the overlapped variant (the outer all-reduce of round r travels while round r+1 trains). Without
``--quick`` it also runs our int4 and int16 grids (error feedback on) for their held-out loss.
The last line is ``diloco: ours=<held-out loss> peer=<DDP held-out loss> ratio=<x> target=1.02 ok|short``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from intellect_node.crypto.identity import Identity  # noqa: E402
from intellect_node.node.diloco.client import AveragerClient, ChildSettings  # noqa: E402
from intellect_node.node.diloco.data import CorpusSpec, generate, lm_loss, peer_key, round_batch  # noqa: E402
from intellect_node.node.diloco.layout import Layout  # noqa: E402
from intellect_node.node.diloco.peer import DilocoPeer, RoundRecord  # noqa: E402
from intellect_node.node.diloco.settings import DilocoSettings  # noqa: E402
from intellect_node.node.metagene.presets import build_model  # noqa: E402
from intellect_node.node.metagene.recipe import Recipe, make_optimizer  # noqa: E402

TARGET = 1.02
WORKERS = 2
HELD_OUT = 256


def corpus(s: DilocoSettings) -> tuple[torch.Tensor, torch.Tensor]:
    spec = CorpusSpec.parse(s.data)
    rows = generate(CorpusSpec(spec.sequences + HELD_OUT, spec.seq_len, spec.vocab, spec.seed))
    return rows[:spec.sequences], rows[spec.sequences:]


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, rows: torch.Tensor) -> float:
    model.eval()
    return float(torch.stack([lm_loss(model, rows[i:i + 64]) for i in range(0, len(rows), 64)]).mean())


def _ddp_worker(rank: int, s: DilocoSettings, rounds: int, port: int, out: mp.Queue[tuple[float, float]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORKERS)
    train, held = corpus(s)
    model = build_model(s.preset, seed=s.seed)
    recipe = Recipe(lr=s.inner_lr, min_lr=s.inner_lr, warmup_steps=0, total_steps=1, weight_decay=s.weight_decay,
                    betas=s.betas)
    optimizer = make_optimizer(model, recipe)
    key = peer_key(Identity.from_seed(bytes([rank]) * 32).peer_id)
    started = time.perf_counter()
    for r in range(rounds):
        for step in range(s.H):
            loss = lm_loss(model, round_batch(train, s.seed, r, key, step, s.batch))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(WORKERS)
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
            optimizer.step()
    wall = time.perf_counter() - started
    if rank == 0:
        out.put((held_out_loss(model, held), wall))
    dist.destroy_process_group()


def run_ddp(s: DilocoSettings, rounds: int) -> tuple[float, float]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("spawn")
    out: mp.Queue[tuple[float, float]] = ctx.Queue()
    workers = [ctx.Process(target=_ddp_worker, args=(rank, s, rounds, port, out)) for rank in range(WORKERS)]
    for w in workers:
        w.start()
    result = out.get(timeout=600)
    for w in workers:
        w.join(timeout=60)
    return result


def tally(records: list[RoundRecord | None], compute: list[float], averaging: list[float]) -> int:
    """Check one round's records (none yet: the first overlapped round) and add them up."""
    if all(r is None for r in records):
        return 0
    if any(r is None or r.group_size != WORKERS or r.state_hash != records[0].state_hash for r in records):
        raise RuntimeError(f"a round was not averaged by every worker: {records}")
    for i, r in enumerate(records):
        compute[i] += r.train_s
    averaging.append(max(r.allreduce_s for r in records))
    return sum(r.allreduce_bytes for r in records)


def run_diloco(s: DilocoSettings, rounds: int, work: Path) -> tuple[float, float, float, list[float], float]:
    train, held = corpus(s)
    peers: list[DilocoPeer] = []
    initial: tuple[str, ...] = ()
    for i in range(WORKERS):
        model = build_model(s.preset, seed=s.seed)
        client = AveragerClient(work / f"w{i}.sock", Layout.of(dict(model.named_parameters())),
                                ChildSettings("diloco_bench", s.levels, initial, max_peers=WORKERS, min_peers=WORKERS,
                                              matchmaking_s=s.matchmaking_s), work / f"w{i}.log")
        client.ensure_running()
        initial = initial or tuple(client.maddrs)
        peers.append(DilocoPeer(model, s, client, train, Identity.from_seed(bytes([i]) * 32)))
    compute = [0.0] * WORKERS
    averaging: list[float] = []
    sent = 0
    try:
        started = time.perf_counter()
        for _ in range(rounds):
            records: list[RoundRecord | None] = [None] * WORKERS

            def go(i: int, out: list[RoundRecord | None]) -> None:
                out[i] = peers[i].run_round()

            threads = [threading.Thread(target=go, args=(i, records)) for i in range(WORKERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            sent += tally(records, compute, averaging)
        sent += tally([p.finish() for p in peers], compute, averaging)  # overlap: the last round in flight
        wall = time.perf_counter() - started
        return held_out_loss(peers[0].model, held), wall, min(compute) / wall, averaging, sent / WORKERS
    finally:
        for p in peers:
            p.client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 rounds of H=10 (under a minute)")
    args = parser.parse_args()
    rounds, h = (6, 10) if args.quick else (20, 25)
    s = DilocoSettings(H=h, batch=8, data="generated:sequences=4096,seq_len=64", matchmaking_s=1.0)
    torch.set_num_threads(1)
    params = sum(v.numel() for v in build_model(s.preset, seed=s.seed).parameters())
    tokens = rounds * h * s.batch * 64 * WORKERS
    print(f"model {s.model} ({params:,} parameters), {WORKERS} workers, {rounds} rounds x H={h}, batch {s.batch}, "
          f"{tokens:,} tokens in all, compression {s.compression}", flush=True)
    ddp_loss, ddp_wall = run_ddp(s, rounds)
    with tempfile.TemporaryDirectory(prefix="diloco-bench-") as work:
        ours_loss, ours_wall, utilization, averaging, ours_bytes = run_diloco(s, rounds, Path(work))
    ddp_bytes = rounds * h * 2 * (WORKERS - 1) / WORKERS * 4 * params
    print(f"DDP (gloo, every step):   held-out loss {ddp_loss:.4f}, wall {ddp_wall:.1f} s, "
          f"sent per worker {ddp_bytes / 2**20:.1f} MiB")
    print(f"DiLoCo (ours, H={h}):     held-out loss {ours_loss:.4f}, wall {ours_wall:.1f} s, "
          f"sent per worker {ours_bytes / 2**20:.2f} MiB ({ddp_bytes / ours_bytes:.0f}x fewer), "
          f"utilization {utilization:.0%}, averaging median {sorted(averaging)[len(averaging) // 2]:.2f} s")
    with tempfile.TemporaryDirectory(prefix="diloco-bench-") as work:
        loss, wall, overlapped_utilization, waits, _ = run_diloco(dataclasses.replace(s, overlap=True), rounds, Path(work))
    print(f"DiLoCo (ours, overlapped): held-out loss {loss:.4f}, wall {wall:.1f} s, utilization {overlapped_utilization:.0%}, "
          f"waiting for the average median {sorted(waits)[len(waits) // 2]:.2f} s")
    if not args.quick:  # the grid's levels at equal tokens (error feedback on)
        for compression in ("int4", "int16"):
            other = dataclasses.replace(s, compression=compression)
            with tempfile.TemporaryDirectory(prefix="diloco-bench-") as work:
                loss, *_, sent = run_diloco(other, rounds, Path(work))
            print(f"DiLoCo (ours, {compression}):  held-out loss {loss:.4f}, sent per worker {sent / 2**20:.2f} MiB "
                  f"({ddp_bytes / sent:.0f}x fewer)")
    ratio = ours_loss / ddp_loss
    print(f"diloco: ours={ours_loss:.4f} peer={ddp_loss:.4f} ratio={ratio:.3f} target={TARGET} "
          f"{'ok' if ratio <= TARGET else 'short'}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
