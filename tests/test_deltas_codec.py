"""The ``sparse/v2`` delta body (specs/deltas.md section 3): exact round trips on real safetensors
files of every width and dtype, and every class of bad body refused whole, before anything is
written."""

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from intellect_node.node.shards.checkpoint import build_manifest, write_safetensors
from intellect_node.protocol import deltas as deltas_codec
from intellect_node.protocol.deltas import (
    HEAD_SIZE,
    MAGIC,
    VERSION,
    apply_delta,
    decode_delta,
    delta_hash,
    encode_delta,
)
from intellect_node.protocol.errors import InvalidValue, MalformedBody, Oversize, Truncated
from intellect_node.protocol.manifest import CheckpointManifest, DeltaRef

RUN = "delta-run"
SHARD = 1 << 16


def policy(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(128, 64, generator=g),
        "model.norm.weight": torch.ones(64, dtype=torch.float16),
        "model.counts": torch.arange(10, dtype=torch.int64),
        "model.empty": torch.empty(0, 3),
    }


def files(tmp_path: Path, changes) -> tuple[CheckpointManifest, bytes, bytes]:
    """A base checkpoint and a result with ``changes(tensors)`` applied, and the result's manifest."""
    base, result = policy(), policy()
    changes(result)
    write_safetensors(base, tmp_path / "base.safetensors")
    write_safetensors(result, tmp_path / "result.safetensors")
    manifest = build_manifest(tmp_path / "result.safetensors", run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    return manifest, (tmp_path / "base.safetensors").read_bytes(), (tmp_path / "result.safetensors").read_bytes()


def round_trip(manifest: CheckpointManifest, base: bytes, result: bytes) -> tuple[bytes, bytes]:
    body = encode_delta(manifest.tensors, base, result)
    target = bytearray(base)
    apply_delta(decode_delta(body, manifest.tensors, manifest.total_size), memoryview(target))
    return body, bytes(target)


def sparse_changes(result):
    flat = result["model.embed_tokens.weight"].view(-1)
    flat[::97] = flat[::97] + 1  # a bf16 step: changed bit patterns, about 1% of elements
    result["model.layers.0.mlp.up_proj.weight"][5, 7] = -0.0
    result["model.counts"][9] = 2**40


def test_round_trip_is_exact_and_small(tmp_path):
    manifest, base, result = files(tmp_path, sparse_changes)
    body, rebuilt = round_trip(manifest, base, result)
    assert rebuilt == result
    assert len(body) < len(result) / 20
    assert body[:8] == MAGIC


def test_every_element_changed_and_nothing_changed(tmp_path):
    manifest, base, result = files(tmp_path, lambda t: t["model.layers.0.mlp.up_proj.weight"].mul_(3))
    assert round_trip(manifest, base, result)[1] == result
    manifest, base, result = files(tmp_path, lambda t: None)
    body, rebuilt = round_trip(manifest, base, result)
    assert rebuilt == result and len(body) <= HEAD_SIZE + 16


@pytest.mark.parametrize("gap", [0, 255, 256, 70_000])
def test_gap_widths(tmp_path, gap):
    def change(result):
        big = torch.zeros(80_000, dtype=torch.float16)
        big[gap] = 1.0
        big[-1] = 2.0
        result["model.big"] = big
    base_tensors = policy() | {"model.big": torch.zeros(80_000, dtype=torch.float16)}
    _, _, result = files(tmp_path, change)
    write_safetensors(base_tensors, tmp_path / "base.safetensors")
    manifest = build_manifest(tmp_path / "result.safetensors", run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    assert round_trip(manifest, (tmp_path / "base.safetensors").read_bytes(), result)[1] == result


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 18])
def test_changes_found_across_compare_chunks_are_every_change_in_order(tmp_path, monkeypatch, chunk):
    """The encoder compares a tensor a chunk at a time; a change on either side of a chunk's edge,
    in its first or last element, or in a chunk of nothing else is found once, in order."""
    monkeypatch.setattr(deltas_codec, "COMPARE_CHUNK", chunk)

    def change(result):
        flat = result["model.embed_tokens.weight"].view(-1)
        for at in (0, 6, 7, 63, 64, 65, 500, flat.numel() - 1):
            flat[at] = flat[at] + 1
        result["model.layers.0.mlp.up_proj.weight"][-1, -1] = 7.0
    manifest, base, result = files(tmp_path, change)
    body, rebuilt = round_trip(manifest, base, result)
    assert rebuilt == result
    records = decode_delta(body, manifest.tensors, manifest.total_size)
    embed = next(r for r in records if r.entry.name == "model.embed_tokens.weight")
    assert embed.positions.tolist() == [0, 6, 7, 63, 64, 65, 500, 300 * 64 - 1]
    assert sum(len(r.positions) for r in records) == 9


