"""Deltas and adapters against the file's shard boundaries (protocol/deltas.py ``apply_delta``,
node/shards/deltas.py ``merge_adapter``): elements that straddle a shard boundary (a file whose
tensor data starts at an odd offset), shards the delta leaves alone, changes at a shard's first and
last bytes and an adapted weight split over several shards all give the signed bytes when a
follower builds the step and hashes it shard by shard. And the publisher's encoding bounded by an
adapter's size ships the same bytes or stops early."""

import dataclasses
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from intellect_node.crypto.identity import Identity
from intellect_node.node.shards.checkpoint import build_manifest, hash_shards
from intellect_node.node.shards.deltas import adapter_delta, build_from_delta, make_delta, usable_base
from intellect_node.node.shards.store import ShardStore
from intellect_node.protocol import codec
from intellect_node.protocol.deltas import DEFLATE_LEVEL, HEAD_SIZE, apply_delta, decode_delta, encode_delta
from intellect_node.protocol.lora import encode_adapter, merged_weight
from intellect_node.protocol.manifest import CheckpointManifest

RUN = "delta-windows"
SHARD = 1 << 16
TRAINER = Identity.generate()
SHAPES = {"model.a.weight": ("F32", (70, 300)), "model.b.weight": ("BF16", (200, 256)),
          "model.c.weight": ("F32", (16000,))}


def base_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    arrays = {}
    for name, (dtype, shape) in SHAPES.items():
        values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        arrays[name] = values if dtype == "F32" else (values.view(np.uint32) >> 16).astype(np.uint16)
    return arrays


def write_odd(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """A safetensors file whose tensor data starts at an offset of 3 modulo 8, so that 2- and 4-byte
    elements straddle 64 KiB shard boundaries."""
    header, at = {}, 0
    for name, (dtype, shape) in SHAPES.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + arrays[name].nbytes]}
        at += arrays[name].nbytes
    text = json.dumps(header).encode()
    text += b" " * ((3 - 8 - len(text)) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(a.tobytes() for a in arrays.values()))


def seeded(tmp_path: Path, base: Path) -> tuple[ShardStore, ShardStore, bytes]:
    """A trainer's and a follower's store, each holding ``base`` complete as step 0."""
    manifest = build_manifest(base, run_id=RUN, step=0, parent_step=None, shard_size=SHARD)
    envelope = codec.encode(manifest, TRAINER, lifetime_s=600)
    stores = []
    for name in ("trainer", "follower"):
        store = ShardStore(tmp_path / name, RUN)
        copy = tmp_path / f"base-{name}"
        copy.write_bytes(base.read_bytes())
        store.add_published(copy, codec.decode(envelope, CheckpointManifest), envelope)
        stores.append(store)
    return stores[0], stores[1], envelope


def built(follower: ShardStore, manifest: CheckpointManifest, body: bytes):
    envelope = codec.encode(manifest, TRAINER, lifetime_s=600)
    signed = codec.decode(envelope, CheckpointManifest)
    return build_from_delta(follower, signed, envelope, usable_base(follower, signed.message), body)


