"""Weight broadcast benchmark: our shard overlay against the reference SHARDCAST, same machine, same run.

Ours: a trainer node and N fetcher nodes (real processes, 127.0.0.1). The clock starts when the
checkpoint file is handed to the trainer's publish directory (so hashing and signing count) and
stops when the last fetcher's checkpoint directory turns complete (the atomic rename after every
shard was verified). Origin upload bytes come from the trainer's status file.

Peer: `shardcast` 0.3.2 in its own venv (.bench-venv-shardcast; created on first use): an origin
through its Python API, two `shardcast-middle` relays (check interval 1 s) and N
`shardcast-client`s, each in its own working directory, each restarted until it succeeds (a
client gives up when a relay lists a version it has not finished downloading). Relays and clients
each get a private /tmp (`unshare -m` and a tmpfs; hence the work directory is not under /tmp):
they all write the fixed /tmp/dummy.bin when ranking servers, and concurrent ones kill each other. \
Every shardcast server gets
the data1.bin that its clients download first to rank servers. The clock starts
at `broadcast()` and stops when the last client has written the reassembled file.

Every repeat checks every fetcher's and client's file byte for byte (sha256) against the original.
The last line is `broadcast: ours=<s> peer=<s> ratio=<peer/ours> target=5 ok|short` over the
largest configuration's medians.

    .venv/bin/python bench/broadcast.py            # 512 MiB to 4 and to 8 fetchers
    .venv/bin/python bench/broadcast.py --quick    # 64 MiB to 4 fetchers, under a minute or so
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.shards_swarm import ShardSwarm, make_checkpoint, shard_status  # noqa: E402

PEER_VENV = ROOT / ".bench-venv-shardcast"
PEER_VERSION = "0.3.2"
MIB = 1 << 20
TARGET = 5.0
ORIGIN_SCRIPT = """
import sys, shardcast
shardcast.initialize(data_dir=sys.argv[1], port=int(sys.argv[2]))
print("ready", flush=True)
for line in sys.stdin:
    print(shardcast.broadcast(line.strip()), flush=True)
"""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            digest.update(chunk)
    return digest.hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float, poll_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {timeout_s:g} s")
        time.sleep(poll_s)


# ---- ours --------------------------------------------------------------------------------------

def run_ours(work: Path, fetchers: int, mib: int, repeats: int, shard_mib: int) -> list[tuple[float, float, bool]]:
    """(seconds, origin upload in checkpoint copies, all correct) per repeat."""
    run_id = f"bench-{fetchers}"
    # The node's own default timings (heartbeat 10 s, discovery 15 s), not the tests' fast ones:
    # their background work would otherwise compete with the transfer for two cores.
    swarm = ShardSwarm(work / f"ours-{fetchers}", run_id, {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(shard_mib * MIB)},
                       timing={})
    results = []
    try:
        origin = swarm.start_origin()
        nodes = [swarm.start_fetcher(f"f{i}") for i in range(fetchers)]
        wait_for(swarm.swarm.converged, 180, poll_s=0.25)
        swarm.publish_dir.mkdir(parents=True, exist_ok=True)
        for repeat in range(repeats):
            step = repeat + 1
            staging = swarm.publish_dir / f".writing-{step}"
            digest = make_checkpoint(staging, mib, seed=1000 + step)
            size = staging.stat().st_size
            uploaded_before = shard_status(origin).get("uploaded_bytes", 0)
            complete = [n.home / "shards" / run_id / f"{step:012d}" for n in nodes]
            start = time.monotonic()
            os.rename(staging, swarm.publish_dir / f"step-{step}.safetensors")
            wait_for(lambda complete=complete: all(p.is_dir() for p in complete), 600)
            elapsed = time.monotonic() - start
            correct = all(sha256(p / "checkpoint.safetensors") == digest for p in complete)
            time.sleep(0.6)  # the status file is rewritten every 0.5 s
            copies = (shard_status(origin)["uploaded_bytes"] - uploaded_before) / size
            results.append((elapsed, copies, correct))
            print(f"  ours    {fetchers} fetchers, {mib} MiB, repeat {repeat + 1}: {elapsed:6.2f} s, "
                  f"origin uploaded {copies:.2f} copies, {'correct' if correct else 'WRONG'}", flush=True)
    finally:
        swarm.stop_all()
    return results


# ---- the reference SHARDCAST ------------------------------------------------------------------

def ensure_peer() -> Path:
    python = PEER_VENV / "bin" / "python"
    if not (PEER_VENV / "bin" / "shardcast-client").exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"shardcast=={PEER_VERSION}"], check=True)
    return PEER_VENV / "bin"


def private_tmp(command: list[str]) -> list[str]:
    """``command`` in its own mount namespace with an empty /tmp (shardcast clients share fixed
    scratch files there); unchanged where unshare is not available."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return command
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /tmp && exec "$@"', "sh",
            *command]


