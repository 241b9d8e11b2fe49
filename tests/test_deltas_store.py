"""A follower builds the next step from its held base and a delta (specs/deltas.md section 5):
exactly the signed bytes, or nothing at all. A delta the trainer signed but that does not give
the signed checkpoint, or one that does not decode, leaves no trace and no step behind."""

import dataclasses
import random
import shutil
import struct
import zlib
from pathlib import Path

import pytest
import torch
import trio
import trio.testing

from intellect_node.crypto.identity import Identity
from intellect_node.node.shards import store as store_module
from intellect_node.node.shards.checkpoint import build_manifest, hash_shards, write_safetensors
from intellect_node.node.shards.copy_ahead import COPY_AHEAD, CopyAhead, copy_base, next_base, take_copy
from intellect_node.node.shards.deltas import DeltaFailed, build_from_delta, make_delta, usable_base
from intellect_node.node.shards.store import PARTIAL, UNSYNCED_FILE, ShardStore
from intellect_node.protocol import codec
from intellect_node.protocol.deltas import MAGIC, VERSION, delta_hash
from intellect_node.protocol.lora import LORA_FORMAT
from intellect_node.protocol.manifest import CheckpointManifest, DeltaRef

RUN = "delta-store"
SHARD = 1 << 16
TRAINER = Identity.generate()


def weights(step: int) -> dict[str, torch.Tensor]:
    """A bf16 policy; each step moves one element in 200 of the first tensor by one ulp or more."""
    g = torch.Generator().manual_seed(0)
    policy = {"model.embed_tokens.weight": torch.randn(400, 128, generator=g).to(torch.bfloat16),
              "model.norm.weight": torch.ones(128, dtype=torch.bfloat16)}
    flat = policy["model.embed_tokens.weight"].view(-1)
    for s in range(1, step + 1):
        flat[s::200] = flat[s::200] * 1.01 + 0.01
    return policy


def publish(store: ShardStore, tmp_path: Path, step: int, *, fraction: float = 0.5):
    """What the trainer's overlay does: the file, its manifest with the delta, both held."""
    staged = tmp_path / f"staged-{step}"
    write_safetensors(weights(step), staged)
    manifest = build_manifest(staged, run_id=RUN, step=step, parent_step=step - 1 if step else None,
                              shard_size=SHARD)
    delta = make_delta(store.checkpoints[step - 1], staged, manifest, fraction) if step else None
    if delta is not None:
        manifest = dataclasses.replace(manifest, delta=delta[0])
    envelope = codec.encode(manifest, TRAINER, lifetime_s=600)
    checkpoint = store.add_published(staged, codec.decode(envelope, type(manifest)), envelope,
                                     delta=delta[1] if delta else None)
    return checkpoint, envelope, delta[1] if delta else None


@pytest.fixture
def stores(tmp_path):
    trainer = ShardStore(tmp_path / "trainer", RUN)
    follower = ShardStore(tmp_path / "follower", RUN)
    base, envelope, _ = publish(trainer, tmp_path, 0)
    follower.add_published(_copy(base.data_path, tmp_path / "f0"), codec.decode(envelope, type(base.manifest)),
                           envelope)
    return trainer, follower


def _copy(path: Path, to: Path) -> Path:
    to.write_bytes(path.read_bytes())
    return to


def test_a_chain_of_deltas_gives_the_trainers_exact_bytes(stores, tmp_path):
    trainer, follower = stores
    for step in range(1, 6):
        published, envelope, body = publish(trainer, tmp_path, step)
        assert body is not None and len(body) < published.manifest.total_size / 20
        signed = codec.decode(envelope, type(published.manifest))
        base = usable_base(follower, signed.message)
        assert base is not None and base.step == step - 1
        built = build_from_delta(follower, signed, envelope, base, body)
        assert built.complete and built.data_path.read_bytes() == published.data_path.read_bytes()
        assert built.delta_path.read_bytes() == body  # kept, to serve to the next followers
        assert sum(built.verified) == built.manifest.shard_count


def synced() -> None:
    """Wait for the store's background syncs queued so far (one thread, first in first out)."""
    store_module._STEP_DIR_SYNCER.submit(lambda: None).result(timeout=60)


