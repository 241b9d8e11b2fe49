"""The weight broadcast between real node processes on 127.0.0.1: a trainer and fetchers, honest
and hostile peers, crashes and restarts. Every fetcher must end with the trainer's exact bytes."""

import hashlib
import json
import re

import multiaddr
import pytest
import trio
from libp2p.tools.anyio_service import background_trio_service

from intellect_node.node.demo.local_swarm import NodeProcess, wait_until
from intellect_node.node.shards.checkpoint import build_manifest
from intellect_node.node.shards.copy_ahead import COPY_AHEAD
from intellect_node.node.shards.server import pack_bits
from intellect_node.node.swarm.gossip import build_pubsub
from intellect_node.protocol import codec
from intellect_node.protocol.keys import announcements_topic, members_topic
from intellect_node.protocol.manifest import CheckpointManifest
from tests.support.attacker import Attacker
from tests.support.protocol_samples import sample_advert
from tests.support.shards_swarm import ShardSwarm, file_sha256, holds, make_checkpoint, shard_status
from tests.support.waiting import poll_until

MIB = 1 << 20
pytestmark = pytest.mark.slow  # an origin and several fetchers, each a node process


def test_origin_and_eight_fetchers_end_byte_identical_with_about_one_origin_copy(tmp_path):
    swarm = ShardSwarm(tmp_path, "shards-eight", {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(16 * MIB)})
    try:
        swarm.start_origin()
        for i in range(8):
            swarm.start_fetcher(f"f{i}")
        wait_until(swarm.swarm.converged, 60)
        digest = swarm.publish(1, 256, seed=1)
        elapsed = wait_until(lambda: all(holds(f, 1) for f in swarm.fetchers()), 300)
        assert {file_sha256(f, 1) for f in swarm.fetchers()} == {digest}
        origin = shard_status(swarm.origin)
        total = origin["steps"]["1"]["total_size"]
        assert origin["uploaded_bytes"] <= 2 * total, origin["uploaded_bytes"] / total
        # `status` shows the step each node holds (the advert's policy step)
        wait_until(lambda: [m["policy_step"] for m in swarm.origin.status()["members"]] == [1] * 9, 60)
        print(f"256 MiB to 8 fetchers in {elapsed:.1f} s; "
              f"origin uploaded {origin['uploaded_bytes'] / total:.2f} copies")
    finally:
        swarm.stop_all()


