"""Policy deltas between real node processes on 127.0.0.1 (specs/deltas.md): followers build each
step from the step before and a delta of kilobytes, end byte-identical to the trainer, a joiner
takes the newest step in full and follows by deltas from there, a member serving a forged delta is
charged while the step still arrives, and adapter steps keep their base however old, which a joiner
fetches once."""

import hashlib
import os
import time

import multiaddr
import numpy as np
import pytest
import torch
import trio
from libp2p.tools.anyio_service import background_trio_service

from intellect_node.node.demo.local_swarm import wait_until
from intellect_node.node.shards.checkpoint import read_tensor_index, write_safetensors
from intellect_node.node.shards.deltas import merge_adapter
from intellect_node.node.swarm.gossip import build_pubsub
from intellect_node.protocol import codec
from intellect_node.protocol.deltas import encode_delta
from intellect_node.protocol.keys import announcements_topic, members_topic
from intellect_node.protocol.lora import decode_adapter, encode_adapter
from tests.support.attacker import Attacker
from tests.support.protocol_samples import sample_advert
from tests.support.shards_swarm import ShardSwarm, file_sha256, holds, shard_status
from tests.support.waiting import poll_until

MIB = 1 << 20
ENV = {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(MIB)}


def policy(step: int) -> dict[str, torch.Tensor]:
    """About 6 MiB of bf16 weights; each step moves one element in 500 of every tensor."""
    g = torch.Generator().manual_seed(7)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(768, 1024, generator=g).to(torch.bfloat16)
               for i in range(4)}
    for s in range(1, step + 1):
        for tensor in tensors.values():
            flat = tensor.view(-1)
            flat[s::500] = flat[s::500] * 1.02 + 0.01
    return tensors


def publish(swarm: ShardSwarm, step: int) -> str:
    swarm.publish_dir.mkdir(parents=True, exist_ok=True)
    staging = swarm.publish_dir / f".writing-{step}"
    write_safetensors(policy(step), staging)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()
    os.rename(staging, swarm.publish_dir / f"step-{step}.safetensors")
    return digest


def delta_size(tmp_path, base: int, step: int) -> int:
    """The size of the body the trainer will publish (encoding is deterministic)."""
    paths = [tmp_path / f"size-{s}.safetensors" for s in (base, step)]
    for s, path in zip((base, step), paths, strict=True):
        write_safetensors(policy(s), path)
    body = encode_delta(read_tensor_index(paths[1]), paths[0].read_bytes(), paths[1].read_bytes())
    assert body is not None
    return len(body)


def all_hold(nodes, step: int) -> bool:
    return all(holds(n, step) for n in nodes)


@pytest.mark.slow
def test_followers_build_every_step_from_deltas_and_a_joiner_catches_up(tmp_path):
    swarm = ShardSwarm(tmp_path, "deltas-follow", ENV)
    try:
        swarm.start_origin()
        followers = [swarm.start_fetcher(f"f{i}") for i in range(2)]
        wait_until(swarm.swarm.converged, 60)
        digest = publish(swarm, 0)
        wait_until(lambda: all_hold(followers, 0), 120)
        for step in range(1, 5):
            digest = publish(swarm, step)
            wait_until(lambda step=step: all_hold(followers, step), 120)
            assert {file_sha256(f, step) for f in followers} == {digest}
        total = shard_status(followers[0])["steps"]["4"]["total_size"]
        for follower in followers:
            status = shard_status(follower)
            assert status["delta_steps"] == 4, status
            # each step's base was copied while the test waited (specs/deltas.md 5a), and moved in
            assert status["delta_copied_ahead"] == 4, status
            assert status["fetched_bytes"] <= total * 1.05  # step 0 only: every later step came as a delta
            assert status["delta_bytes"] < 4 * total / 50
        # the origin's status file is rewritten every 0.5 s: followers can hold a small step before it says so
        wait_until(lambda: "4" in shard_status(swarm.origin).get("steps", {}), 30)
        assert shard_status(swarm.origin)["steps"]["4"]["delta_size"] < total / 50
        # a joiner holds no base: the newest step in full from any holder, then deltas again
        joiner = swarm.start_fetcher("joiner")
        wait_until(lambda: holds(joiner, 4), 120)
        digest = publish(swarm, 5)
        wait_until(lambda: all_hold([*followers, joiner], 5), 120)
        assert {file_sha256(n, 5) for n in [*followers, joiner]} == {digest}
        assert shard_status(joiner)["delta_steps"] >= 1
        assert shard_status(joiner)["delta_copied_ahead"] == shard_status(joiner)["delta_steps"]
    finally:
        swarm.stop_all()