def test_nothing_waits_on_the_disk_and_a_restart_checks_what_had_not_reached_it(stores, tmp_path):
    """A published step and a step built from its delta are complete at once and made durable in
    the background (data, manifest and delta body); a restart before that finished hashes the data
    again and keeps the delta body only if it is the one the manifest signs, so a crash can never
    have a node serve a torn body (its followers would charge it)."""
    trainer, follower = stores
    published, envelope, body = publish(trainer, tmp_path, 1)
    assert published.complete and body is not None
    signed = codec.decode(envelope, type(published.manifest))
    built = build_from_delta(follower, signed, envelope, usable_base(follower, signed.message), body)
    assert built.complete
    synced()
    for step_dir in (published.directory, built.directory):
        assert sorted(p.name for p in step_dir.iterdir()) == ["checkpoint.safetensors", "delta.bin", "manifest.ine"]

    # a crash before the sync: the body whole is kept; torn or cut short it is deleted, the step kept
    for damage in (lambda b: b, lambda b: b[:-1], lambda b: b[:-1] + bytes([b[-1] ^ 1]), lambda b: b""):
        (built.directory / UNSYNCED_FILE).touch()
        built.delta_path.write_bytes(damage(body))
        reopened = ShardStore(tmp_path / "follower", RUN)
        reopened.reopen(lambda raw: codec.decode(raw, CheckpointManifest))
        again = reopened.checkpoints[1]
        assert again.complete and again.data_path.read_bytes() == published.data_path.read_bytes()
        assert not (again.directory / UNSYNCED_FILE).exists()
        assert again.delta_path.exists() == (damage(body) == body)
        if not again.delta_path.exists():
            built.delta_path.write_bytes(body)

    # the publisher's data torn before its sync: the step resumes as a partial fetch, never served whole
    (published.directory / UNSYNCED_FILE).touch()
    with open(published.data_path, "r+b") as f:
        f.write(b"\0" * 64)
    reopened = ShardStore(tmp_path / "trainer", RUN)
    reopened.reopen(lambda raw: codec.decode(raw, CheckpointManifest))
    assert not reopened.checkpoints[1].complete and reopened.checkpoints[0].complete