async def run_hostile_peer(target: NodeProcess, run_id: str, behaviour: str, shard_count: int,
                           forged_manifest: CheckpointManifest | None, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A member whose HTTP server claims every shard and misbehaves; it gossips its advert (and,
    if given, that manifest signed with its own key) until cancelled. Reports its peer id."""
    attacker = Attacker(target.addr, run_id)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(liar_server, behaviour, shard_count)
        async with attacker.host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            pubsub, router = build_pubsub(attacker.host)
            async with background_trio_service(pubsub), background_trio_service(router):
                await pubsub.wait_until_ready()
                await pubsub.subscribe(members_topic(run_id))
                await pubsub.subscribe(announcements_topic(run_id))
                attacker.host.get_peerstore().add_addrs(attacker.target.peer_id, attacker.target.addrs, 600)
                await attacker.host.connect(attacker.target)
                task_status.started(attacker.identity.peer_id)
                while True:
                    advert = sample_advert(attacker.identity, run_id=run_id, addrs=(f"/ip4/127.0.0.1/tcp/{port}/http",),
                                           policy_step=None)
                    await pubsub.publish(members_topic(run_id), codec.encode(advert, attacker.identity, lifetime_s=10))
                    if forged_manifest is not None:
                        await pubsub.publish(announcements_topic(run_id),
                                             codec.encode(forged_manifest, attacker.identity, lifetime_s=600))
                    await trio.sleep(1.0)


async def liar_server(behaviour: str, shard_count: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Claims every shard; serves garbage of the right length ("corrupt") or half a shard ("stall")."""

    async def handle(stream: trio.SocketStream) -> None:
        try:
            request = await stream.receive_some(65536)
            target = request.split(b" ")[1]
            if b"/have" in target:  # one line, then a stream that never changes
                line = json.dumps({"version": 1, "shards": shard_count,
                                   "verified": pack_bits(bytearray([1]) * shard_count)}).encode()
                await stream.send_all(b"HTTP/1.1 200 OK\r\n\r\n" + line + b"\n")
                while True:
                    await trio.sleep(5)
                    await stream.send_all(b"\n")
            match = re.search(rb"range: bytes=(\d+)-(\d+)", request.lower())
            if match is None:
                return
            start, end = int(match[1]), int(match[2])
            length = end - start + 1
            await stream.send_all(b"HTTP/1.1 206 OK\r\ncontent-length: %d\r\ncontent-range: bytes %d-%d/%d\r\n\r\n"
                                  % (length, start, end, end + 1))
            if behaviour == "corrupt":
                await stream.send_all(b"\x5a" * length)
            else:
                await stream.send_all(b"\x5a" * (length // 2))
                await trio.sleep(3600)
        except (trio.BrokenResourceError, trio.ClosedResourceError, IndexError):
            pass
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


def forged(tmp_path, run_id: str) -> CheckpointManifest:
    """A well-formed manifest for step 99, for a key that is not the trainer's to sign."""
    path = tmp_path / "forged.safetensors"
    make_checkpoint(path, 1, seed=9)
    return build_manifest(path, run_id=run_id, step=99, parent_step=None, shard_size=1 * MIB)


async def test_corrupt_and_stalling_peers_and_a_forged_manifest(tmp_path):
    run = "shards-hostile"
    shard = 1 * MIB
    # paced uploads (4 MiB/s per peer): the honest fetch lasts seconds, so every fetcher's have
    # streams reach both liars before it ends; unpaced over loopback it could end first on a busy
    # machine, and a staller nobody asked is never cut
    swarm = ShardSwarm(tmp_path, run, {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(shard),
                                        "INTELLECT_NODE_SHARDS_STALL_S": "2",
                                        "INTELLECT_NODE_SHARDS_PEER_RATE_MIB_S": "4"})
    mib = 24
    try:
        origin = swarm.start_origin()
        for i in range(3):
            swarm.start_fetcher(f"f{i}")
        forged_manifest = forged(tmp_path, run)
        forged_step = forged_manifest.step
        shard_count = -(-(mib * MIB + 4096) // shard)  # a little header beyond the tensors
        async with trio.open_nursery() as nursery:
            bad = await nursery.start(run_hostile_peer, origin, run, "corrupt", shard_count, forged_manifest)
            stalling = await nursery.start(run_hostile_peer, origin, run, "stall", shard_count, None)
            # every honest node must know both liars before the checkpoint appears
            await poll_until(lambda: all({bad, stalling} <= n.member_ids() for n in swarm.swarm.nodes.values()), 60,
                             poll_s=0.2)
            digest = await trio.to_thread.run_sync(swarm.publish, 1, mib, 3)
            await poll_until(lambda: all(holds(f, 1) for f in swarm.fetchers()), 180, poll_s=0.2)
            nursery.cancel_scope.cancel()
        for fetcher in swarm.fetchers():
            assert file_sha256(fetcher, 1) == digest
        statuses = [shard_status(f) for f in swarm.fetchers()]
        accused = {c["accused"] for s in statuses for c in s["complaints_made"]}
        assert accused == {bad}  # only the corrupt peer; a staller is slow, not a liar
        heard = {c["accused"] for s in [*statuses, shard_status(origin)] for c in s["complaints_heard"]}
        assert bad in heard  # the complaint went out on gossip
        rejections = [n.status()["rejections"] for n in swarm.swarm.nodes.values()]
        assert sum(r.get("bad_shard", 0) for r in rejections) >= 1
        assert sum(r.get("timeout", 0) for r in rejections) >= 1  # the staller was cut
        assert sum(r.get("unauthorized_signer", 0) for r in rejections) >= 1
        for node in swarm.swarm.nodes.values():  # nothing of the forged step was ever written
            assert str(forged_step) not in shard_status(node)["steps"]
            assert not list((node.home / "shards").rglob(f"*{forged_step:012d}*"))
    finally:
        swarm.stop_all()


def test_killed_relay_restarted_fetcher_and_retention(tmp_path):
    """kill -9 a fetcher that is relaying mid-transfer: the others finish. Restart it: it resumes
    from its verified shards and downloads only the rest. Then three more steps: every node keeps
    only the newest three and advertises the newest."""
    shard = 2 * MIB
    swarm = ShardSwarm(tmp_path, "shards-crash", {"INTELLECT_NODE_SHARDS_SHARD_SIZE": str(shard)})
    mib = 64
    try:
        # the origin is slow per peer, so the fetchers must relay and the transfer lasts a while
        swarm.start_origin({"INTELLECT_NODE_SHARDS_PEER_RATE_MIB_S": "3"})
        for i in range(4):
            swarm.start_fetcher(f"f{i}")
        wait_until(swarm.swarm.converged, 60)
        digest = swarm.publish(1, mib, seed=5)

        def relaying_mid_transfer() -> str | None:
            for name in ("f0", "f1", "f2", "f3"):
                status = shard_status(swarm.swarm.nodes[name]).get("steps", {}).get("1")
                if status and status["verified"] >= 4 and not status["complete"] \
                        and shard_status(swarm.swarm.nodes[name])["uploaded_bytes"] > 0:
                    return name
            return None

        wait_until(lambda: relaying_mid_transfer() is not None, 120, poll_s=0.05)
        victim = relaying_mid_transfer()
        assert victim is not None
        victim_home = swarm.swarm.nodes[victim].home
        swarm.swarm.kill(victim)  # SIGKILL: no goodbye, a half-written partial checkpoint stays
        held = shard_status_at(victim_home)["steps"]["1"]["verified"]
        others = swarm.fetchers()
        wait_until(lambda: all(holds(f, 1) for f in others), 180)
        assert {file_sha256(f, 1) for f in others} == {digest}

        restarted = swarm.swarm.start(victim, swarm.fetcher_args(), swarm.env)
        wait_until(lambda: holds(restarted, 1), 120)
        status = shard_status(restarted)
        assert file_sha256(restarted, 1) == digest
        assert status["resumed_shards"] >= held - 1  # at most the shard being marked when killed is lost
        total_shards = status["steps"]["1"]["shards"]
        assert status["fetched_shards"] == total_shards - status["resumed_shards"]  # nothing fetched twice

        for step in (2, 3, 4):
            swarm.publish(step, 4, seed=10 + step)
            wait_until(lambda step=step: all(holds(f, step) for f in swarm.fetchers()), 120)
        everyone = [swarm.origin, *swarm.fetchers()]
        for node in everyone:
            assert sorted(shard_status(node)["steps"]) == ["2", "3", "4"]
            names = sorted(p.name for p in (node.home / "shards" / "shards-crash").iterdir())
            copies = [name for name in names if name.startswith(COPY_AHEAD)]
            assert [name for name in names if name not in copies] == [f"{s:012d}" for s in (2, 3, 4)]
            # a follower keeps at most one base copied for the next delta (specs/deltas.md 5a), the newest step's
            assert len(copies) <= 1 and all(c.startswith(f"{COPY_AHEAD}{4:012d}-") for c in copies), copies
            assert node is not swarm.origin or not copies  # the publisher builds nothing from deltas
        wait_until(lambda: [m["policy_step"] for m in swarm.origin.status()["members"]] == [4] * 5, 60)
    finally:
        swarm.stop_all()


def shard_status_at(home) -> dict:
    return json.loads((home / "shards" / "status.json").read_text())


def _envelope_digest(node: NodeProcess, run_id: str, step: int) -> str:
    """sha256 of the manifest envelope ``node`` holds for ``step``: what a worker binds its batches to."""
    path = node.home / "shards" / run_id / f"{step:012d}" / "manifest.ine"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_reannouncements_repeat_the_held_envelope(tmp_path):
    """The trainer repeats its newest manifest every ``reannounce_s`` for late joiners. It must
    repeat the envelope it signed, not a fresh signature: holders keep the longest-lasting copy
    and a worker's batch names sha256(envelope), so each re-signing orphaned every batch begun
    before it (seen on the real model, whose batches take longer than the 30 s default)."""
    run_id = "shards-reannounce"
    swarm = ShardSwarm(tmp_path, run_id, {"INTELLECT_NODE_SHARDS_REANNOUNCE_S": "1"})
    try:
        origin = swarm.start_origin()
        fetcher = swarm.start_fetcher("f0")
        wait_until(swarm.swarm.converged, 60)
        swarm.publish(0, 1, seed=3)
        wait_until(lambda: holds(fetcher, 0), 60)
        first = {_envelope_digest(node, run_id, 0) for node in (origin, fetcher)}
        assert len(first) == 1
        late = swarm.start_fetcher("late")  # a late joiner still gets the manifest from a re-announcement
        wait_until(lambda: holds(late, 0), 60)
        assert {_envelope_digest(node, run_id, 0) for node in (origin, fetcher, late)} == first
    finally:
        swarm.swarm.stop_all()