@pytest.mark.slow
def test_each_delta_body_spreads_as_a_tree_one_copy_from_each_node(tmp_path):
    """specs/deltas.md section 4 with ``delta_seed_copies = 1`` everywhere: the trainer sends a step's
    body once and names that holder, each holder sends it once and names its own: no node's uplink
    carries one body per follower, and every follower still builds every step from its delta."""
    one_copy = {**ENV, "INTELLECT_NODE_SHARDS_DELTA_SEED_COPIES": "1"}
    swarm = ShardSwarm(tmp_path, "deltas-relay", one_copy)
    try:
        origin = swarm.start_origin()
        followers = [swarm.start_fetcher(f"f{i}") for i in range(4)]
        wait_until(swarm.swarm.converged, 60)
        publish(swarm, 0)
        wait_until(lambda: all_hold(followers, 0), 120)
        steps = range(1, 4)
        for step in steps:
            digest = publish(swarm, step)
            wait_until(lambda step=step: all_hold(followers, step), 120)
            assert {file_sha256(f, step) for f in followers} == {digest}
        wait_until(lambda: "3" in shard_status(origin).get("steps", {}), 30)  # status files lag by 0.5 s
        time.sleep(1.0)
        statuses = [shard_status(f) for f in followers]
        assert [s["delta_steps"] for s in statuses] == [len(steps)] * 4, statuses
        assert all(s["delta_unavailable"] == 0 for s in statuses), statuses
        # one copy a step from each node, and one more where a holder's hold (10 s) passed: never one per follower
        sent = shard_status(origin)["uploaded_deltas"]
        assert sent <= 2 * len(steps), sent
        assert all(s["uploaded_deltas"] <= 2 * len(steps) for s in statuses), statuses
        assert sum(s["delta_from_members"] for s in statuses) == 4 * len(steps) - sent
        assert sum(s["uploaded_deltas"] for s in statuses) == 4 * len(steps) - sent
    finally:
        swarm.stop_all()


@pytest.mark.slow
def test_a_holder_the_trainer_named_that_died_costs_a_hold_not_the_step(tmp_path):
    """The only member the trainer sent step 1's body to is killed before another follower asks: the
    trainer names it (409), the follower finds it gone, and the trainer sends one more copy once its
    hold passed with nothing under way; the step still arrives as a delta, not in full."""
    swarm = ShardSwarm(tmp_path, "deltas-relay-gone", ENV)
    # the trainer's hold is max(5 s, stall_s) = 25 s; the late follower asks it again after its own 30 s
    late_env = {**swarm.env, "INTELLECT_NODE_SHARDS_STALL_S": "30"}
    try:
        origin = swarm.start_origin({"INTELLECT_NODE_SHARDS_DELTA_SEED_COPIES": "1",
                                     "INTELLECT_NODE_SHARDS_STALL_S": "25"})
        first, late = swarm.start_fetcher("first"), swarm.swarm.start("late", swarm.fetcher_args(), late_env)
        wait_until(swarm.swarm.converged, 60)
        publish(swarm, 0)
        wait_until(lambda: all_hold([first, late], 0), 120)
        swarm.swarm.stop("late")
        digest = publish(swarm, 1)
        wait_until(lambda: holds(first, 1), 60)  # the trainer's one copy went to the one follower running
        swarm.swarm.kill("first")
        wait_until(lambda: shard_status(origin)["uploaded_deltas"] == 1, 30)  # its status file lags by 0.5 s
        refused = shard_status(origin)["uploads_refused"]  # step 0's seed mode refused some shards
        late = swarm.swarm.start("late", swarm.fetcher_args(), late_env)  # holds step 0 from before
        wait_until(lambda: holds(late, 1), 120)
        assert file_sha256(late, 1) == digest
        status = shard_status(late)
        assert status["delta_steps"] == 1 and status["delta_unavailable"] == 0, status
        assert status["delta_from_members"] == 0 and status["fetched_bytes"] == 0, status
        wait_until(lambda: shard_status(origin)["uploaded_deltas"] == 2, 30)
        assert shard_status(origin)["uploads_refused"] > refused  # the late follower was told of the dead holder first
    finally:
        swarm.stop_all()

async def forged_delta_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Answers every delta request with 200 and junk of the length asked for (the manifest's size
    is public, so a liar can match it); everything else 404."""
    sizes: dict[bytes, int] = {}

    async def handle(stream: trio.SocketStream) -> None:
        try:
            request = await stream.receive_some(65536)
            target = request.split(b" ")[1]
            size = sizes.get(target)
            if target.endswith(b"/delta") and size:
                await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + b"\x5a" * size)
            else:
                await stream.send_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, IndexError):
            pass
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started((listeners[0].socket.getsockname()[1], sizes))
    await trio.serve_listeners(handle, listeners)


async def run_delta_liar(target, run_id: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A member that advertises a far newer step (so followers ask it first) and serves junk deltas."""
    attacker = Attacker(target.addr, run_id)
    async with trio.open_nursery() as nursery:
        port, sizes = await nursery.start(forged_delta_server)
        async with attacker.host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            pubsub, router = build_pubsub(attacker.host)
            async with background_trio_service(pubsub), background_trio_service(router):
                await pubsub.wait_until_ready()
                await pubsub.subscribe(members_topic(run_id))
                await pubsub.subscribe(announcements_topic(run_id))
                attacker.host.get_peerstore().add_addrs(attacker.target.peer_id, attacker.target.addrs, 600)
                await attacker.host.connect(attacker.target)
                task_status.started((attacker.identity.peer_id, sizes))
                while True:
                    advert = sample_advert(attacker.identity, run_id=run_id, policy_step=1000,
                                           addrs=(f"/ip4/127.0.0.1/tcp/{port}/http",))
                    await pubsub.publish(members_topic(run_id), codec.encode(advert, attacker.identity, lifetime_s=10))
                    await trio.sleep(1.0)