def test_dense_changes_publish_no_delta(stores, tmp_path):
    trainer, _ = stores
    staged = tmp_path / "dense"
    write_safetensors({k: v * 3 for k, v in weights(0).items()}, staged)
    manifest = build_manifest(staged, run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    assert make_delta(trainer.checkpoints[0], staged, manifest, 0.5) is None


def test_no_base_wrong_base_or_other_layout_is_not_usable(stores, tmp_path):
    trainer, follower = stores
    published, envelope, body = publish(trainer, tmp_path, 1)
    manifest = published.manifest
    wrong_hash = dataclasses.replace(manifest, delta=dataclasses.replace(manifest.delta, base_hash=b"\x07" * 32))
    assert usable_base(follower, wrong_hash) is None
    assert usable_base(follower, dataclasses.replace(manifest, delta=None)) is None
    assert usable_base(ShardStore(tmp_path / "empty", RUN), manifest) is None
    staged = tmp_path / "other-layout"
    write_safetensors(weights(1) | {"model.extra": torch.zeros(4)}, staged)
    other = build_manifest(staged, run_id=RUN, step=1, parent_step=0, shard_size=SHARD)
    assert usable_base(follower, dataclasses.replace(other, delta=manifest.delta)) is None


def signed_with_body(manifest, body: bytes):
    """The trainer's own signature on a delta body of its choosing (a trainer fault)."""
    ref = DeltaRef(format="sparse/v2", base_step=manifest.parent_step, base_hash=manifest.delta.base_hash,
                   size=len(body), hash=delta_hash(body))
    envelope = codec.encode(dataclasses.replace(manifest, delta=ref), TRAINER, lifetime_s=600)
    return codec.decode(envelope, type(manifest)), envelope


@pytest.mark.parametrize("fault,reason", [("wrong_element", "delta_mismatch"), ("truncated", "delta_refused"),
                                          ("empty", "delta_mismatch")])
def test_a_signed_delta_that_does_not_give_the_checkpoint_leaves_nothing(stores, tmp_path, fault, reason):
    trainer, follower = stores
    published, _, body = publish(trainer, tmp_path, 1)
    if fault == "wrong_element":  # a well-formed body that writes one value the manifest does not sign
        payload = bytearray(zlib.decompress(body[18:]) if body[9] == 1 else body[18:])
        payload[-1] ^= 0x01  # the last difference's low byte
        bad = struct.pack(">8sBBQ", MAGIC, VERSION, 0, len(payload)) + bytes(payload)
    elif fault == "truncated":
        bad = body[:-5]
    else:
        bad = struct.pack(">8sBBQ", MAGIC, VERSION, 0, 0)  # changes nothing: the result is the base
    signed, envelope = signed_with_body(published.manifest, bad)
    base = usable_base(follower, signed.message)
    before = base.data_path.read_bytes()
    with pytest.raises(DeltaFailed) as failed:
        build_from_delta(follower, signed, envelope, base, bad)
    assert failed.value.reason == reason
    assert 1 not in follower.checkpoints
    assert not any(p.name.endswith(PARTIAL) for p in follower.root.iterdir())
    assert base.data_path.read_bytes() == before


def fetched_in_full(store: ShardStore, envelope: bytes, source: Path) -> None:
    """What the overlay's full fetch leaves: every shard checked, the step complete."""
    signed = codec.decode(envelope, CheckpointManifest)
    checkpoint = store.begin(signed, envelope)
    checkpoint.data_path.write_bytes(source.read_bytes())
    assert hash_shards(checkpoint.data_path, SHARD) == signed.message.shard_hashes
    for index in range(signed.message.shard_count):
        store.mark_verified(checkpoint, index)
    store.finalize(checkpoint)


def test_two_hundred_steps_with_misses_joiners_restarts_and_dense_steps_stay_exact(tmp_path):
    """Followers that miss steps, join late or restart never hold a byte the trainer did not sign:
    after every step each one's file is the trainer's, whichever way it got there."""
    rng = random.Random(11)
    trainer = ShardStore(tmp_path / "trainer", RUN)
    weights_now = {k: v.clone() for k, v in weights(0).items()}
    followers = {"steady": ShardStore(tmp_path / "steady", RUN), "lossy": ShardStore(tmp_path / "lossy", RUN),
                 "restarting": ShardStore(tmp_path / "restarting", RUN)}
    how: dict[str, list[str]] = {name: [] for name in [*followers, "joiner"]}
    for step in range(200):
        flat = weights_now["model.embed_tokens.weight"].view(-1)
        picks = torch.randperm(flat.numel())[: (flat.numel() if step % 37 == 36 else 40)]  # now and then: dense
        flat[picks] = flat[picks] + 0.05
        staged = tmp_path / f"staged-{step}"
        write_safetensors(weights_now, staged)
        manifest = build_manifest(staged, run_id=RUN, step=step, parent_step=step - 1 if step else None,
                                  shard_size=SHARD)
        delta = make_delta(trainer.checkpoints[step - 1], staged, manifest, 0.5) if step else None
        if delta is not None:
            manifest = dataclasses.replace(manifest, delta=delta[0])
        envelope = codec.encode(manifest, TRAINER, lifetime_s=600)
        published = trainer.add_published(staged, codec.decode(envelope, CheckpointManifest), envelope,
                                          delta=delta[1] if delta else None)
        trainer.prune(3)
        if step == 100:
            followers["joiner"] = ShardStore(tmp_path / "joiner", RUN)
        for name, store in followers.items():
            if name == "lossy" and rng.random() < 0.15:
                continue  # missed this manifest altogether
            if name == "restarting" and step % 50 == 49:
                store = followers[name] = ShardStore(tmp_path / name, RUN)
                store.reopen(lambda raw: codec.decode(raw, CheckpointManifest))
            signed = codec.decode(envelope, CheckpointManifest)
            base = usable_base(store, signed.message)
            if base is not None:
                build_from_delta(store, signed, envelope, base, delta[1])
                how[name].append("delta")
            else:
                fetched_in_full(store, envelope, published.data_path)
                how[name].append("full")
            store.prune(3)
            assert store.checkpoints[step].data_path.read_bytes() == published.data_path.read_bytes(), (name, step)
    assert how["steady"].count("full") == 1 + sum(1 for s in range(200) if s % 37 == 36)
    assert how["lossy"].count("full") > how["steady"].count("full")  # a miss costs one full step, then deltas
    assert how["joiner"][0] == "full" and how["joiner"][1:].count("delta") >= 80
    assert how["restarting"].count("delta") >= 180


def _copies(store: ShardStore) -> list[Path]:
    return sorted(p for p in store.root.iterdir() if p.name.startswith(COPY_AHEAD))


def test_a_base_copied_ahead_is_moved_in_and_the_build_gives_the_signed_bytes(stores, tmp_path):
    trainer, follower = stores
    base = follower.checkpoints[0]
    assert copy_base(follower, base)
    [copy] = _copies(follower)
    assert copy.read_bytes() == base.data_path.read_bytes()
    published, envelope, body = publish(trainer, tmp_path, 1)
    built = build_from_delta(follower, codec.decode(envelope, CheckpointManifest), envelope, base, body)
    assert built.on_copy_ahead and built.data_path.read_bytes() == published.data_path.read_bytes()
    assert _copies(follower) == []  # moved in, not copied again
    assert base.data_path.read_bytes() == copy_bytes(trainer, 0)  # the base itself untouched
    # no copy of step 1 was made: the next build copies its base as before
    published, envelope, body = publish(trainer, tmp_path, 2)
    again = build_from_delta(follower, codec.decode(envelope, CheckpointManifest), envelope, built, body)
    assert not again.on_copy_ahead and again.data_path.read_bytes() == published.data_path.read_bytes()


def copy_bytes(store: ShardStore, step: int) -> bytes:
    return store.checkpoints[step].data_path.read_bytes()


def test_a_damaged_copy_is_caught_by_the_shard_hashes_and_leaves_nothing(stores, tmp_path):
    trainer, follower = stores
    base = follower.checkpoints[0]
    assert copy_base(follower, base)
    [copy] = _copies(follower)
    with open(copy, "r+b") as f:  # a disk fault, or anything else that wrote there meanwhile
        f.seek(copy.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    published, envelope, body = publish(trainer, tmp_path, 1)
    signed = codec.decode(envelope, CheckpointManifest)
    with pytest.raises(DeltaFailed) as failed:
        build_from_delta(follower, signed, envelope, base, body)
    assert failed.value.reason == "delta_mismatch"
    assert 1 not in follower.checkpoints and _copies(follower) == []
    assert not any(p.name.endswith(PARTIAL) for p in follower.root.iterdir())
    built = build_from_delta(follower, signed, envelope, base, body)  # the next try copies the base itself
    assert not built.on_copy_ahead and built.data_path.read_bytes() == published.data_path.read_bytes()


def test_one_copy_at_most_only_with_room_for_a_step_beside_it_and_none_after_a_restart(stores, tmp_path,
                                                                                       monkeypatch):
    trainer, follower = stores
    published, envelope, body = publish(trainer, tmp_path, 1)
    one = build_from_delta(follower, codec.decode(envelope, CheckpointManifest), envelope, follower.checkpoints[0],
                           body)
    assert copy_base(follower, follower.checkpoints[0]) and copy_base(follower, one)
    [copy] = _copies(follower)  # the newer replaced the older
    assert copy.read_bytes() == one.data_path.read_bytes() and f"{1:012d}" in copy.name
    # a copy of step 1 is not a copy of step 0: a build on step 0 copies it itself
    assert not take_copy(follower, follower.checkpoints[0], tmp_path / "elsewhere")
    follower.reopen(lambda raw: codec.decode(raw, CheckpointManifest))
    assert _copies(follower) == [] and sorted(follower.checkpoints) == [0, 1]
    size = one.manifest.total_size
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=2 * size - 1))
    assert not copy_base(follower, follower.checkpoints[1]) and _copies(follower) == []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=2 * size))
    assert copy_base(follower, follower.checkpoints[1]) and len(_copies(follower)) == 1


