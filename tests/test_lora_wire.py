"""The ``lora/v1`` adapter body and its exact merge (protocol/lora.py): a follower turns the frozen
base and an adapter into exactly the checkpoint the trainer signed, whatever the thread count;
hostile adapters (wrong shapes, names, ranks, values, lengths) are refused whole."""

import dataclasses
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from intellect_node.crypto.identity import Identity
from intellect_node.node.shards.checkpoint import build_manifest, write_safetensors
from intellect_node.node.shards.deltas import DeltaFailed, adapter_delta, build_from_delta, usable_base
from intellect_node.node.shards.store import ShardStore
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue, MalformedBody, Truncated
from intellect_node.protocol.lora import MAGIC, decode_adapter, encode_adapter, merged_weight
from intellect_node.protocol.manifest import CheckpointManifest

RUN = "lora-wire"
SHARD = 1 << 16
TRAINER = Identity.generate()
TARGETS = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight")


def base_policy(dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"model.embed_tokens.weight": torch.randn(100, 64, generator=g).to(dtype),
            TARGETS[0]: (torch.randn(64, 64, generator=g) * 0.05).to(dtype),
            TARGETS[1]: (torch.randn(32, 64, generator=g) * 0.05).to(dtype),
            "model.norm.weight": torch.ones(64, dtype=dtype)}


def adapter(rank: int = 4, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    g = np.random.default_rng(seed)
    shapes = {TARGETS[0]: (64, 64), TARGETS[1]: (32, 64)}
    return {name: (g.standard_normal((rank, i)).astype(np.float32) * 0.1,
                   g.standard_normal((o, rank)).astype(np.float32) * 0.01) for name, (o, i) in shapes.items()}


def merged_file(tmp_path: Path, base: Path, manifest: CheckpointManifest, matrices, scaling: float) -> Path:
    """The trainer's side: the merged checkpoint, computed with the protocol's merge."""
    out = tmp_path / "merged.safetensors"
    data = bytearray(base.read_bytes())
    for entry in manifest.tensors:
        if entry.name in matrices:
            kind = np.float32 if entry.dtype == "F32" else np.uint16
            stored = np.frombuffer(data, dtype=kind, count=entry.nbytes // np.dtype(kind).itemsize,
                                   offset=entry.offset).reshape(entry.shape)
            stored[...] = merged_weight(stored, *matrices[entry.name], scaling, entry.dtype)
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_merge_matches_torch_to_rounding_and_is_exact_on_a_follower(tmp_path, dtype):
    base_path = tmp_path / "base.safetensors"
    write_safetensors(base_policy(dtype), base_path)
    manifest0 = build_manifest(base_path, run_id=RUN, step=0, parent_step=None, shard_size=SHARD)
    matrices = adapter()
    merged = merged_file(tmp_path, base_path, manifest0, matrices, 2.0)
    # the merge is the float32 merge, rounded once more: within one ulp of the dtype of torch's own
    from safetensors.torch import load_file
    got = load_file(merged)[TARGETS[0]].float()
    a, b = (torch.from_numpy(m) for m in matrices[TARGETS[0]])
    want = base_policy(dtype)[TARGETS[0]].float() + 2.0 * (b @ a)
    assert torch.allclose(got, want, rtol=2 ** -7, atol=1e-6)
    # a follower holding the base builds exactly the merged bytes from the adapter alone
    body = encode_adapter(manifest0.tensors, 4, 2.0, matrices)
    trainer_store, follower = ShardStore(tmp_path / "t", RUN), ShardStore(tmp_path / "f", RUN)
    env0 = codec.encode(manifest0, TRAINER, lifetime_s=600)
    for store in (trainer_store, follower):
        copy = tmp_path / f"copy-{id(store)}"
        copy.write_bytes(base_path.read_bytes())
        store.add_published(copy, codec.decode(env0, CheckpointManifest), env0)
    manifest1 = build_manifest(merged, run_id=RUN, step=5, parent_step=4, shard_size=SHARD)
    ref = adapter_delta(trainer_store.checkpoints[0], body, manifest1)
    assert ref is not None and ref.base_step == 0 and ref.size == len(body)
    envelope = codec.encode(dataclasses.replace(manifest1, delta=ref), TRAINER, lifetime_s=600)
    signed = codec.decode(envelope, CheckpointManifest)
    built = build_from_delta(follower, signed, envelope, usable_base(follower, signed.message), body)
    assert built.data_path.read_bytes() == merged.read_bytes()
    assert len(body) < merged.stat().st_size


def test_the_merge_gives_the_same_bits_with_and_without_wide_vector_instructions():
    """numpy's SIMD kernels are chosen per CPU (AVX2, AVX-512...): the merge must not care."""
    script = ("import hashlib, numpy as np, torch;"
              "from intellect_node.protocol.lora import merged_weight;"
              "g = np.random.default_rng(1); a = g.standard_normal((8, 300)).astype(np.float32);"
              "b = g.standard_normal((200, 8)).astype(np.float32);"
              "base = torch.from_numpy(g.standard_normal((200, 300)).astype(np.float32)).to(torch.bfloat16);"
              "stored = base.view(torch.int16).numpy().view(np.uint16);"
              "print(hashlib.sha256(merged_weight(stored, a, b, 2.0, 'BF16').tobytes()).hexdigest())")
    digests = set()
    for disabled in ("", "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"):
        env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=disabled)
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        digests.add(run.stdout.split()[0])
    assert len(digests) == 1


