"""Fast checks of the weight broadcast's parts: manifest schema and signing, sharding, the store's
atomicity and path safety, the mmap loader, and the HTTP server and client against bad input."""

import dataclasses
import json
import os
from pathlib import Path

import blake3
import msgpack
import pytest
import torch
import trio
import trio.testing
from safetensors import safe_open

from intellect_node.crypto.envelope import seal
from intellect_node.crypto.identity import Identity
from intellect_node.node.config.base import ConfigError
from intellect_node.node.config.loader import load_section
from intellect_node.node.shards.checkpoint import CheckpointFormatError, build_manifest, hash_shards, write_safetensors
from intellect_node.node.shards.client import Endpoint, HttpStatus, ShardClient
from intellect_node.node.shards.config import ShardConfig
from intellect_node.node.shards.loader import load_tensors
from intellect_node.node.shards.server import ShardServer, pack_bits, unpack_bits
from intellect_node.node.shards.service import ShardService
from intellect_node.node.shards.store import PARTIAL, UNSYNCED_FILE, ShardStore
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec
from intellect_node.protocol.errors import (
    InvalidValue,
    MalformedBody,
    Oversize,
    Rejected,
    Stalled,
    Truncated,
    Unanswered,
)
from intellect_node.protocol.manifest import (
    CheckpointManifest,
    ShardComplaint,
    TensorEntry,
    UnauthorizedSigner,
    authorize_manifest,
    checkpoint_hash,
    shard_key,
)
from tests.support.inprocess_nodes import make_node