def test_the_next_base_is_the_newest_step_or_the_frozen_base_of_its_adapter(stores, tmp_path):
    trainer, follower = stores
    assert next_base(follower) is follower.checkpoints[0]
    published, envelope, body = publish(trainer, tmp_path, 1)
    one = build_from_delta(follower, codec.decode(envelope, CheckpointManifest), envelope, follower.checkpoints[0],
                           body)
    assert next_base(follower) is one  # a sparse delta applies to its parent
    # step 2 shipped as an adapter on the frozen step 0: the next adapter applies to step 0 again
    staged = tmp_path / "staged-adapter"
    write_safetensors(weights(2), staged)
    adapter = bytes(64)
    manifest = dataclasses.replace(
        build_manifest(staged, run_id=RUN, step=2, parent_step=1, shard_size=SHARD),
        delta=DeltaRef(format=LORA_FORMAT, base_step=0, base_hash=follower.checkpoints[0].manifest.checkpoint_hash,
                       size=len(adapter), hash=delta_hash(adapter)))
    envelope = codec.encode(manifest, TRAINER, lifetime_s=600)
    follower.add_published(staged, codec.decode(envelope, CheckpointManifest), envelope, delta=adapter)
    assert next_base(follower) is follower.checkpoints[0]
    follower.prune(1, pinned=frozenset())  # the frozen base gone: nothing to copy ahead
    assert next_base(follower) is None


