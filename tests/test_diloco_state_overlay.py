"""A joiner's global state through the shard overlay (specs/diloco.md section 2): real state
servers (the overlay's HTTP server, store and fetcher) on 127.0.0.1, each signing its own
manifests; the joiner takes only the state that more than half of the live allowlisted members
vouch for, and checks it by hash. No hivemind here: the states are built directly."""

from __future__ import annotations

import shutil

import pytest
import torch
import trio

from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.outer import GlobalState, outer_step
from intellect_node.node.diloco.state_file import StateFileError, read_state_file, write_state_file
from intellect_node.node.diloco.state_hash import state_hash
from intellect_node.node.diloco.state_overlay import choose
from intellect_node.node.diloco.toy_lm import build_toy
from intellect_node.node.shards.checkpoint import build_manifest
from intellect_node.protocol import codec
from intellect_node.protocol.manifest import CheckpointManifest
from tests.support.diloco_helpers import MICRO, Overlays, identity

SHARD = 1 << 16  # the smallest shard size: the micro model's state spans several shards


def _states() -> tuple[Layout, GlobalState, GlobalState]:
    """The honest round-1 state, and a lie: the same round with one parameter moved."""
    named = dict(build_toy(MICRO, seed=0).named_parameters())
    layout = Layout.of(named)
    honest = GlobalState.start(layout, layout.flatten(named))
    outer_step(honest, torch.full((layout.elements,), 1e-3), 0.7, 0.9)
    lie = GlobalState(layout, honest.params.clone(), honest.momentum.clone(), honest.round)
    lie.params[7] += 0.5
    return layout, honest, lie


def test_a_joiner_takes_only_the_state_a_majority_of_members_vouches_for(tmp_path) -> None:
    layout, honest, lie = _states()
    names = ["p0", "p1", "liar", "replayer", "joiner"]
    overlays = Overlays(tmp_path, frozenset(identity(n).peer_id for n in names), SHARD)
    try:
        for name in names + ["outsider"]:
            overlays.serve(name, layout)
        for name in ("p0", "p1", "outsider"):
            overlays.publish(name, honest)
        overlays.publish("liar", lie)  # a wrong state, under its own (correct) hash
        fetched = overlays.fetch("joiner", ["p0", "liar", "p1"])
        assert fetched is not None
        state, digest = fetched
        assert digest == state_hash(honest) and torch.equal(state.params, honest.params) and state.round == 1
        assert torch.equal(state.momentum, honest.momentum)
        joiner = overlays.overlays["joiner"]
        assert joiner.counters["states_fetched"] == 1 and joiner.counters["fetched_bytes"] > SHARD  # two shards

        # one honest member against one liar: no majority, nothing taken (an outsider's vote does not count)
        assert overlays.fetch("joiner", ["p0", "liar", "outsider"], 10.0) is None
        assert joiner.counters["no_majority"] >= 1

        # a liar alone ahead (round 2) is not believed either: the joiner falls back to round 1's majority
        ahead = GlobalState(layout, lie.params.clone(), lie.momentum.clone(), 2)
        overlays.publish("liar", ahead)
        fetched = overlays.fetch("joiner", ["p0", "liar", "p1"])
        assert fetched is not None and fetched[1] == state_hash(honest)

        # a state file whose tensors are not the hash it carries is refused even when nobody contradicts it
        overlays.publish("liar", GlobalState(layout, lie.params.clone(), lie.momentum.clone(), 3), state_hash(ahead))
        assert overlays.fetch("joiner", ["liar"], 10.0) is None
        assert joiner.counters["states_refused"] == 1

        # a member that replays another member's signed manifest as its own vote is refused and charged
        replayer, held = overlays.overlays["replayer"], overlays.overlays["p0"].served.checkpoints[1]
        shutil.copy(held.data_path, replayer.served.staging_path(1))
        replay = codec.decode(held.envelope, CheckpointManifest)
        trio.from_thread.run_sync(replayer.served.add_published, replayer.served.staging_path(1), replay,
                                  held.envelope, trio_token=overlays.token)
        assert overlays.fetch("joiner", ["replayer"], 10.0) is None
        assert joiner.counters["manifests_refused"] == 1 and joiner.scores.rejections["unauthorized_signer"] == 1
    finally:
        overlays.close()


def test_state_file_round_trips_and_refuses_a_wrong_hash_or_another_run(tmp_path) -> None:
    layout, honest, lie = _states()
    run = layout.run_digest(b"store-a")
    path = tmp_path / "state.safetensors"
    write_state_file(honest, state_hash(honest), run, path)
    manifest = build_manifest(path, run_id="run", step=1, parent_step=None, shard_size=SHARD)
    state, digest = read_state_file(path, manifest, layout, run)
    assert digest == state_hash(honest) and torch.equal(state.params, honest.params)
    write_state_file(honest, state_hash(honest), run, tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == path.read_bytes()  # every honest peer: the same bytes
    # a peer of another run (the same model on another METAGENE store) must not adopt it
    with pytest.raises(StateFileError, match="another run"):
        read_state_file(path, manifest, layout, layout.run_digest(b"store-b"))
    write_state_file(lie, state_hash(honest), run, path)
    manifest = build_manifest(path, run_id="run", step=1, parent_step=None, shard_size=SHARD)
    with pytest.raises(StateFileError, match="do not hash to the state hash"):
        read_state_file(path, manifest, layout, run)
    manifest = build_manifest(path, run_id="run", step=2, parent_step=None, shard_size=SHARD)
    with pytest.raises(StateFileError, match="holds round 1"):
        read_state_file(path, manifest, layout, run)


def test_choose_takes_a_strict_majority_and_breaks_a_two_sided_split_one_way() -> None:
    honest, lie = b"h" * 32, b"l" * 32
    assert choose({"a": honest, "b": honest, "c": lie}, 3) == honest
    assert choose({"a": honest, "c": lie}, 2) is None  # a joiner between one honest member and one liar
    assert choose({"a": honest}, 3) is None  # members that do not answer count against every hash
    assert choose({}, 2) is None
    # a member that diverged: its own state is one vote, and it never fetches what it holds
    assert choose({"a": honest, "b": honest}, 2, ("c", lie)) == honest
    assert choose({"a": honest, "b": lie}, 2, ("c", lie)) is None
    # two members that each diverged alone: exactly one of them moves (the one with the larger id)
    assert choose({"A": honest}, 1, ("B", lie)) == honest
    assert choose({"B": lie}, 1, ("A", honest)) is None