RUN = "unit-run"
SHARD = 1 << 16


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(512, 256, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(96, 128, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(96, dtype=torch.float16),
        "lm_head.bias": torch.arange(7, dtype=torch.int64),
        "model.empty": torch.empty(0, 3),
    }


@pytest.fixture
def checkpoint_file(tmp_path) -> Path:
    path = tmp_path / "ckpt.safetensors"
    write_safetensors(tensors(), path)
    return path


@pytest.fixture
def manifest(checkpoint_file) -> CheckpointManifest:
    return build_manifest(checkpoint_file, run_id=RUN, step=5, parent_step=4, shard_size=SHARD)


def signed_envelope(manifest: CheckpointManifest, identity: Identity) -> bytes:
    return codec.encode(manifest, identity, lifetime_s=600)


# ---- manifest schema and signing ---------------------------------------------------------------

def test_manifest_round_trip_and_trainer_only(manifest):
    trainer, other = Identity.generate(), Identity.generate()
    signed = codec.decode(signed_envelope(manifest, trainer), CheckpointManifest)
    assert signed.message == manifest
    authorize_manifest(signed.message, signed.signer_peer_id, RUN, trainer.peer_id)
    forged = codec.decode(signed_envelope(manifest, other), CheckpointManifest)
    with pytest.raises(UnauthorizedSigner) as caught:
        authorize_manifest(forged.message, forged.signer_peer_id, RUN, trainer.peer_id)
    assert caught.value.reason == "unauthorized_signer"
    with pytest.raises(UnauthorizedSigner):
        authorize_manifest(signed.message, signed.signer_peer_id, RUN, None)  # no trainer configured
    with pytest.raises(InvalidValue):
        authorize_manifest(signed.message, signed.signer_peer_id, "another-run", trainer.peer_id)


def test_manifest_matches_the_file(manifest, checkpoint_file):
    data = checkpoint_file.read_bytes()
    assert manifest.total_size == len(data)
    assert manifest.shard_count == -(-len(data) // SHARD) == len(manifest.shard_hashes)
    for i, digest in enumerate(manifest.shard_hashes):
        start, end = manifest.shard_range(i)
        assert digest == blake3.blake3(data[start:end]).digest()
    assert manifest.shard_range(manifest.shard_count - 1)[1] == len(data)
    with safe_open(str(checkpoint_file), framework="pt") as f:
        assert sorted(f.keys()) == sorted(e.name for e in manifest.tensors)
        assert f.metadata() == {"format": "pt"}


def wire_body(manifest: CheckpointManifest, **changes) -> dict:
    body = manifest.to_wire()
    body.update(changes)
    return body


def forged_envelope(identity: Identity, body: dict) -> bytes:
    return seal(identity, CheckpointManifest.TYPE, 1, msgpack.packb(body, use_bin_type=True), lifetime_s=600)


@pytest.mark.parametrize("name,changes,reason", [
    ("absurd_total", {"total_size": 1 << 50}, "invalid_value"),
    ("tiny_shards", {"shard_size": 1}, "invalid_value"),
    ("huge_shards", {"shard_size": 1 << 31}, "invalid_value"),
    ("negative_step", {"step": -1}, "invalid_value"),
    ("parent_not_before", {"parent_step": 5}, "invalid_value"),
    ("too_few_hashes", "drop_hash", "invalid_value"),
    ("short_hash", "short_hash", "invalid_value"),
    ("wrong_checkpoint_hash", {"checkpoint_hash": b"\x00" * 32}, "invalid_value"),
    ("size_mismatch_with_hashes", "bigger_total", "invalid_value"),
    ("tensor_past_end", "tensor_past_end", "invalid_value"),
    ("overlapping_tensors", "overlap", "invalid_value"),
    ("dotdot_name", "name:../../etc/passwd", "invalid_value"),
    ("slash_name", "name:model/layers.0", "invalid_value"),
    ("hidden_name", "name:.bashrc", "invalid_value"),
    ("double_dot_inside", "name:a..b", "invalid_value"),
    ("nul_name", "name:a\x00b", "invalid_value"),
    ("unknown_dtype", "dtype:F128", "invalid_value"),
    ("extra_field", {"url": "http://evil"}, "extra_field"),
    ("string_step", {"step": "5"}, "wrong_type"),
])
def test_bad_manifests_are_rejected(manifest, name, changes, reason):
    body = manifest.to_wire()
    if isinstance(changes, dict):
        body.update(changes)
    elif changes == "drop_hash":
        body["shard_hashes"] = body["shard_hashes"][:-1]
    elif changes == "short_hash":
        body["shard_hashes"][0] = b"\x01" * 31
    elif changes == "bigger_total":
        body["total_size"] += SHARD
    elif changes == "tensor_past_end":
        body["tensors"][-1]["offset"] = manifest.total_size - 1
    elif changes == "overlap":
        body["tensors"][1]["offset"] = body["tensors"][0]["offset"]
    elif changes.startswith("name:"):
        body["tensors"][0]["name"] = changes[5:]
    elif changes.startswith("dtype:"):
        body["tensors"][0]["dtype"] = changes[6:]
    with pytest.raises(Rejected) as caught:
        codec.decode(forged_envelope(Identity.generate(), body), CheckpointManifest)
    assert caught.value.reason == reason


def test_oversize_manifest_is_refused_before_parsing():
    junk = b"\x00" * (CheckpointManifest.MAX_SIZE + 1)
    with pytest.raises(Oversize):
        codec.decode(junk, CheckpointManifest)


def test_complaint_about_oneself_is_refused(manifest):
    me = Identity.generate()
    complaint = ShardComplaint(run_id=RUN, step=5, checkpoint_hash=manifest.checkpoint_hash, shard=0,
                               accused=me.peer_id, received_hash=b"\x00" * 32)
    with pytest.raises(InvalidValue):
        codec.encode(complaint, me, lifetime_s=60)
    other = Identity.generate()
    assert codec.decode(codec.encode(complaint, other, lifetime_s=60), ShardComplaint).message == complaint


def test_keys_are_short_and_distinct():
    keys = {shard_key(RUN, step, i) for step in range(3) for i in range(50)}
    assert len(keys) == 150 and all(len(k) == 32 for k in keys)


def test_unsafe_tensor_names_are_not_written(tmp_path):
    for name in ("../x", "a/b", ".x", "a..b"):
        with pytest.raises(CheckpointFormatError):
            write_safetensors({name: torch.zeros(2)}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_checkpoint_hash_covers_every_shard(manifest):
    hashes = list(manifest.shard_hashes)
    hashes[-1] = bytes(32)
    assert checkpoint_hash(SHARD, manifest.total_size, tuple(hashes)) != manifest.checkpoint_hash


# ---- store: atomic completion, resume, retention, path safety -----------------------------------

def decoder(trainer: Identity):
    def decode(envelope: bytes):
        signed = codec.decode(envelope, CheckpointManifest)
        authorize_manifest(signed.message, signed.signer_peer_id, RUN, trainer.peer_id)
        return signed
    return decode


def fill(store: ShardStore, checkpoint, source: Path, shards) -> None:
    data = source.read_bytes()
    with open(checkpoint.data_path, "r+b") as f:
        for i in shards:
            start, end = checkpoint.manifest.shard_range(i)
            f.seek(start)
            f.write(data[start:end])
            store.mark_verified(checkpoint, i)
    store.persist_verified(checkpoint)


def test_partial_checkpoint_is_never_complete_and_resumes_after_restart(tmp_path, manifest, checkpoint_file):
    trainer = Identity.generate()
    envelope = signed_envelope(manifest, trainer)
    store = ShardStore(tmp_path / "data", RUN)
    checkpoint = store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    assert checkpoint.directory.name.endswith(PARTIAL) and not checkpoint.complete
    assert store.newest_complete() is None
    fill(store, checkpoint, checkpoint_file, [0, 2])
    # A torn shard: marked verified on disk (say the marker hit the disk, the data did not).
    (checkpoint.directory / "verified").write_bytes(bytes([1, 0, 1, 1] + [0] * (manifest.shard_count - 4)))

    reopened = ShardStore(tmp_path / "data", RUN)
    assert reopened.reopen(decoder(trainer)) == [2]  # shards 0 and 2 re-hashed and kept; 3 refused
    again = reopened.checkpoints[5]
    assert list(again.verified[:4]) == [1, 0, 1, 0] and not again.complete
    fill(reopened, again, checkpoint_file, [i for i in range(manifest.shard_count) if not again.verified[i]])
    reopened.finalize(again)
    assert again.complete and again.directory.name == f"{5:012d}"
    assert not (again.directory / "verified").exists()
    assert again.data_path.read_bytes() == checkpoint_file.read_bytes()
    assert sorted(p.name for p in reopened.root.iterdir()) == [f"{5:012d}"]


def test_a_step_is_complete_before_its_fsync_and_a_restart_hashes_it_if_that_did_not_finish(
        tmp_path, manifest, checkpoint_file):
    """finalize completes a verified step at once and fsyncs it in the background (four followers
    fsyncing a 269 MB step on one disk held each step back ~0.8 s); the ``unsynced`` marker it
    leaves until then makes a restart hash the step again: whole, it stays complete; torn (the
    crash came before the data reached the disk), it resumes with its good shards kept; without
    its data file, it resumes from nothing."""
    trainer = Identity.generate()
    envelope = signed_envelope(manifest, trainer)
    store = ShardStore(tmp_path / "data", RUN)
    checkpoint = store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    fill(store, checkpoint, checkpoint_file, range(manifest.shard_count))
    synced = store.finalize(checkpoint)
    assert checkpoint.complete and store.newest_complete() is checkpoint
    synced.result(timeout=60)
    assert not (checkpoint.directory / UNSYNCED_FILE).exists()

    # a crash before the fsync finished: the marker is still there, the bytes are whole
    (checkpoint.directory / UNSYNCED_FILE).touch()
    reopened = ShardStore(tmp_path / "data", RUN)
    assert reopened.reopen(decoder(trainer)) == []
    assert reopened.checkpoints[5].complete and not (reopened.checkpoints[5].directory / UNSYNCED_FILE).exists()

    # ... the bytes of shard 1 never reached the disk
    (checkpoint.directory / UNSYNCED_FILE).touch()
    start, _ = manifest.shard_range(1)
    with open(checkpoint.data_path, "r+b") as f:
        f.seek(start)
        f.write(b"\0" * 4096)
    reopened = ShardStore(tmp_path / "data", RUN)
    assert reopened.reopen(decoder(trainer)) == [manifest.shard_count - 1]
    torn = reopened.checkpoints[5]
    assert not torn.complete and list(torn.verified[:3]) == [1, 0, 1]
    assert sorted(p.name for p in reopened.root.iterdir()) == [f"{5:012d}{PARTIAL}"]
    fill(reopened, torn, checkpoint_file, [1])
    reopened.finalize(torn).result(timeout=60)
    assert torn.complete and torn.data_path.read_bytes() == checkpoint_file.read_bytes()

    # ... the data file itself never reached the disk
    (torn.directory / UNSYNCED_FILE).touch()
    torn.data_path.unlink()
    reopened = ShardStore(tmp_path / "data", RUN)
    assert reopened.reopen(decoder(trainer)) == [0]
    assert not reopened.checkpoints[5].complete


def test_a_step_pruned_before_its_fsync_ends_nothing(tmp_path, manifest, checkpoint_file):
    envelope = signed_envelope(manifest, Identity.generate())
    store = ShardStore(tmp_path, RUN)
    checkpoint = store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    fill(store, checkpoint, checkpoint_file, range(manifest.shard_count))
    synced = store.finalize(checkpoint)
    final = checkpoint.directory
    assert store.prune(0) == [manifest.step]
    synced.result(timeout=60)  # gone or synced first: either way no error escapes
    assert not final.exists()


def test_data_is_served_while_finalize_renames_its_directory(tmp_path, manifest, checkpoint_file):
    """finalize renames in a worker thread before the checkpoint's directory says so: a range
    request in between must still find the data (it was closed unanswered, charged as truncated)."""
    envelope = signed_envelope(manifest, Identity.generate())
    store = ShardStore(tmp_path, RUN)
    checkpoint = store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    fill(store, checkpoint, checkpoint_file, range(manifest.shard_count))
    partial = checkpoint.directory
    store.finalize(checkpoint)
    final, checkpoint.directory = checkpoint.directory, partial  # the instant between rename and assignment
    fd = store.open_data(checkpoint)
    try:
        assert os.read(fd, 1 << 20) == checkpoint_file.read_bytes()[: 1 << 20]
    finally:
        os.close(fd)
    checkpoint.directory = final
    assert store.prune(0) == [manifest.step]
    with pytest.raises(FileNotFoundError):
        store.open_data(checkpoint)


async def test_finalize_in_a_worker_thread_leaves_waking_to_the_trio_thread(tmp_path, manifest, checkpoint_file):
    """The fetcher and the delta follower finalize in a worker thread while tasks wait on the
    checkpoint's ``changed`` event; setting a trio.Event off trio's thread fails (or corrupts the
    run queue), so finalize must not wake anyone and the caller's bump() must."""
    envelope = signed_envelope(manifest, Identity.generate())
    store = ShardStore(tmp_path, RUN)
    checkpoint = store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    fill(store, checkpoint, checkpoint_file, range(manifest.shard_count))
    woken: list[bool] = []

    async def wait_for_change() -> None:
        await checkpoint.changed.wait()
        woken.append(checkpoint.complete)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_change)
        await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(store.finalize, checkpoint)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == [] and checkpoint.complete
        checkpoint.bump()
    assert woken == [True]


def test_finalize_refuses_unverified(tmp_path, manifest):
    envelope = signed_envelope(manifest, Identity.generate())
    store = ShardStore(tmp_path, RUN)
    checkpoint = store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    with pytest.raises(ValueError):
        store.finalize(checkpoint)


def test_reopen_drops_foreign_and_junk_directories(tmp_path, manifest):
    trainer, other = Identity.generate(), Identity.generate()
    store = ShardStore(tmp_path, RUN)
    envelope = signed_envelope(manifest, other)  # not the trainer: must not survive a restart
    store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    (store.root / "publish-000000000009.tmp").write_bytes(b"half a file")
    reopened = ShardStore(tmp_path, RUN)
    assert reopened.reopen(decoder(trainer)) == []
    assert list(reopened.root.iterdir()) == []


def test_reopen_of_a_store_that_holds_checkpoints_keeps_them(tmp_path, manifest, checkpoint_file):
    """The supervisor restarts a failed ShardService.run on the same service, so ``reopen`` reads
    the directories of checkpoints its store still holds: it took each for a duplicate of itself
    and deleted it (every step then answered 404, a worker's weight swap found no file)."""
    trainer = Identity.generate()
    store = ShardStore(tmp_path, RUN)
    staged = store.staging_path(5)
    staged.write_bytes(checkpoint_file.read_bytes())
    envelope = signed_envelope(manifest, trainer)
    store.add_published(staged, codec.decode(envelope, CheckpointManifest), envelope)
    later = build_manifest(checkpoint_file, run_id=RUN, step=6, parent_step=5, shard_size=SHARD)
    later_envelope = signed_envelope(later, trainer)
    fill(store, store.begin(codec.decode(later_envelope, CheckpointManifest), later_envelope), checkpoint_file, [0])

    assert store.reopen(decoder(trainer)) == [1]  # the restart: same store, same checkpoints held
    assert sorted(store.checkpoints) == [5, 6]
    assert store.checkpoints[5].complete and store.checkpoints[5].data_path.read_bytes() == checkpoint_file.read_bytes()
    assert list(store.checkpoints[6].verified[:2]) == [1, 0] and not store.checkpoints[6].complete
    assert sorted(p.name for p in store.root.iterdir()) == [f"{5:012d}", f"{6:012d}{PARTIAL}"]


def test_a_step_dropped_while_its_verified_shards_are_saved_ends_nothing(tmp_path, manifest, checkpoint_file):
    """The fetch saves its verified shards in a worker thread; retention cancels that fetch and
    deletes the step on the trio loop meanwhile. The thread's write then found no directory, and its
    FileNotFoundError left the cancelled fetch and ended the whole overlay."""
    envelope = signed_envelope(manifest, Identity.generate())
    store = ShardStore(tmp_path, RUN)
    checkpoint = store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    store.mark_verified(checkpoint, 0)
    assert store.prune(0) == [manifest.step]  # retention, between the mark and the thread's write
    store.persist_verified(checkpoint)
    assert list(store.root.iterdir()) == []


def test_retention_keeps_newest_steps(tmp_path, checkpoint_file):
    trainer = Identity.generate()
    store = ShardStore(tmp_path, RUN)
    for step in range(1, 6):
        m = build_manifest(checkpoint_file, run_id=RUN, step=step, parent_step=None, shard_size=SHARD)
        envelope = signed_envelope(m, trainer)
        store.begin(codec.decode(envelope, CheckpointManifest), envelope)
    assert store.prune(3) == [1, 2]
    assert sorted(store.checkpoints) == [3, 4, 5]
    assert sorted(p.name for p in store.root.iterdir()) == [f"{s:012d}{PARTIAL}" for s in (3, 4, 5)]


def test_store_paths_stay_inside_the_data_directory(tmp_path):
    for bad in ("../escape", "/abs", "a/b", ".."):
        with pytest.raises(ValueError):
            ShardStore(tmp_path, bad)
    store = ShardStore(tmp_path / "d", RUN)
    for bad_step in (-1, 10**12, "1/../../x"):
        with pytest.raises(ValueError):
            store._dir(bad_step, partial=False)
    with pytest.raises(ValueError):
        store._remove(tmp_path / "outside")
    assert list(tmp_path.iterdir()) == [tmp_path / "d"]


def test_config_layers_and_checks(tmp_path):
    def load(flags, environ):
        return load_section(ShardConfig, "shards", {}, "cfg.toml", flags, environ, data_dir=tmp_path / "shards")

    config = load({"trainer": None}, {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(1 << 20),
                                      "INTELLECT_NODE_SHARDS_STALL_S": "3"})
    assert config.shard_size == 1 << 20 and config.stall_s == 3.0 and config.data_dir == tmp_path / "shards"
    assert config.keep_steps == 3
    with pytest.raises(ConfigError, match="trainer: 'not a peer id' is not a peer id"):
        load({"trainer": "not a peer id"}, {})
    with pytest.raises(ConfigError, match="shard_size: 12 outside"):
        load({}, {"INTELLECT_NODE_SHARDS_SHARD_SIZE": "12"})


# ---- loading -----------------------------------------------------------------------------------

def test_loader_returns_views_of_one_mapping(checkpoint_file, manifest):
    loaded = load_tensors(checkpoint_file, manifest)
    expected = tensors()
    assert list(loaded) == [e.name for e in manifest.tensors]
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)
    big = loaded["model.embed_tokens.weight"]
    assert big.untyped_storage().nbytes() == big.nbytes  # a view of the mapping, not a copy of the file
    big.mul_(0)  # private mapping: the file other nodes are served from never changes
    assert hash_shards(checkpoint_file, SHARD) == manifest.shard_hashes


def test_loader_refuses_a_file_of_the_wrong_size(checkpoint_file, manifest, tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(checkpoint_file.read_bytes()[:-1])
    with pytest.raises(ValueError):
        load_tensors(short, manifest)


# ---- HTTP server and client --------------------------------------------------------------------

def test_bits_round_trip():
    flags = bytearray([1, 0, 0, 1, 1, 1, 0, 1, 1, 0, 1])
    assert unpack_bits(pack_bits(flags), len(flags)) == flags
    with pytest.raises(ValueError):
        unpack_bits("ff", 11)


class Served:
    def __init__(self, tmp_path: Path, checkpoint_file: Path, manifest: CheckpointManifest, **config) -> None:
        self.trainer = Identity.generate()
        envelope = signed_envelope(manifest, self.trainer)
        self.store = ShardStore(tmp_path / "srv", RUN)
        self.checkpoint = self.store.begin(codec.decode(envelope, CheckpointManifest), envelope)
        self.config = ShardConfig(data_dir=tmp_path / "srv", **config)
        self.scores = PeerScores()
        self.server = ShardServer(self.store, self.config, self.trainer.peer_id, self.scores)
        self.source = checkpoint_file
        self.manifest = manifest

    def fill(self, shards) -> None:
        fill(self.store, self.checkpoint, self.source, shards)

    async def start(self, nursery: trio.Nursery) -> Endpoint:
        port = await nursery.start(self.server.serve, "127.0.0.1", 0)
        return Endpoint(self.trainer.peer_id, "127.0.0.1", port)


TARGET = f"/ina/v1/{RUN}/5/checkpoint.safetensors"


async def fetch(client: ShardClient, endpoint: Endpoint, start: int, end: int, target: str = TARGET) -> bytes:
    dest = bytearray(end - start)
    seen = bytearray()
    await client.get_range(endpoint, target, start, memoryview(dest), seen.extend)
    assert seen == dest  # every received stretch was shown to the hasher exactly once, in order
    return bytes(dest)


async def raw_request(endpoint: Endpoint, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
    await stream.send_all(request)
    out = b""
    with trio.move_on_after(5):
        while chunk := await stream.receive_some(65536):
            out += chunk
    await stream.aclose()
    return out


async def test_server_serves_only_verified_ranges_and_refuses_path_tricks(tmp_path, checkpoint_file, manifest):
    served = Served(tmp_path, checkpoint_file, manifest)
    served.fill([0, 1])
    client = ShardClient(Identity.generate(), stall_s=5)
    data = checkpoint_file.read_bytes()
    async with trio.open_nursery() as nursery:
        endpoint = await served.start(nursery)
        assert await fetch(client, endpoint, 0, SHARD) == data[:SHARD]
        assert await fetch(client, endpoint, 100, 2 * SHARD) == data[100:2 * SHARD]
        with pytest.raises(HttpStatus) as caught:
            await fetch(client, endpoint, SHARD, 3 * SHARD)  # shard 2 not verified here
        assert caught.value.status == 404
        lines: list[bytes] = []
        await client.follow(endpoint, f"/ina/v1/{RUN}/5/have", lambda line: lines.append(line) and False,
                            idle_timeout_s=5, max_line=4096)
        assert b'"version": 2' in lines[0] and pack_bits(served.checkpoint.verified).encode() in lines[0]
        assert await client.get(endpoint, f"/ina/v1/{RUN}/5/manifest", limit=1 << 20) == served.checkpoint.envelope
        for target in (f"/ina/v1/{RUN}/5/../../../etc/passwd", f"/ina/v1/{RUN}/5/%2e%2e/x", "/etc/passwd",
                       f"/ina/v1/{RUN}/5/checkpoint.safetensors/../manifest", f"/ina/v1/../{RUN}/5/manifest"):
            answer = await raw_request(endpoint, f"GET {target} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 404"), (target, answer[:80])
        answer = await raw_request(endpoint, b"GET /x HTTP/1.1\r\n" + b"x-pad: " + b"a" * 20000 + b"\r\n\r\n")
        assert answer == b""  # oversize head: dropped without an answer
        answer = await raw_request(endpoint, b"\x00\x01garbage\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400")
        answer = await raw_request(endpoint,
                                   f"GET {TARGET} HTTP/1.1\r\nhost: x\r\nrange: bytes=0-1,5-9\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 416")
        answer = await raw_request(endpoint, (f"GET {TARGET} HTTP/1.1\r\nhost: x\r\n"
                                              f"x-ina-peer: {served.trainer.peer_id} 1 {'0' * 128}\r\n\r\n").encode())
        assert answer.startswith(b"HTTP/1.1 401")
        nursery.cancel_scope.cancel()
    assert served.scores.rejections["http_bad_path"] >= 3
    assert served.scores.rejections["http_oversize"] == 1
    assert not any(p.name == "passwd" for p in tmp_path.rglob("*"))


async def test_have_stream_sends_a_line_per_change_and_ends_when_complete(tmp_path, checkpoint_file, manifest):
    served = Served(tmp_path, checkpoint_file, manifest)
    client = ShardClient(Identity.generate(), stall_s=5)
    lines: list[dict] = []

    def on_line(line: bytes) -> bool:
        lines.append(json.loads(line))
        return True

    async with trio.open_nursery() as nursery:
        endpoint = await served.start(nursery)

        async def later() -> None:
            await trio.sleep(0.3)
            served.fill([3])
            await trio.sleep(0.3)
            served.fill(range(manifest.shard_count))  # all at once: coalesced into few lines

        nursery.start_soon(later)
        with trio.fail_after(5):  # returns because the server ends the stream once complete
            await client.follow(endpoint, f"/ina/v1/{RUN}/5/have", on_line, idle_timeout_s=5, max_line=4096)
        nursery.cancel_scope.cancel()
    assert [unpack_bits(line["verified"], manifest.shard_count)[3] for line in lines[:2]] == [0, 1]
    assert all(unpack_bits(lines[-1]["verified"], manifest.shard_count))
    assert len(lines) < 2 + manifest.shard_count


async def test_upload_caps_and_seed_mode(tmp_path, checkpoint_file, manifest):
    served = Served(tmp_path, checkpoint_file, manifest, max_uploads_per_peer=1, peer_rate_mib_s=0.02, stall_s=5)
    served.fill(range(manifest.shard_count))
    served.checkpoint.origin = True
    one, two = ShardClient(Identity.generate(), stall_s=5), ShardClient(Identity.generate(), stall_s=5)
    statuses: list[int] = []

    async def attempt(client: ShardClient, endpoint: Endpoint, shard: int) -> None:
        try:
            await fetch(client, endpoint, shard * SHARD, (shard + 1) * SHARD)
            statuses.append(200)
        except HttpStatus as exc:
            statuses.append(exc.status)

    async with trio.open_nursery() as nursery:
        endpoint = await served.start(nursery)
        async with trio.open_nursery() as inner:
            inner.start_soon(attempt, one, endpoint, 0)  # paced at 20 KiB/s: still running below
            await trio.sleep(0.3)
            await attempt(one, endpoint, 1)  # same peer, second upload: per-peer cap
            await attempt(two, endpoint, 0)  # shard 0 is on its way to someone: seed mode
        await attempt(two, endpoint, 0)  # 0 was handed out moments ago: let the swarm pass it on
        await attempt(two, endpoint, 1)
        nursery.cancel_scope.cancel()
    assert statuses == [429, 409, 200, 409, 200]
    assert served.server.stats.shards == 2 and served.server.stats.refused == 3


async def test_seed_mode_does_not_hold_back_what_went_to_a_peer_that_cannot_serve(tmp_path, checkpoint_file, manifest):
    """A NATed fetcher (its advert names no HTTP address) cannot pass a shard on: the origin's
    seed mode does not count that upload, so the next fetcher gets the shard at once instead of
    a 409 and a wait (bench/nat.py measured the wait: 10x slower broadcasts with half the
    fetchers behind NAT)."""
    nated, public = Identity.generate(), Identity.generate()
    served = Served(tmp_path, checkpoint_file, manifest, stall_s=5)
    served.server.relays = lambda peer: peer != nated.peer_id
    served.fill(range(manifest.shard_count))
    served.checkpoint.origin = True
    async with trio.open_nursery() as nursery:
        endpoint = await served.start(nursery)
        await fetch(ShardClient(nated, stall_s=5), endpoint, 0, SHARD)
        await fetch(ShardClient(public, stall_s=5), endpoint, 0, SHARD)  # served, not 409
        with pytest.raises(HttpStatus) as refused:  # the public fetcher does pass it on: held now
            await fetch(ShardClient(Identity.generate(), stall_s=5), endpoint, 0, SHARD)
        nursery.cancel_scope.cancel()
    assert refused.value.status == 409


async def hostile_server(behaviour: str, length: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Answers one range request badly: truncated, stalled, trickling or with the wrong range."""
    async def handle(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        if behaviour == "closed":  # no answer at all
            await stream.aclose()
            return
        if behaviour == "cut_head":  # an answer that stops inside its head
            await stream.send_all(b"HTTP/1.1 20")
            await stream.aclose()
            return
        if behaviour == "wrong_range":
            await stream.send_all((f"HTTP/1.1 206 OK\r\ncontent-length: {length}\r\n"
                                   f"content-range: bytes 1-{length}/99999\r\n\r\n").encode())
            return
        await stream.send_all((f"HTTP/1.1 206 OK\r\ncontent-length: {length}\r\n"
                               f"content-range: bytes 0-{length - 1}/99999\r\n\r\n").encode())
        await stream.send_all(b"x" * 1000)
        if behaviour == "truncated":
            await stream.aclose()
        elif behaviour == "stall":
            await trio.sleep_forever()
        elif behaviour == "trickle":  # one byte now and then: never silent, never useful
            while True:
                await trio.sleep(0.2)
                await stream.send_all(b"x")

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


@pytest.mark.parametrize("behaviour,error", [("truncated", Truncated), ("cut_head", Truncated), ("closed", Unanswered),
                                             ("stall", Stalled), ("trickle", Stalled), ("wrong_range", MalformedBody)])
async def test_client_rejects_bad_transfers(behaviour, error):
    """Each failure by its own reason: a server that closes before answering at all is
    ``unanswered`` (cheap: honest busy peers do it), one that stops inside its answer ``truncated``."""
    client = ShardClient(Identity.generate(), stall_s=1.0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(hostile_server, behaviour, SHARD)
        with trio.fail_after(10), pytest.raises(error) as raised:
            await fetch(client, Endpoint(Identity.generate().peer_id, "127.0.0.1", port), 0, SHARD)
        assert type(raised.value) is error
        nursery.cancel_scope.cancel()


def test_manifest_entry_size(manifest):
    entry = next(e for e in manifest.tensors if e.name == "model.layers.0.mlp.up_proj.weight")
    assert entry.nbytes == 96 * 128 * 2
    with pytest.raises(InvalidValue):
        dataclasses.replace(manifest, parent_step=9)
    assert TensorEntry.from_wire(entry.to_wire()) == entry


def test_checkpoints_begun_in_a_thread_never_break_a_reader_on_the_loop(tmp_path, manifest):
    """``begin`` runs in the fetch's worker thread; the status and the newest complete checkpoint
    are read on the trio loop meanwhile. Readers take ``held()``, a copy made in one step: a loop
    over the live dict raised "dictionary changed size during iteration" when a step was added."""
    import sys
    import threading

    store = ShardStore(tmp_path, RUN)
    identity = Identity.generate()
    steps = range(10, 310)
    envelopes = [signed_envelope(dataclasses.replace(manifest, step=step, parent_step=step - 1), identity)
                 for step in steps]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows: the race shows in a few steps
    errors: list[BaseException] = []

    def begin_all() -> None:
        for envelope in envelopes:
            store.begin(codec.decode(envelope, CheckpointManifest), envelope)

    try:
        writer = threading.Thread(target=begin_all)
        writer.start()
        while writer.is_alive():
            try:
                assert store.newest_complete() is None and len(store.held()) <= len(envelopes)
            except RuntimeError as exc:  # dictionary changed size during iteration
                errors.append(exc)
                break
        writer.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert sorted(c.step for c in store.held()) == list(steps)


async def test_a_wait_for_a_newer_step_wakes_when_one_completes_here(tmp_path, checkpoint_file):
    """A worker past its share of a step waits for a newer policy (``wait_complete_after``): at
    once when one is held, else when a newer step completes here, woken by the completion itself
    (it polled every 0.5 s before), and not by a step that is not newer."""
    trainer = Identity.generate()
    service = ShardService(make_node(tmp_path, "worker", RUN),
                           ShardConfig(data_dir=tmp_path / "shards", trainer=trainer.peer_id))

    def complete(step: int) -> None:  # a step published here, as the trainer's overlay does
        staged = service.store.staging_path(step)
        staged.write_bytes(checkpoint_file.read_bytes())
        envelope = signed_envelope(build_manifest(staged, run_id=RUN, step=step, parent_step=None, shard_size=SHARD),
                                   trainer)
        service._completed(service.store.add_published(staged, codec.decode(envelope, CheckpointManifest), envelope))

    complete(5)
    with trio.fail_after(1):
        assert (await service.wait_complete_after(4)).step == 5
    woke: list[int] = []

    async def wait_past_5() -> None:
        woke.append((await service.wait_complete_after(5)).step)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_past_5)
            await trio.testing.wait_all_tasks_blocked()
            complete(3)  # older: the wait goes on
            await trio.testing.wait_all_tasks_blocked()
            assert woke == []
            complete(6)
    assert woke == [6]