def test_a_change_denser_than_the_file_encodes_to_nothing(tmp_path):
    """Every element of a float32 tensor changed: gaps plus values outgrow the file, which no
    receiver would accept (raw_len above total_size), so no body is made at all."""
    def everything(result):
        for name, tensor in result.items():
            if tensor.is_floating_point() and tensor.numel():
                result[name] = tensor + 1
    manifest, base, result = files(tmp_path, everything)
    assert encode_delta(manifest.tensors, base, result) is None


def test_differences_wrap_on_bit_patterns(tmp_path):
    """A difference is the result's bit pattern minus the base's, modulo the element's width: a
    pattern that wraps (fp16 0xffff, a NaN, to 0x0001) and a sign flip (-0.0 to 0.0) come out exact."""
    def wraps(result):
        bits = result["model.norm.weight"].view(torch.int16)
        bits[0], bits[1] = 0x0001, 0x0000
    base_tensors = policy()
    base_bits = base_tensors["model.norm.weight"].view(torch.int16)
    base_bits[0], base_bits[1] = -1, -0x8000  # 0xffff and 0x8000 (-0.0)
    _, _, result = files(tmp_path, wraps)
    write_safetensors(base_tensors, tmp_path / "base.safetensors")
    manifest = build_manifest(tmp_path / "result.safetensors", run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    body, rebuilt = round_trip(manifest, (tmp_path / "base.safetensors").read_bytes(), result)
    assert rebuilt == result
    (record,) = decode_delta(body, manifest.tensors, manifest.total_size)
    assert record.differences.tolist() == [0x0002, 0x8000]


def test_ulp_steps_cost_less_than_new_bytes(tmp_path):
    """What an RL step at a small lr does to a bf16 policy: 1% of elements one ulp up or down. Their
    differences are two symbols, which deflate takes to a fraction of a byte, so the body is well
    under the two bytes a change that sparse/v1's new bytes cost before compression of the gaps."""
    g = torch.Generator().manual_seed(3)
    weights = (torch.randn(400_000, generator=g) * 0.02).to(torch.bfloat16)
    moved = weights.clone()
    bits = moved.view(torch.int16)
    at = torch.randperm(len(weights), generator=g)[:4_000]
    bits[at] += torch.where(torch.rand(len(at), generator=g) < 0.5, 1, -1).to(torch.int16)
    write_safetensors({"w": weights}, tmp_path / "base.safetensors")
    write_safetensors({"w": moved}, tmp_path / "result.safetensors")
    manifest = build_manifest(tmp_path / "result.safetensors", run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    body, rebuilt = round_trip(manifest, (tmp_path / "base.safetensors").read_bytes(),
                               (tmp_path / "result.safetensors").read_bytes())
    assert rebuilt == (tmp_path / "result.safetensors").read_bytes()
    assert len(body) < 2.0 * len(at)


def test_hash_names_the_body():
    assert delta_hash(b"x" * 20) != delta_hash(b"x" * 21)
    assert len(delta_hash(b"")) == 32


# ---- hostile bodies: refused whole ---------------------------------------------------------


def raw_body(payload: bytes, *, codec: int = 0, raw_len: int | None = None, magic: bytes = MAGIC,
             version: int = VERSION) -> bytes:
    data = zlib.compress(payload) if codec == 1 else payload
    return struct.pack(">8sBBQ", magic, version, codec, len(payload) if raw_len is None else raw_len) + data


def record(tensor: int, gaps: list[int], values: bytes, width: int = 2) -> bytes:
    return struct.pack(">IQB", tensor, len(gaps), width) + np.array(gaps, dtype=f"<u{width}").tobytes() + values


@pytest.fixture
def layout(tmp_path):
    manifest, base, _ = files(tmp_path, lambda t: None)
    return manifest


def refused(layout, body, error):
    with pytest.raises(error):
        decode_delta(body, layout.tensors, layout.total_size)


def index_of(layout, name):
    return [e.name for e in layout.tensors].index(name)


def test_bad_heads(layout):
    refused(layout, b"INADELTA\x01", MalformedBody)
    refused(layout, raw_body(b"", magic=b"NOTDELTA"), MalformedBody)
    refused(layout, raw_body(b"", version=1), MalformedBody)  # sparse/v1 carried new bytes, not differences
    refused(layout, raw_body(b"", version=VERSION + 1), MalformedBody)
    refused(layout, raw_body(b"", codec=7), MalformedBody)
    refused(layout, raw_body(b"abc", raw_len=2), MalformedBody)  # raw length disagrees
    refused(layout, raw_body(b"", raw_len=layout.total_size + 1), Oversize)
    refused(layout, raw_body(b"", codec=7, raw_len=2**60), MalformedBody)  # the codec is judged first


def test_deflate_bombs_and_trailing_bytes(layout):
    bomb = zlib.compress(b"\x00" * (50 << 20))
    refused(layout, struct.pack(">8sBBQ", MAGIC, VERSION, 1, 1000) + bomb, MalformedBody)  # inflates past raw_len
    refused(layout, raw_body(b"\x00" * 100, codec=1) + b"junk", MalformedBody)
    refused(layout, struct.pack(">8sBBQ", MAGIC, VERSION, 1, 10) + b"not zlib at all", MalformedBody)
    short = zlib.compress(b"\x00" * 100)[:-6]
    refused(layout, struct.pack(">8sBBQ", MAGIC, VERSION, 1, 100) + short, MalformedBody)


def test_bad_records(layout):
    fp16 = index_of(layout, "model.norm.weight")  # 64 elements of 2 bytes
    ok = record(fp16, [0, 3], b"\x00\x3c" * 2)
    assert len(decode_delta(raw_body(ok), layout.tensors, layout.total_size)) == 1
    refused(layout, raw_body(ok[:-1]), Truncated)
    refused(layout, raw_body(ok[:5]), Truncated)
    refused(layout, raw_body(record(len(layout.tensors), [0], b"\x00\x00")), InvalidValue)  # no such tensor
    refused(layout, raw_body(ok + ok), InvalidValue)  # same tensor twice: not increasing
    earlier = index_of(layout, "model.layers.0.mlp.up_proj.weight")
    if earlier < fp16:
        refused(layout, raw_body(ok + record(earlier, [0], b"\x00" * 4)), InvalidValue)  # unsorted
    refused(layout, raw_body(record(fp16, [], b"")), InvalidValue)  # count 0
    refused(layout, raw_body(record(fp16, list(range(65)), b"\x00\x00" * 65, width=1)), InvalidValue)  # > numel
    refused(layout, raw_body(record(fp16, [64], b"\x00\x00")), InvalidValue)  # position = numel
    refused(layout, raw_body(record(fp16, [30, 33], b"\x00\x00" * 2)), InvalidValue)  # 30 + 1 + 33 = 64
    bad_width = struct.pack(">IQB", fp16, 1, 3) + b"\x00" * 5
    refused(layout, raw_body(bad_width), InvalidValue)


def test_positions_that_wrap_past_2_64_are_refused(layout):
    counts = index_of(layout, "model.counts")  # 10 elements
    refused(layout, raw_body(record(counts, [2**64 - 1, 5], b"\x00" * 16, width=8)), InvalidValue)
    refused(layout, raw_body(record(counts, [9, 2**63, 2**63], b"\x00" * 24, width=8)), InvalidValue)


def test_a_refused_body_writes_nothing(tmp_path):
    manifest, base, result = files(tmp_path, sparse_changes)
    body = encode_delta(manifest.tensors, base, result)
    target = bytearray(base)
    with pytest.raises((MalformedBody, Truncated, InvalidValue)):
        apply_delta(decode_delta(body[:-3], manifest.tensors, manifest.total_size), memoryview(target))
    assert bytes(target) == base


def test_manifest_delta_field_rules(tmp_path):
    manifest, _, _ = files(tmp_path, lambda t: None)
    ref = DeltaRef(format="sparse/v2", base_step=0, base_hash=b"\x01" * 32, size=100, hash=b"\x02" * 32)
    fields = {f: getattr(manifest, f) for f in ("run_id", "step", "parent_step", "shard_size", "total_size",
                                                 "shard_hashes", "checkpoint_hash", "tensors")}
    assert CheckpointManifest(**fields, delta=ref).delta == ref
    with pytest.raises(InvalidValue):
        CheckpointManifest(**fields | {"parent_step": None}, delta=ref)
    with pytest.raises(InvalidValue):
        CheckpointManifest(**fields, delta=DeltaRef(format="sparse/v2", base_step=0, base_hash=b"\x01" * 32,
                                                    size=manifest.total_size + 1, hash=b"\x02" * 32))
    wire = CheckpointManifest(**fields, delta=ref).to_wire()
    assert CheckpointManifest.from_wire(wire).delta == ref
    with pytest.raises(InvalidValue, match="dense/v9"):
        CheckpointManifest.from_wire(wire | {"delta": wire["delta"] | {"format": "dense/v9"}})