@pytest.mark.slow
async def test_a_forged_delta_is_charged_and_the_step_still_arrives(tmp_path):
    run = "deltas-liar"
    swarm = ShardSwarm(tmp_path, run, ENV)
    try:
        origin = swarm.start_origin()
        follower = swarm.start_fetcher("f0")
        digest = await trio.to_thread.run_sync(publish, swarm, 0)
        await poll_until(lambda: holds(follower, 0), 120, poll_s=0.2)
        async with trio.open_nursery() as nursery:
            liar, sizes = await nursery.start(run_delta_liar, origin, run)
            await poll_until(lambda: liar in follower.member_ids(), 60, poll_s=0.2)
            # the size is public (the signed manifest names it): the liar serves junk of exactly that length
            sizes[f"/ina/v1/{run}/1/delta".encode()] = delta_size(tmp_path, 0, 1)
            digest = await trio.to_thread.run_sync(publish, swarm, 1)
            await poll_until(lambda: holds(follower, 1), 120, poll_s=0.2)
            nursery.cancel_scope.cancel()
        assert file_sha256(follower, 1) == digest
        status = shard_status(follower)
        assert status["delta_steps"] == 1  # from the trainer, after the liar's junk was refused
        assert status["bad_deltas"] == 1  # members at the step are asked before the trainer
        assert follower.status()["rejections"].get("bad_delta", 0) == 1
        # the origin's status file lags its store by up to 0.5 s
        await poll_until(lambda: "1" in shard_status(origin).get("steps", {}), 30, poll_s=0.1)
        assert shard_status(origin)["steps"]["1"]["delta_size"] == sizes[f"/ina/v1/{run}/1/delta".encode()]
    finally:
        swarm.stop_all()


def publish_adapter_step(swarm: ShardSwarm, step: int, base_path, seed: int) -> str:
    """A LoRA trainer's hand-over: the adapter body beside the merged checkpoint, then the rename."""
    tensors = read_tensor_index(base_path)
    g = np.random.default_rng(seed)
    matrices = {e.name: (g.standard_normal((4, e.shape[1])).astype(np.float32) * 0.05,
                         g.standard_normal((e.shape[0], 4)).astype(np.float32) * 0.05) for e in tensors[:2]}
    body = encode_adapter(tensors, 4, 2.0, matrices)
    data = bytearray(base_path.read_bytes())
    merge_adapter(decode_adapter(body, tensors), tensors, memoryview(data))
    (swarm.publish_dir / f"step-{step}.base-0.lora").write_bytes(body)
    staging = swarm.publish_dir / f".writing-{step}"
    staging.write_bytes(bytes(data))
    os.rename(staging, swarm.publish_dir / f"step-{step}.safetensors")
    return hashlib.sha256(bytes(data)).hexdigest()


@pytest.mark.slow
def test_adapter_steps_keep_their_base_and_a_joiner_fetches_it_once(tmp_path):
    swarm = ShardSwarm(tmp_path, "deltas-lora", ENV)
    try:
        swarm.start_origin()
        follower = swarm.start_fetcher("f0")
        wait_until(swarm.swarm.converged, 60)
        publish(swarm, 0)
        base_path = tmp_path / "base.safetensors"
        write_safetensors(policy(0), base_path)
        wait_until(lambda: holds(follower, 0), 120)
        for step in range(1, 5):  # more steps than keep_steps (3): the base must stay anyway
            digest = publish_adapter_step(swarm, step, base_path, seed=step)
            wait_until(lambda step=step: holds(follower, step), 120)
            assert file_sha256(follower, step) == digest
        status = shard_status(follower)
        assert status["delta_steps"] == 4 and "0" in status["steps"], status["steps"].keys()
        assert {status["steps"][s]["delta_format"] for s in ("2", "3", "4")} == {"lora/v1"}
        joiner = swarm.start_fetcher("joiner")  # holds no base: step 4 in full, then the base once
        wait_until(lambda: holds(joiner, 4) and holds(joiner, 0), 120)
        digest = publish_adapter_step(swarm, 5, base_path, seed=5)
        wait_until(lambda: holds(joiner, 5), 120)
        assert file_sha256(joiner, 5) == digest
        assert shard_status(joiner)["delta_steps"] == 1
    finally:
        swarm.stop_all()
