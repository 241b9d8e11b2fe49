"""Time from a trainer's step to the last of 4 followers holding it: sparse deltas and LoRA
adapters through the shard overlay against today's full broadcast, same run, same links (issue 48).

Two swarms share one switch of rate-limited links (tests/support/netns.py ``LimitedSwitch``, as
root; `ip` and `tc` needed): five namespaces, each link limited to ``--rate`` Mbit/s each way by
``tc tbf`` (no delay: netem is not in this kernel). The first namespace holds both trainers
(trainer-only origin nodes publishing through their publish directories), each of the four others
one follower of each swarm (inference nodes without a model: they fetch, verify and re-serve every
step), all real ``intellect-node`` processes:

- FULL: the origin runs with ``INTELLECT_NODE_SHARDS_MAX_DELTA_FRACTION=0`` (specs/deltas.md: full
  checkpoints only), so every step travels as the whole checkpoint, as before issue 48;
- deltas: the origin runs with the default (0.5). Its first step (the frozen base, every follower
  fetches it in full: shown, not counted) is followed by, alternately,
  SPARSE: the parent with ``--sparse-fraction`` (1%) of its elements moved by one bf16 ulp (what
  an fp32 master at lr 1e-6 gives a bf16 policy: a weight changes only where its update crosses an
  ulp; bench/deltas.py measures that fraction on real GRPO steps of SmolLM2-135M), published as a
  ``sparse/v2`` delta the origin encodes itself, and
  LORA: ``merge(base, adapter)`` of a rank-8 (alpha 16) adapter on every layer's q_proj and v_proj,
  its ``lora/v1`` body (``protocol.lora.encode_adapter``) written as ``step-N.base-0.lora`` before
  the checkpoint is handed over, the checkpoint built by the merge every follower runs
  (``node.shards.deltas.merge_adapter`` on a copy of the base file, as
  ``node/roles/trainer/lora_publish.write_merged`` does).

A run ships one kind of step, and a follower copies the base of the next delta while the swarm
works (specs/deltas.md 5a: the frozen base after an adapter, else the newest step). So the delta
swarm first ships LORA steps (a LoRA run, its base pinned from the first adapter), each
``STEP_GAP_S`` after the last follower held the one before (a real run's steps are a minute or more
apart), then SPARSE steps (a full fine-tuning run on the last merged policy), each after a FULL step of
the other swarm. Every step starts on a settled machine (``settle``: no node of either swarm still
syncing a step or copying a base ahead, then every dirty page flushed), as a real run's steps, a
minute or more apart on a disk of each node's own, would: ten nodes share one disk here, and right
after a FULL step its four followers' syncs of 269 MB each held the next SPARSE step's origin up.
The first SPARSE step after the adapters has another base than the one copied ahead: shown, not
counted. The policy is synthetic bf16 shaped like SmolLM2-135M (30 layers, hidden 576, intermediate 1536, 9
query and 3 key/value heads, vocabulary 49152, tied embeddings: 134.5 M weights, 269 MB), written
by the trainer's ``write_safetensors``.

The clock starts when the step's file is renamed into the origin's publish directory (so the
origin's hashing, signing and delta encoding count) and stops when the last follower's step
directory turns complete (the store's atomic rename after every shard hash matched the signed
manifest; the status file, rewritten every 0.5 s, is checked afterwards: ``steps[k].complete``).
Every follower's file is checked byte for byte (sha256) against the published one, and every
SPARSE/LORA step must have been built from its delta by every follower (``delta_steps``) and
published with the expected format (the origin's ``steps[k].delta_format``). Bytes: what the four
followers fetched together (shards + delta bodies, from their status files) and what the origin
uploaded.

The last line: ``delta_broadcast: ours=<s> peer=<s> ratio=<peer/ours> target=10 ok|short``, ours
the slower of the SPARSE and LORA medians at the lowest rate run (20 Mbit/s by default), peer the
FULL median at that rate; ``ok`` needs the ratio and every check.

    sudo .venv/bin/python bench/delta_broadcast.py            # 269 MB policy at 100 and 20 Mbit/s, 3 repeats
    sudo .venv/bin/python bench/delta_broadcast.py --quick    # 19 MB policy at 20 Mbit/s, 1 repeat (about 80 s)
    sudo .venv/bin/python bench/delta_broadcast.py --rate 20 --repeats 5
    sudo .venv/bin/python bench/delta_broadcast.py --rate 100 --followers 1   # one node's step, no shared disk
    sudo .venv/bin/python bench/delta_broadcast.py --rate 100 --work-dir /dev/shm   # every home in memory
    sudo .venv/bin/python bench/delta_broadcast.py --rate 20 --followers 8 --delta-seed-copies 8   # a star
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from intellect_node.node.demo.local_swarm import LocalSwarm, NodeProcess, death_report  # noqa: E402
from intellect_node.node.shards.checkpoint import read_tensor_index, write_safetensors  # noqa: E402
from intellect_node.node.shards.copy_ahead import COPY_AHEAD  # noqa: E402
from intellect_node.node.shards.deltas import merge_adapter  # noqa: E402
from intellect_node.node.shards.store import UNSYNCED_FILE  # noqa: E402
from intellect_node.protocol.deltas import DELTA_FORMAT  # noqa: E402
from intellect_node.protocol.lora import decode_adapter, encode_adapter  # noqa: E402
from tests.support.netns import MAX_HOSTS, LimitedSwitch, unavailable_reason  # noqa: E402
from tests.support.shards_swarm import shard_status  # noqa: E402

TARGET = 10.0
MIB = 1 << 20
FOLLOWERS = 4  # the figure; --followers 1 shows one node's own step, off a disk shared by four
LORA_RANK, LORA_ALPHA = 8, 16
CONVERGE_S = 180.0
POLL_S = 0.05
STEP_GAP_S = 5.0  # between LORA steps: the swarm's generation between two real steps, shortened
STATUS_LAG_S = 0.6  # the status file is rewritten every 0.5 s
# SmolLM2-135M: hidden, intermediate, layers, query heads, key/value heads, vocabulary
FULL_SHAPE = (576, 1536, 30, 9, 3, 49152)
QUICK_SHAPE = (576, 1536, 2, 9, 3, 4096)  # 19 MB: the same layers, fewer of them, a smaller vocabulary


# ---- the policy --------------------------------------------------------------------------------

def policy_shapes(shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    hidden, inter, layers, heads, kv_heads, vocab = shape
    kv = hidden // heads * kv_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.input_layernorm.weight": (hidden,), f"{p}.post_attention_layernorm.weight": (hidden,),
                       f"{p}.self_attn.q_proj.weight": (hidden, hidden), f"{p}.self_attn.k_proj.weight": (kv, hidden),
                       f"{p}.self_attn.v_proj.weight": (kv, hidden), f"{p}.self_attn.o_proj.weight": (hidden, hidden),
                       f"{p}.mlp.gate_proj.weight": (inter, hidden), f"{p}.mlp.up_proj.weight": (inter, hidden),
                       f"{p}.mlp.down_proj.weight": (hidden, inter)})
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def base_policy(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: (torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02)
            .to(torch.bfloat16) for name, shape in shapes.items()}


def sparse_step(tensors: dict[str, torch.Tensor], fraction: float, seed: int) -> tuple[dict[str, torch.Tensor], int]:
    """A copy with about ``fraction`` of every tensor's elements one bf16 ulp further from zero
    (+1 on the bit pattern: never a NaN from these finite values); the elements changed."""
    g = torch.Generator().manual_seed(seed)
    out, changed = {}, 0
    for name, tensor in tensors.items():
        bits = tensor.clone().view(-1).view(torch.int16)
        count = max(1, round(bits.numel() * fraction))
        positions = torch.randint(0, bits.numel(), (count,), generator=g).unique()
        bits[positions] += 1
        changed += positions.numel()
        out[name] = bits.view(torch.bfloat16).view(tensor.shape)
    return out, changed


def adapter_body(index: Any, shapes: dict[str, tuple[int, ...]], seed: int) -> bytes:
    """A rank-8 ``lora/v1`` body on every q_proj and v_proj: A as initialised, B as a few steps train it."""
    rng = np.random.default_rng(seed)
    matrices = {}
    for name, (rows, cols) in ((n, s) for n, s in shapes.items() if n.endswith(("q_proj.weight", "v_proj.weight"))):
        a = rng.standard_normal((LORA_RANK, cols), dtype=np.float32) / np.float32(np.sqrt(cols))
        b = rng.standard_normal((rows, LORA_RANK), dtype=np.float32) * np.float32(2e-3)
        matrices[name] = (a, b)
    return encode_adapter(index, LORA_RANK, LORA_ALPHA / LORA_RANK, matrices)


def write_merged(base_path: Path, body: bytes, path: Path) -> None:
    """``merge(base, adapter)`` into ``path``: the base file's bytes with every targeted weight
    replaced by the merge followers run (node/roles/trainer/lora_publish.write_merged)."""
    index = read_tensor_index(base_path)
    adapter = decode_adapter(body, index)
    shutil.copyfile(base_path, path)
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_WRITE) as mapped:
            view = memoryview(mapped)
            try:
                merge_adapter(adapter, index, view)
            finally:
                view.release()
            mapped.flush()
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            digest.update(chunk)
    return digest.hexdigest()


# ---- the swarms --------------------------------------------------------------------------------

@dataclass
class Swarm:
    """A trainer-only origin and its followers, one per follower namespace."""

    label: str
    swarm: LocalSwarm
    publish_dir: Path
    origin: NodeProcess | None = None
    followers: list[NodeProcess] = field(default_factory=list)

    def step_dir(self, node: NodeProcess, step: int) -> Path:
        return node.home / "shards" / self.swarm.run_id / f"{step:012d}"

    def counters(self) -> tuple[int, int, int, int]:
        """(bytes the followers fetched: shards + delta bodies, delta steps they built, of those on a
        base copied ahead, origin upload)."""
        fetched = built = copied = 0
        for node in self.followers:
            status = shard_status(node)
            fetched += status.get("fetched_bytes", 0) + status.get("delta_bytes", 0)
            built += status.get("delta_steps", 0)
            copied += status.get("delta_copied_ahead", 0)
        assert self.origin is not None
        return fetched, built, copied, shard_status(self.origin).get("uploaded_bytes", 0)


def new_swarm(root: Path, label: str) -> Swarm:
    # the node's own timings (heartbeat 10 s, discovery 15 s): background work would otherwise
    # compete with the transfers for two cores (bench/broadcast.py does the same)
    return Swarm(label, LocalSwarm(root / label, run_id=f"delta-bench-{label}", timing={}), root / label / "publish")


def start_swarm(net: LimitedSwitch, swarm: Swarm, port: int, env: dict[str, str], origin_env: dict[str, str]) -> None:
    """The origin in the first namespace, a follower in each other one, all listening on ``port``."""
    hosts = list(net.ips)
    swarm.origin = swarm.swarm.start("origin", ["join", "--role", "trainer", "--new-swarm", "--publish-dir",
                                                str(swarm.publish_dir)], {**env, **origin_env},
                                     prefix=net.exec_prefix(hosts[0]), listen=f"/ip4/{net.ips[hosts[0]]}/tcp/{port}")
    joined = ["join", "--role", "inference", "--bootstrap", swarm.origin.addr, "--trainer", swarm.origin.peer_id]
    for i, host in enumerate(hosts[1:]):
        swarm.followers.append(swarm.swarm.start(f"f{i}", joined, env, prefix=net.exec_prefix(host),
                                                 listen=f"/ip4/{net.ips[host]}/tcp/{port}"))


@dataclass
class Sample:
    kind: str
    seconds: float
    fetched: int
    uploaded: int
    size: int
    delta_size: int | None
    ok: bool
    note: str = ""
    published_s: float | None = None  # from the hand-over until the origin held the step signed
    followers_s: tuple[float, ...] = ()  # from the hand-over until each follower held it, in order
    copied_ahead: int = 0  # followers that built it on a base copied ahead (specs/deltas.md 5a)


def wait_all(swarm: Swarm, step: int, bound_s: float) -> tuple[list[float], float | None]:
    """When each follower's step directory turned complete (sorted), and when the origin's did (its
    store renames the step's directory in once hashed, signed and, for a delta, encoded): the spread
    says whether followers wait on the links and the origin or on each other for the cores."""
    assert swarm.origin is not None
    dirs = [swarm.step_dir(node, step) for node in swarm.followers]
    origin_dir = swarm.step_dir(swarm.origin, step)
    published, arrived = None, {}
    deadline = time.monotonic() + bound_s
    while len(arrived) < len(dirs):
        if published is None and origin_dir.is_dir():
            published = time.monotonic()
        arrived.update({i: time.monotonic() for i, d in enumerate(dirs) if i not in arrived and d.is_dir()})
        if len(arrived) == len(dirs):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{swarm.label} step {step}: not on every follower within {bound_s:.0f} s; "
                               f"the nodes' last log lines:\n{swarm.swarm.log_tails()}")
        if (report := death_report(swarm.swarm.nodes.values())) is not None:
            raise RuntimeError(report)
        time.sleep(POLL_S)
    return sorted(arrived.values()), published


def settle(swarms: list[Swarm], bound_s: float = 120.0) -> None:
    """Wait until no node of either swarm has a step waiting for its background fsync or a copy
    ahead being made, then flush every dirty page. A real run's steps are a minute or more apart and
    each node has its own disk; here ten nodes share one, and right after a FULL step four followers'
    syncs of the whole checkpoint delayed the next SPARSE step's origin from 0.5 s to 0.97 s (14th
    stop). Both kinds of step start on the same quiet disk."""
    time.sleep(2 * POLL_S)  # a copy ahead starts in its thread just after the completion
    nodes = [node for s in swarms for node in [s.origin, *s.followers] if node is not None]
    deadline = time.monotonic() + bound_s
    while any(background_work(node) for node in nodes):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the nodes' background syncs and copies did not finish within {bound_s:.0f} s")
        time.sleep(POLL_S)
    os.sync()


def background_work(node: NodeProcess) -> bool:
    """Whether a step directory still waits for its fsync or a copy ahead is being made (their
    names: node/shards/store.py ``UNSYNCED_FILE``, node/shards/copy_ahead.py)."""
    root = node.home / "shards"
    return any(root.glob(f"*/*/{UNSYNCED_FILE}")) or any(root.glob(f"*/{COPY_AHEAD}*.tmp"))


def publish_and_time(swarm: Swarm, step: int, source: Path, kind: str, bound_s: float, everyone: list[Swarm],
                     adapter: bytes | None = None) -> Sample:
    """Hand ``source`` (a copy) to the origin as step ``step`` once ``everyone`` is settled, and time
    it to the last follower."""
    swarm.publish_dir.mkdir(parents=True, exist_ok=True)
    staging = swarm.publish_dir / f".writing-{step}"
    shutil.copyfile(source, staging)
    digest = sha256(staging)
    size = staging.stat().st_size
    if adapter is not None:  # the trainer writes the adapter beside the checkpoint before handing it over
        (swarm.publish_dir / f"step-{step}.base-0.lora").write_bytes(adapter)
    settle(everyone)
    fetched0, built0, copied0, uploaded0 = swarm.counters()
    start = time.monotonic()
    os.rename(staging, swarm.publish_dir / f"step-{step}.safetensors")
    arrivals, published_at = wait_all(swarm, step, bound_s)
    seconds = arrivals[-1] - start
    time.sleep(STATUS_LAG_S)
    assert swarm.origin is not None
    deadline = time.monotonic() + 10
    while not all(shard_status(n).get("steps", {}).get(str(step), {}).get("complete") for n in swarm.followers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{swarm.label} step {step}: a status file does not say complete")
        time.sleep(0.1)
    fetched1, built1, copied1, uploaded1 = swarm.counters()
    published = shard_status(swarm.origin).get("steps", {}).get(str(step), {})
    want_format = {"sparse": DELTA_FORMAT, "lora": "lora/v1"}.get(kind)
    same = all(sha256(swarm.step_dir(node, step) / "checkpoint.safetensors") == digest for node in swarm.followers)
    by_delta = built1 - built0
    problems = []
    if not same:
        problems.append("a follower's file differs")
    if published.get("delta_format") != want_format:
        problems.append(f"published as {published.get('delta_format')}, not {want_format}")
    if want_format is not None and by_delta != len(swarm.followers):
        problems.append(f"{by_delta} of {len(swarm.followers)} followers built it from the delta")
    return Sample(kind, seconds, fetched1 - fetched0, uploaded1 - uploaded0, size, published.get("delta_size"),
                  not problems, "; ".join(problems), None if published_at is None else published_at - start,
                  tuple(t - start for t in arrivals), copied1 - copied0)


def show(rate: float, repeat: int | str, sample: Sample) -> None:
    body = f", body {sample.delta_size:,} B, {sample.copied_ahead} on a copy ahead" if sample.delta_size else ""
    origin = "" if sample.published_s is None else f" (origin published at {sample.published_s:.2f} s)"
    origin += f" (followers at {', '.join(f'{t:.2f}' for t in sample.followers_s)} s)" if sample.followers_s else ""
    print(f"  {rate:g} Mbit/s {sample.kind:6s} repeat {repeat}: {sample.seconds:7.2f} s{origin}; followers fetched "
          f"{sample.fetched / 1e6:8.2f} MB ({sample.fetched / sample.size:.3f} checkpoints), origin uploaded "
          f"{sample.uploaded / 1e6:8.2f} MB{body}; {'ok' if sample.ok else 'WRONG: ' + sample.note}", flush=True)


def run_rate(work: Path, rate: float, shapes: dict[str, tuple[int, ...]], base: dict[str, torch.Tensor],
             repeats: int, fraction: float, shard_mib: int, followers: int = FOLLOWERS,
             seed_copies: int | None = None) -> list[Sample]:
    """One switch at ``rate``, both swarms on it: ``repeats`` LORA, then 1 + ``repeats`` x (FULL, SPARSE).
    ``seed_copies``: every delta node's ``[shards] delta_seed_copies`` [default: the node's]."""
    env = {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(shard_mib * MIB)}
    base_path = work / "base.safetensors"
    write_safetensors(base, base_path)
    index = read_tensor_index(base_path)
    size = base_path.stat().st_size
    bound_s = 60 + 8 * size * 8 / (rate * 1e6)  # eight times one copy through one link, and a minute
    samples: list[Sample] = []
    full, deltas = new_swarm(work, "full"), new_swarm(work, "deltas")
    swarms = [full, deltas]
    with LimitedSwitch(hosts=1 + followers, mbit=rate) as net:
        try:
            start_swarm(net, full, 4001, env, {"INTELLECT_NODE_SHARDS_MAX_DELTA_FRACTION": "0"})
            start_swarm(net, deltas, 4002, env if seed_copies is None else
                        {**env, "INTELLECT_NODE_SHARDS_DELTA_SEED_COPIES": str(seed_copies)}, {})
            started = time.monotonic()
            for s in swarms:
                s.swarm.wait_until(s.swarm.converged, CONVERGE_S, poll_s=0.5)
            print(f"  {rate:g} Mbit/s: {2 * (1 + followers)} nodes up, both swarms converged in "
                  f"{time.monotonic() - started:.0f} s", flush=True)
            first = publish_and_time(deltas, 0, base_path, "base", bound_s, swarms)
            show(rate, "-", first)
            print("    (the frozen base, fetched in full by every follower of the delta swarm; not counted)",
                  flush=True)
            step = 0
            for r in range(repeats):  # a LoRA run's steps, on the frozen base (pinned from its first adapter)
                step += 1
                body = adapter_body(index, shapes, seed=1000 * r + 2)
                source = work / "merged.safetensors"
                write_merged(base_path, body, source)
                time.sleep(STEP_GAP_S)
                sample = publish_and_time(deltas, step, source, "lora", bound_s, swarms, adapter=body)
                show(rate, r + 1, sample)
                samples.append(sample)
            current = load_file(str(source))  # then a full fine-tuning run moves the last merged policy
            for r in range(-1, repeats):  # FULL and SPARSE one after the other
                step += 1
                current, changed = sparse_step(current, fraction, seed=1000 * (r + 1) + 1)
                source = work / "sparse.safetensors"
                write_safetensors(current, source)
                if r >= 0:
                    sample = publish_and_time(full, r + 1, source, "full", bound_s, swarms)
                    show(rate, r + 1, sample)
                    samples.append(sample)
                sample = publish_and_time(deltas, step, source, "sparse", bound_s, swarms)
                sample.note = sample.note or f"{changed:,} elements ({changed / (size / 2):.2%}) one ulp"
                show(rate, "-" if r < 0 else r + 1, sample)
                if r < 0:
                    print("    (the first sparse step after the adapters: its base is not the frozen base that "
                          "followers copied ahead; not counted)", flush=True)
                    continue
                samples.append(sample)
        finally:
            for s in swarms:
                s.swarm.stop_all()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 19 MB policy, 20 Mbit/s only, 1 repeat")
    parser.add_argument("--rate", type=float, action="append", help="link rate in Mbit/s (repeatable; "
                        "default 100 and 20)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of FULL, SPARSE, LORA (default 3, quick 1)")
    parser.add_argument("--sparse-fraction", type=float, default=0.01,
                        help="elements a SPARSE step moves by one ulp (default 0.01)")
    parser.add_argument("--shard-mib", type=int, default=None, help="shard size (default 16, quick 4)")
    parser.add_argument("--followers", type=int, default=FOLLOWERS,
                        help=f"followers per swarm, 1 to {MAX_HOSTS - 1} (default {FOLLOWERS}: the issue's figure)")
    parser.add_argument("--delta-seed-copies", type=int, default=None,
                        help="copies of each delta body a node of the delta swarm sends before it names their "
                             "holders (specs/deltas.md section 4) [default: the node's, 4]; as many as --followers: "
                             "the star every follower fetching from the trainer")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "out",
                        help="where every node's home goes (default out/, this disk; a tmpfs such as /dev/shm "
                             "takes the one disk that the followers share on one machine out of the figure)")
    args = parser.parse_args()
    reason = unavailable_reason(("ip", "tc"))
    if reason is not None:
        print(f"delta_broadcast: skipped: {reason}")
        sys.exit(2)
    rates = args.rate or ([20.0] if args.quick else [100.0, 20.0])
    repeats = max(1, min(args.repeats or (1 if args.quick else 3), 20))
    shard_mib = args.shard_mib or (4 if args.quick else 16)
    if not all(0.1 <= r <= 10_000 for r in rates) or not 0 < args.sparse_fraction <= 0.2 \
            or not 1 <= args.followers < MAX_HOSTS or not 1 <= (args.delta_seed_copies or 1) <= 64:
        sys.exit(f"rates of 0.1 to 10000 Mbit/s, a sparse fraction in (0, 0.2], 1 to {MAX_HOSTS - 1} followers, "
                 "1 to 64 seed copies")
    shapes = policy_shapes(QUICK_SHAPE if args.quick else FULL_SHAPE)
    base = base_policy(shapes, seed=7)
    weights = sum(t.numel() for t in base.values())
    print(f"policy: {weights / 1e6:.1f} M bf16 weights ({2 * weights / 1e6:.1f} MB), {args.followers} followers, "
          f"shards of {shard_mib} MiB, SPARSE moves {args.sparse_fraction:.2%} of elements, LORA rank {LORA_RANK} "
          f"on q_proj/v_proj; {repeats} repeats at {', '.join(f'{r:g}' for r in rates)} Mbit/s", flush=True)
    began = time.monotonic()
    results: dict[float, dict[str, float]] = {}
    all_ok = True
    args.work_dir.mkdir(parents=True, exist_ok=True)
    for rate in rates:
        with tempfile.TemporaryDirectory(prefix="bench-delta-broadcast-", dir=args.work_dir) as tmp:
            samples = run_rate(Path(tmp), rate, shapes, base, repeats, args.sparse_fraction, shard_mib,
                               args.followers, args.delta_seed_copies)
        all_ok &= all(s.ok for s in samples)
        medians = {}
        for kind in ("full", "sparse", "lora"):
            chosen = [s for s in samples if s.kind == kind]
            medians[kind] = statistics.median(s.seconds for s in chosen)
            fetched = statistics.median(s.fetched for s in chosen)
            print(f"{rate:g} Mbit/s {kind:6s}: median {medians[kind]:7.2f} s over {len(chosen)}, followers fetched "
                  f"{fetched / 1e6:8.2f} MB a step (median), {sum(s.ok for s in chosen)}/{len(chosen)} ok; "
                  f"{medians['full'] / medians[kind]:.1f}x faster than full", flush=True)
        results[rate] = medians
    print(f"wall time {time.monotonic() - began:.0f} s", flush=True)
    rate = min(results)
    medians = results[rate]
    ours, peer = max(medians["sparse"], medians["lora"]), medians["full"]
    ratio = peer / ours
    print(f"delta_broadcast: ours={ours:.2f} peer={peer:.2f} ratio={ratio:.1f} target={TARGET:g} "
          f"{'ok' if ratio >= TARGET and all_ok else 'short'}")


if __name__ == "__main__":
    main()