def run_peer(work: Path, clients: int, mib: int, repeats: int) -> list[tuple[float, bool]]:
    """(seconds, all correct) per repeat."""
    bin_dir = ensure_peer()
    base = work / f"peer-{clients}"
    base.mkdir(parents=True)
    env = {**os.environ, "SHARDCAST_LOG_LEVEL": "WARNING"}
    origin_port, middle_ports = free_port(), [free_port(), free_port()]
    logs = open(base / "peer.log", "w")  # noqa: SIM115 - closed below
    procs: list[subprocess.Popen] = []
    results = []
    # Each shardcast server must hold a data1.bin: its clients time a download of it to rank servers.
    for name in ("origin", "middle0/data", "middle1/data"):
        (base / name).mkdir(parents=True)
        (base / name / "data1.bin").write_bytes(bytes(MIB))
    try:
        origin = subprocess.Popen([str(bin_dir / "python"), "-c", ORIGIN_SCRIPT, str(base / "origin"),
                                   str(origin_port)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs, text=True, env=env,
                                  cwd=base)
        procs.append(origin)
        assert origin.stdout is not None and origin.stdin is not None
        assert origin.stdout.readline().strip() == "ready"
        for i, port in enumerate(middle_ports):
            procs.append(subprocess.Popen(private_tmp([
                str(bin_dir / "shardcast-middle"), "--upstream", f"http://127.0.0.1:{origin_port}",
                "--data-dir", str(base / f"middle{i}" / "data"), "--port", str(port), "--check-interval", "1",
                "--log-level", "WARNING"]), stdout=logs, stderr=logs, env=env, cwd=base / f"middle{i}"))
        servers = ",".join(f"http://127.0.0.1:{p}" for p in middle_ports)
        for repeat in range(repeats):
            source = base / f"checkpoint-{repeat}.safetensors"
            digest = make_checkpoint(source, mib, seed=2000 + repeat)
            start = time.monotonic()
            origin.stdin.write(f"{source}\n")
            origin.stdin.flush()
            version = origin.stdout.readline().strip()
            outputs = [base / f"client{i}-{repeat}" / "out.bin" for i in range(clients)]
            running: dict[int, subprocess.Popen] = {}
            done: set[int] = set()
            deadline = start + 600
            while len(done) < clients and time.monotonic() < deadline:
                for i in range(clients):
                    if i in done:
                        continue
                    proc = running.get(i)
                    if proc is None:
                        cwd = outputs[i].parent
                        cwd.mkdir(exist_ok=True)
                        running[i] = subprocess.Popen(private_tmp([
                            str(bin_dir / "shardcast-client"), "--servers", servers, "--version", version,
                            "--output-dir", str(cwd / "dl"), "--output-file", str(outputs[i]), "--log-level", "ERROR"]),
                            stdout=logs, stderr=logs, env=env, cwd=cwd)
                    elif proc.poll() is not None:
                        del running[i]
                        if proc.returncode == 0 and outputs[i].exists():
                            done.add(i)
                        else:
                            time.sleep(0.2)  # not there yet: ask again, as an operator's loop would
                time.sleep(0.02)
            elapsed = time.monotonic() - start
            for proc in running.values():
                proc.kill()
            correct = len(done) == clients and all(sha256(p) == digest for p in outputs)
            results.append((elapsed, correct))
            print(f"  peer    {clients} clients,  {mib} MiB, repeat {repeat + 1}: {elapsed:6.2f} s, "
                  f"{'correct' if correct else 'WRONG or incomplete'}", flush=True)
            source.unlink()
            for p in outputs:
                shutil.rmtree(p.parent, ignore_errors=True)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        logs.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB to 4 fetchers, 2 repeats (1 for the peer)")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--fetchers", default="4,8", help="comma-separated fetcher counts")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of ours per fetcher count")
    parser.add_argument("--peer-repeats", type=int, default=2, help="repeats of shardcast per fetcher count")
    parser.add_argument("--shard-mib", type=int, default=16, help="our shard size (shardcast keeps its 50 MB)")
    args = parser.parse_args()
    if args.quick:
        args.mib, args.fetchers, args.repeats, args.peer_repeats = 64, "4", 2, 1
    counts = [int(c) for c in args.fetchers.split(",")]
    summary = []
    all_correct = True
    (ROOT / "out").mkdir(exist_ok=True)  # not /tmp: shardcast clients get a private /tmp (see run_peer)
    with tempfile.TemporaryDirectory(prefix="bench-broadcast-", dir=ROOT / "out") as tmp:
        work = Path(tmp)
        for count in counts:
            print(f"{args.mib} MiB to {count} fetchers", flush=True)
            ours = run_ours(work, count, args.mib, args.repeats, args.shard_mib)
            peer = run_peer(work, count, args.mib, args.peer_repeats)
            ours_s = statistics.median(t for t, _, _ in ours)
            peer_s = statistics.median(t for t, _ in peer)
            copies = max(c for _, c, _ in ours)
            correct_ours = sum(ok for _, _, ok in ours)
            correct_peer = sum(ok for _, ok in peer)
            all_correct &= correct_ours == len(ours)
            summary.append((count, ours_s, peer_s))
            print(f"  {count} fetchers: ours median {ours_s:.2f} s ({correct_ours}/{len(ours)} correct, origin upload "
                  f"at most {copies:.2f} copies); shardcast median {peer_s:.2f} s "
                  f"({correct_peer}/{len(peer)} correct); "
                  f"ratio {peer_s / ours_s:.1f}", flush=True)
    count, ours_s, peer_s = summary[-1]
    ratio = peer_s / ours_s
    verdict = "ok" if ratio >= TARGET and all_correct else "short"
    print(f"broadcast: ours={ours_s:.2f} peer={peer_s:.2f} ratio={ratio:.1f} target={TARGET:g} {verdict}")


if __name__ == "__main__":
    main()