def test_straddling_elements_untouched_shards_and_shard_edges_give_the_signed_bytes(tmp_path):
    base_path, result_path = tmp_path / "base.safetensors", tmp_path / "result.safetensors"
    arrays = base_arrays()
    write_odd(base_path, arrays)
    manifest0 = build_manifest(base_path, run_id=RUN, step=0, parent_step=None, shard_size=SHARD)
    assert manifest0.shard_count == 4 and manifest0.tensors[0].offset % 2 == 1
    changed = {name: array.copy() for name, array in arrays.items()}
    for boundary in (SHARD, 2 * SHARD):  # the elements either side of and across both inner boundaries
        for entry in manifest0.tensors:
            itemsize = 4 if entry.dtype == "F32" else 2
            flat = changed[entry.name].reshape(-1)
            for byte in (boundary - itemsize - 1, boundary - 1, boundary, boundary + itemsize):
                if entry.offset <= byte < entry.offset + entry.nbytes:
                    flat[(byte - entry.offset) // itemsize] += 1 if entry.dtype == "BF16" else np.float32(1e-3)
    changed["model.a.weight"].reshape(-1)[0] += np.float32(1e-3)  # the first element after the header
    write_odd(result_path, changed)
    trainer, follower, _ = seeded(tmp_path, base_path)
    manifest = build_manifest(result_path, run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    delta = make_delta(trainer.checkpoints[0], result_path, manifest, 0.5)
    assert delta is not None
    assert manifest.shard_hashes[3] == manifest0.shard_hashes[3]  # the last shard: nothing to change
    checkpoint = built(follower, dataclasses.replace(manifest, delta=delta[0]), delta[1])
    assert checkpoint.complete and checkpoint.data_path.read_bytes() == result_path.read_bytes()
    assert hash_shards(checkpoint.data_path, SHARD) == manifest.shard_hashes
    # applied to the base's bytes, the delta writes exactly the changed elements: the result's bytes
    records = decode_delta(delta[1], manifest.tensors, manifest.total_size)
    target = bytearray(base_path.read_bytes())
    count = sum(int((changed[name] != arrays[name]).sum()) for name in arrays)
    assert apply_delta(records, memoryview(target)) == count
    assert bytes(target) == result_path.read_bytes()


@pytest.mark.parametrize("rank", [1, 8])
def test_an_adapted_weight_split_over_shards_merges_to_the_signed_bytes(tmp_path, rank):
    base_path, merged_path = tmp_path / "base.safetensors", tmp_path / "merged.safetensors"
    arrays = base_arrays()
    write_odd(base_path, arrays)
    rng = np.random.default_rng(rank)
    matrices = {name: ((rng.standard_normal((rank, shape[1])) * 0.1).astype(np.float32),
                       (rng.standard_normal((shape[0], rank)) * 0.01).astype(np.float32))
                for name, (_, shape) in SHAPES.items() if len(shape) == 2}
    merged = {name: merged_weight(array, *matrices[name], 2.0, SHAPES[name][0]) if name in matrices else array
              for name, array in arrays.items()}
    write_odd(merged_path, merged)
    trainer, follower, _ = seeded(tmp_path, base_path)
    manifest = build_manifest(merged_path, run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    body = encode_adapter(manifest.tensors, rank, 2.0, matrices)
    ref = adapter_delta(trainer.checkpoints[0], body, manifest)
    assert ref is not None
    checkpoint = built(follower, dataclasses.replace(manifest, delta=ref), body)
    assert checkpoint.data_path.read_bytes() == merged_path.read_bytes()


def test_an_encoding_bounded_by_an_adapters_size_ships_the_same_bytes_or_stops(tmp_path):
    base_path, result_path = tmp_path / "base.safetensors", tmp_path / "result.safetensors"
    arrays = base_arrays()
    write_odd(base_path, arrays)
    changed = {name: array.copy() for name, array in arrays.items()}
    for array in changed.values():
        array.reshape(-1)[::7] += 1 if array.dtype == np.uint16 else np.float32(1e-3)
    write_odd(result_path, changed)
    base, result = base_path.read_bytes(), result_path.read_bytes()
    manifest = build_manifest(result_path, run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    body = encode_delta(manifest.tensors, base, result)
    assert body is not None and body[9] == 1  # deflated, in several records
    raw = zlib.decompress(body[HEAD_SIZE:])
    assert body[HEAD_SIZE:] == zlib.compress(raw, DEFLATE_LEVEL)  # deflated record by record, the same stream
    assert encode_delta(manifest.tensors, base, result, max_body=len(body)) == body
    assert encode_delta(manifest.tensors, base, result, max_body=len(body) - 1) is None
    trainer, _, _ = seeded(tmp_path, base_path)
    assert make_delta(trainer.checkpoints[0], result_path, manifest, 0.5, smaller_than=len(body)) is None
    bounded = make_delta(trainer.checkpoints[0], result_path, manifest, 0.5, smaller_than=len(body) + 1)
    assert bounded is not None and bounded[1] == body