# ---- hostile adapters -------------------------------------------------------------------------


@pytest.fixture
def tensors(tmp_path):
    path = tmp_path / "base.safetensors"
    write_safetensors(base_policy(), path)
    return build_manifest(path, run_id=RUN, step=0, parent_step=None, shard_size=SHARD).tensors


def index(tensors, name):
    return [e.name for e in tensors].index(name)


def test_round_trip(tensors):
    decoded = decode_adapter(encode_adapter(tensors, 4, 2.0, adapter()), tensors)
    assert decoded.rank == 4 and decoded.scaling == 2.0
    a, b = decoded.modules[index(tensors, TARGETS[1])]
    assert a.shape == (4, 64) and b.shape == (32, 4)


def head(rank=4, scaling=2.0, count=1, magic=MAGIC) -> bytes:
    return struct.pack(">8sIdI", magic, rank, scaling, count)


@pytest.mark.parametrize("body,error", [
    (b"INALORA1", MalformedBody),
    (head(magic=b"INADELTA"), MalformedBody),
    (head(rank=0), InvalidValue),
    (head(rank=257), InvalidValue),
    (head(scaling=float("nan")), InvalidValue),
    (head(scaling=0.0), InvalidValue),
    (head(scaling=1e30), InvalidValue),
    (head(count=0), InvalidValue),
    (head(count=99), InvalidValue),
    (head(), Truncated),
])
def test_bad_heads(tensors, body, error):
    with pytest.raises(error):
        decode_adapter(body, tensors)


def module(tensor: int, rank: int, in_f: int, out_f: int, fill: float = 0.01) -> bytes:
    return struct.pack(">I", tensor) + np.full(rank * in_f + out_f * rank, fill, dtype="<f4").tobytes()


def test_bad_modules(tensors):
    q, v = index(tensors, TARGETS[0]), index(tensors, TARGETS[1])
    norm = index(tensors, "model.norm.weight")
    ok = head() + module(q, 4, 64, 64)
    assert decode_adapter(ok, tensors).modules
    with pytest.raises(Truncated):
        decode_adapter(ok[:-1], tensors)
    with pytest.raises(MalformedBody):
        decode_adapter(ok + b"\x00", tensors)  # bytes after the last module
    with pytest.raises(InvalidValue):
        decode_adapter(head() + module(norm, 4, 64, 1), tensors)  # a 1-D tensor is no weight
    with pytest.raises(InvalidValue):
        decode_adapter(head() + module(len(tensors), 4, 64, 64), tensors)  # no such tensor
    with pytest.raises(InvalidValue):
        decode_adapter(head(count=2) + module(v, 4, 64, 32) + module(q, 4, 64, 64), tensors)  # unsorted
    with pytest.raises(InvalidValue):
        decode_adapter(head(count=2) + module(q, 4, 64, 64) + module(q, 4, 64, 64), tensors)  # twice
    with pytest.raises(InvalidValue):
        decode_adapter(head() + module(q, 4, 64, 64, fill=float("inf")), tensors)
    with pytest.raises((Truncated, MalformedBody)):
        decode_adapter(head() + module(q, 4, 32, 64), tensors)  # shapes of another layer


def test_an_adapter_that_overflows_the_weights_is_refused_and_leaves_nothing(tmp_path):
    base_path = tmp_path / "base.safetensors"
    write_safetensors(base_policy(torch.float16), base_path)
    manifest0 = build_manifest(base_path, run_id=RUN, step=0, parent_step=None, shard_size=SHARD)
    huge = {name: (np.full_like(a, 1e3), np.full_like(b, 1e3)) for name, (a, b) in adapter().items()}
    body = encode_adapter(manifest0.tensors, 4, 2.0, huge)  # 8e6 per element: past float16's range
    store = ShardStore(tmp_path / "f", RUN)
    env0 = codec.encode(manifest0, TRAINER, lifetime_s=600)
    store.add_published(base_path, codec.decode(env0, CheckpointManifest), env0)
    ref = adapter_delta(store.checkpoints[0], body, manifest0)
    manifest1 = dataclasses.replace(manifest0, step=1, parent_step=0, delta=ref)
    envelope = codec.encode(manifest1, TRAINER, lifetime_s=600)
    signed = codec.decode(envelope, CheckpointManifest)
    with pytest.raises(DeltaFailed) as failed:
        build_from_delta(store, signed, envelope, store.checkpoints[0], body)
    assert failed.value.reason == "delta_refused" and 1 not in store.checkpoints