def test_a_run_that_ships_its_steps_in_full_is_not_copied_ahead(stores, tmp_path):
    """One full step may be the base of a first delta; two in a row say the run ships none."""
    trainer, follower = stores
    assert next_base(follower) is follower.checkpoints[0]
    full, envelope, body = publish(trainer, tmp_path, 1, fraction=0.0)  # deltas off: step 1 in full
    assert body is None
    follower.add_published(_copy(full.data_path, tmp_path / "f1"), codec.decode(envelope, CheckpointManifest),
                           envelope)
    assert next_base(follower) is None
    published, envelope, body = publish(trainer, tmp_path, 2)  # the run turns to deltas again
    assert body is not None
    built = build_from_delta(follower, codec.decode(envelope, CheckpointManifest), envelope,
                             follower.checkpoints[1], body)
    assert next_base(follower) is built


async def test_a_copy_no_delta_will_want_is_deleted_at_the_next_completion(stores, tmp_path):
    """A copy made while the run shipped deltas is a checkpoint's worth of disk once it stops."""
    trainer, follower = stores
    copies = CopyAhead(follower)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.run)
        copies.after_completion()
        await trio.testing.wait_all_tasks_blocked()
        await copies.settled(follower.checkpoints[0])
        assert [p.name[len(COPY_AHEAD):][:12] for p in _copies(follower)] == [f"{0:012d}"]
        (follower.root / f"{COPY_AHEAD}{0:012d}-half.tmp").write_bytes(b"x")  # a copy a crash left half-made
        full, envelope, _ = publish(trainer, tmp_path, 1, fraction=0.0)
        follower.add_published(_copy(full.data_path, tmp_path / "f1"),
                               codec.decode(envelope, CheckpointManifest), envelope)
        copies.after_completion()
        for _ in range(1000):  # the drop runs in a worker thread: up to 10 s
            if not _copies(follower):
                break
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert _copies(follower) == [] and sorted(follower.checkpoints) == [0, 1]


async def test_the_copy_ahead_follows_each_completion_and_a_build_waits_for_it(stores, tmp_path):
    trainer, follower = stores
    copies = CopyAhead(follower)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.run)
        for step in (1, 2):
            base = follower.checkpoints[step - 1]
            copies.after_completion()  # what the service does when a step completes here
            await trio.testing.wait_all_tasks_blocked()  # the copy has begun (or finished) in its thread
            await copies.settled(base)
            [copy] = _copies(follower)
            assert f"{step - 1:012d}" in copy.name and copy.read_bytes() == base.data_path.read_bytes()
            published, envelope, body = publish(trainer, tmp_path, step)
            built = await trio.to_thread.run_sync(build_from_delta, follower,
                                                  codec.decode(envelope, CheckpointManifest), envelope, base, body)
            assert built.on_copy_ahead and built.data_path.read_bytes() == published.data_path.read_bytes()
        nursery.cancel_scope.cancel()
