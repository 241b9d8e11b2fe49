"""DiLoCo's pure parts (specs/diloco.md): the outer step, the exact grid and its packing, the state
hash, the checkpoint, the child's frames, membership signatures, advert addresses, settings and
data assignment, each against hand-computed values or hostile input."""

from __future__ import annotations

import socket

import msgpack
import pytest
import torch

from intellect_node.crypto.identity import Identity
from intellect_node.node.config.base import build
from intellect_node.node.diloco import compressions, frames, grid, packing
from intellect_node.node.diloco.adverts import advert_addr, hivemind_maddr, port_of
from intellect_node.node.diloco.checkpoint import CheckpointError, PeerState, load_checkpoint, save_checkpoint
from intellect_node.node.diloco.data import generate, peer_key, round_batch
from intellect_node.node.diloco.data_spec import CorpusSpec
from intellect_node.node.diloco.layout import CHUNK, Layout
from intellect_node.node.diloco.membership import refusal, sign_member
from intellect_node.node.diloco.outer import GlobalState, outer_step
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.diloco.state_hash import state_hash


def _layout() -> Layout:
    return Layout.of({"b.weight": torch.zeros(3, 5), "a.bias": torch.zeros(7)})


def test_outer_step_matches_hand_computed_nesterov() -> None:
    layout = Layout(("w",), ((2,),))
    state = GlobalState.start(layout, torch.tensor([1.0, -2.0]))
    outer_step(state, torch.tensor([0.5, 0.25]), lr=0.7, momentum=0.9)
    # m = 0.9*0 + g = g; theta = theta - 0.7*(g + 0.9*m) = theta - 0.7*1.9*g
    assert state.momentum.tolist() == [0.5, 0.25]
    assert state.params.tolist() == pytest.approx([1.0 - 0.7 * 1.9 * 0.5, -2.0 - 0.7 * 1.9 * 0.25], abs=1e-7)
    outer_step(state, torch.tensor([0.0, 1.0]), lr=0.7, momentum=0.9)
    # m = 0.9*[0.5,0.25] + [0,1] = [0.45, 1.225]; step = g + 0.9*m
    assert state.momentum.tolist() == pytest.approx([0.45, 1.225], abs=1e-7)
    assert state.round == 2


def test_outer_step_equals_torch_sgd_nesterov() -> None:
    torch.manual_seed(0)
    theta = torch.randn(1000)
    state = GlobalState.start(Layout(("w",), ((1000,),)), theta.clone())
    param = torch.nn.Parameter(theta.clone())
    sgd = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(3):
        g = torch.randn(1000) * 1e-2
        outer_step(state, g, 0.7, 0.9)
        param.grad = g.clone()
        sgd.step()
    assert torch.allclose(state.params, param.detach(), atol=1e-6, rtol=0)


def test_layout_is_canonical_and_flattens_back() -> None:
    layout = _layout()
    assert layout.names == ("a.bias", "b.weight")
    tensors = {"a.bias": torch.arange(7.0), "b.weight": torch.arange(15.0).view(3, 5)}
    views = layout.views(layout.flatten(tensors))
    assert all(torch.equal(views[n], tensors[n]) for n in tensors)
    with pytest.raises(ValueError, match="shape"):
        layout.flatten({"a.bias": torch.zeros(8), "b.weight": torch.zeros(3, 5)})
    assert layout.digest() != Layout.of({"a.bias": torch.zeros(7)}).digest()


@pytest.mark.parametrize("compression", ["int4", "int8", "fp16", "int16"])
def test_grid_round_trip_within_half_a_step(compression: str) -> None:
    levels = compressions.levels_for(compression)
    x = torch.randn(3 * CHUNK + 17) * torch.logspace(-6, 0, 3 * CHUNK + 17)
    e = grid.exponents(x, levels)
    assert e.numel() == 4
    q = grid.quantize(x, e, levels)
    assert q.abs().max() <= levels and torch.equal(q, q.round())
    back = grid.average(q.to(torch.int32), e, 1)
    step = torch.ldexp(torch.ones(4, dtype=torch.float64), e.double()).repeat_interleave(CHUNK)[:x.numel()]
    assert bool(((back.double() - x.double()).abs() <= step / 2 + 1e-12).all())
    # error feedback: what the grid dropped, exactly
    assert torch.allclose(grid.residual(x, q, e) + back, x, atol=1e-9)


def test_grid_refuses_nan_and_unknown_compression() -> None:
    with pytest.raises(ValueError, match="NaN"):
        grid.exponents(torch.tensor([1.0, float("nan")]), 127)
    with pytest.raises(ValueError, match="unknown compression"):
        compressions.levels_for("fp8")


def test_grid_recovers_exact_sums_from_hivemind_style_deltas() -> None:
    """hivemind returns local + (fl(S/n) - local) in fp32: each member recovers the same S."""
    torch.manual_seed(1)
    n, levels = 5, 127
    xs = [torch.randn(2 * CHUNK) * (i + 1) for i in range(n)]
    shared = grid.shared_exponents([grid.exponents(x, levels) for x in xs])
    qs = [grid.quantize(x, shared, levels) for x in xs]
    exact = torch.stack(qs).double().sum(0)
    mean32 = torch.stack(qs).sum(0) / n  # fp32 reduction, as hivemind's reducer
    results = [q + (mean32 - q) for q in qs]
    sums = [grid.recover_sums(r, n) for r in results]
    assert all(torch.equal(s.double(), exact) for s in sums)
    averages = [grid.average(s, shared, n) for s in sums]
    assert all(torch.equal(a, averages[0]) for a in averages)
    assert grid.max_group(levels) * levels < grid.EXACT_LIMIT


def test_state_hash_identical_for_identical_state_and_sensitive_to_each_part() -> None:
    layout = _layout()
    params = torch.randn(layout.elements)
    a, b = GlobalState.start(layout, params), GlobalState.start(layout, params.clone())
    assert state_hash(a) == state_hash(b)
    b.round = 1
    assert state_hash(a) != state_hash(b)
    c = GlobalState.start(layout, params.clone())
    c.momentum[3] = 1e-30
    assert state_hash(a) != state_hash(c)


def _peer_state(layout: Layout) -> PeerState:
    state = GlobalState(layout, torch.randn(layout.elements), torch.randn(layout.elements), 7)
    return PeerState(state, torch.randn(layout.elements), torch.rand(layout.elements), torch.rand(layout.elements),
                     42, 1000)


def test_checkpoint_round_trip(tmp_path) -> None:
    layout = _layout()
    saved = _peer_state(layout)
    digest = save_checkpoint(tmp_path / "state.safetensors", saved)
    loaded = load_checkpoint(tmp_path / "state.safetensors", layout)
    assert state_hash(loaded.state) == digest and loaded.state.round == 7
    assert (loaded.adam_step, loaded.tokens) == (42, 1000)
    assert torch.equal(loaded.residual, saved.residual) and torch.equal(loaded.exp_avg_sq, saved.exp_avg_sq)


def test_checkpoint_rejects_tampering_other_models_and_garbage(tmp_path) -> None:
    layout = _layout()
    path = tmp_path / "state.safetensors"
    tampered = _peer_state(layout)
    save_checkpoint(path, tampered)
    raw = bytearray(path.read_bytes())
    raw[raw.find(tampered.state.params.numpy().tobytes()[:16])] ^= 0x01  # one bit of theta
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="does not hash"):
        load_checkpoint(path, layout)
    with pytest.raises(CheckpointError, match="another model"):
        save_checkpoint(path, _peer_state(layout))
        load_checkpoint(path, Layout.of({"a.bias": torch.zeros(7)}))
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint(path, layout)
    path.write_bytes(b"\0" * (4 * layout.elements * 5 + (1 << 20) + 1))
    with pytest.raises(CheckpointError, match="more than"):
        load_checkpoint(path, layout)


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    return a, b


def test_frames_round_trip_and_limits() -> None:
    a, b = _pair()
    frames.send(a, {"type": "status"})
    assert frames.receive(b, 1024) == {"type": "status"}
    a.sendall(frames.HEADER.pack(10_000))
    with pytest.raises(frames.FrameError, match="over the limit"):
        frames.receive(b, 1024)
    a2, b2 = _pair()
    a2.sendall(frames.HEADER.pack(3) + b"\xc1\xc1\xc1")
    with pytest.raises(frames.FrameError, match="not valid msgpack"):
        frames.receive(b2, 1024)
    a3, b3 = _pair()
    body = msgpack.packb([1, 2])
    a3.sendall(frames.HEADER.pack(len(body)) + body)
    with pytest.raises(frames.FrameError, match="string 'type'"):
        frames.receive(b3, 1024)
    a3.sendall(frames.HEADER.pack(5) + b"ab")
    a3.close()
    with pytest.raises(frames.FrameError, match="closed after 2 of 5"):
        frames.receive(b3, 1024)


def test_schema_names_the_bad_field() -> None:
    good = {"type": "average", "round": 3, "timeout_s": 10, "state_hash": b"\0" * 32, "values": b"\0" * 40,
            "member": "12D3KooW", "signature": b"\0" * 64}
    assert frames.validate(good, frames.average_request(10))["round"] == 3
    with pytest.raises(frames.FrameError, match="values: expected 40 bytes, got 36"):
        frames.validate(good | {"values": b"\0" * 36}, frames.average_request(10))
    with pytest.raises(frames.FrameError, match="round"):
        frames.validate(good | {"round": -1}, frames.average_request(10))
    with pytest.raises(frames.FrameError, match="unexpected fields \\['evil'\\]"):
        frames.validate(good | {"evil": 1}, frames.average_request(10))
    with pytest.raises(frames.FrameError, match="host"):
        init = {"type": "init", "prefix": "p", "shapes": [[2]], "layout": b"L" * 32, "levels": 127, "initial_peers": [],
                "host": "::1", "port": 0, "max_peers": 4, "min_peers": 2, "matchmaking_s": 1.0, "identity_path": "",
                "allowlist": [], "sparse_k": 0}
        frames.validate(init, frames.INIT)
    assert frames.validate(init | {"host": "127.0.0.1", "levels": 2047}, frames.INIT)["levels"] == 2047  # fp16
    with pytest.raises(frames.FrameError, match="levels"):
        frames.validate(init | {"host": "127.0.0.1", "levels": 2048}, frames.INIT)
    assert frames.validate(init | {"host": "127.0.0.1", "levels": 2, "sparse_k": 64}, frames.INIT)["sparse_k"] == 64
    with pytest.raises(frames.FrameError, match="sparse_k"):
        frames.validate(init | {"host": "127.0.0.1", "sparse_k": 63}, frames.INIT)


def test_membership_binds_node_identity_to_hivemind_peer() -> None:
    member, stranger = Identity.from_seed(b"m" * 32), Identity.from_seed(b"s" * 32)
    allow = frozenset({member.peer_id})
    layout, digest = b"L" * 32, b"H" * 32

    def payload(who: Identity, hivemind_peer: str) -> dict:
        return {"round": 4, "layout": layout, "state_hash": digest, "member": who.peer_id,
                "signature": sign_member(who, 4, hivemind_peer, layout, digest)}

    assert refusal(payload(member, "QmA"), "QmA", allow) is None
    assert refusal(payload(stranger, "QmA"), "QmA", frozenset()) is None  # no allowlist: anyone
    assert "not in the run's allowlist" in refusal(payload(stranger, "QmA"), "QmA", allow)
    assert "does not bind" in refusal(payload(member, "QmA"), "QmB", allow)  # replayed by another hivemind peer
    assert "does not bind" in refusal(payload(member, "QmA") | {"round": 5}, "QmA", allow)
    assert "valid peer id" in refusal(payload(member, "QmA") | {"member": "x"}, "QmA", frozenset({"x"}))


def test_hivemind_addresses_round_trip_through_adverts_and_junk_is_skipped() -> None:
    maddr = "/ip4/127.0.0.1/tcp/41234/p2p/12D3KooWBf21Sv8T5DzHrUnbwWrEtTmqb7dZTbyDNFUHhZRnH6KH"
    advertised = advert_addr(maddr)
    assert advertised == "/ip4/127.0.0.1/tcp/41234/hivemind/12D3KooWBf21Sv8T5DzHrUnbwWrEtTmqb7dZTbyDNFUHhZRnH6KH"
    assert "/p2p/" not in advertised  # libp2p never dials it as the node's own address
    assert hivemind_maddr(advertised) == maddr and port_of(maddr) == 41234
    for junk in ("/ip4/127.0.0.1/tcp/41234/http", "/ip4/999.1.1.1/tcp/1/hivemind/12D3KooWBf21Sv8T5DzHrUnbwWrEtTmqb7d",
                 "/ip4/0.0.0.0/tcp/1/hivemind/12D3KooWBf21Sv8T5DzHrUnbwWrEtTmqb7dZTbyDNF",
                 "/ip4/1.2.3.4/tcp/70000/hivemind/12D3KooWBf21Sv8T5DzHrUnbwWrEtTmqb7dZTbyDNF",
                 "/ip4/1.2.3.4/tcp/1/hivemind/0OIl" + "x" * 40, maddr + "/extra"):
        assert hivemind_maddr(junk) is None


def test_packing_is_exact_and_small_for_grid_parts_and_deltas() -> None:
    torch.manual_seed(3)
    n = 3
    qs = [torch.randint(-127, 128, (1000,)).float() for _ in range(n)]
    up = packing.pack(qs[0], n)
    assert up[0] == packing.TAG_INT8 and len(up) == 1001
    assert torch.equal(packing.unpack(up, 1000, n), qs[0])
    mean = torch.stack(qs).sum(0) / n  # the reducer's fp32 average
    delta = mean - qs[0]
    down = packing.pack(delta, n)
    assert down[0] == packing.TAG_SCALED16 and len(down) == 2001  # |S - n q| <= 2 * 127 * n
    returned = qs[0] + packing.unpack(down, 1000, n)
    assert torch.equal(grid.recover_sums(returned, n), torch.stack(qs).sum(0).to(torch.int32))
    big = torch.full((10,), 30000.0)
    assert packing.pack(big, n)[0] == packing.TAG_FP32 and torch.equal(packing.unpack(packing.pack(big, n), 10, n), big)
    for bad, numel in ((b"", 1000), (b"\x07" + b"\0" * 10, 10), (up[:-1], 1000), (b"\x01" + b"\0" * 20, 10),
                       (b"\x03" + b"\0" * 6, 10)):
        with pytest.raises(ValueError):
            packing.unpack(bad, numel, 0)


def test_int4_grid_goes_up_in_half_a_byte_and_back_in_one() -> None:
    torch.manual_seed(4)
    n = 4
    qs = [torch.randint(-7, 8, (1001,)).float() for _ in range(n)]
    up = packing.pack(qs[0], n)
    assert up[0] == packing.TAG_INT4 and len(up) == 1 + 501
    assert torch.equal(packing.unpack(up, 1001, n), qs[0])
    down = packing.pack(torch.stack(qs).sum(0) / n - qs[1], n)
    assert down[0] == packing.TAG_SCALED8 and len(down) == 1002
    returned = qs[1] + packing.unpack(down, 1001, n)
    assert torch.equal(grid.recover_sums(returned, n), torch.stack(qs).sum(0).to(torch.int32))


def test_fp16_grid_goes_up_as_exact_halves_and_back_in_two_bytes() -> None:
    """OpenDiLoCo's fp16 bytes (2 up, 2 down per element) with exact sums, up to the largest
    group whose replies fit int16 (2 (n-1) 2047 <= 32767: n = 9)."""
    torch.manual_seed(5)
    levels, n = compressions.levels_for("fp16"), 9
    xs = [torch.randn(CHUNK + 5) * (i + 1) for i in range(n)]
    shared = grid.shared_exponents([grid.exponents(x, levels) for x in xs])
    qs = [grid.quantize(x, shared, levels) for x in xs]
    assert levels // 2 < max(float(q.abs().max()) for q in qs) <= levels  # a power-of-two scale uses half or more
    up = packing.pack(qs[-1], 0)  # the member that sets the scale; going up no group size is needed
    assert up[0] == packing.TAG_FP16 and len(up) == 1 + 2 * qs[-1].numel()
    assert torch.equal(packing.unpack(up, qs[-1].numel(), n), qs[-1])
    mean = torch.stack(qs).sum(0) / n
    for member in range(n):
        down = packing.pack(mean - qs[member], n)
        assert down[0] == packing.TAG_SCALED16 and len(down) == 1 + 2 * qs[0].numel()
        returned = qs[member] + packing.unpack(down, qs[0].numel(), n)
        assert torch.equal(grid.recover_sums(returned, n), torch.stack(qs).sum(0).to(torch.int32))


@pytest.mark.parametrize("value", [0.5, 2050.0, -4096.0, float("inf"), float("nan")])
def test_fp16_part_refuses_halves_that_are_not_grid_integers(value: float) -> None:
    """A hostile tag-5 part: a fraction, a value past 2048 or a non-finite half would break the
    exact recovery of the sums, so it is refused rather than averaged."""
    good = packing.pack(torch.tensor([1.0, -2048.0, 3.0]), 0)
    assert good[0] == packing.TAG_FP16
    bad = good[:3] + torch.tensor([value], dtype=torch.float16).numpy().astype("<f2").tobytes() + good[5:]
    with pytest.raises(ValueError, match="not an integer"):
        packing.unpack(bad, 3, 2)
    with pytest.raises(ValueError, match="expected 7"):
        packing.unpack(good[:-1], 3, 2)


def test_settings_from_the_config_section_name_the_bad_key() -> None:
    s = build(DilocoSettings, {"H": 5, "compression": "int4", "outer_lr": 1, "allowlist": ["12D3KooW"]}, "cfg.toml",
              "[diloco]")
    assert (s.H, s.levels, s.outer_lr, s.allowlist) == (5, 7, 1, ("12D3KooW",))
    for bad, message in (({"H": 0}, "H = 0 is out of bounds"), ({"Hx": 1}, "unknown keys \\['Hx'\\]"),
                         ({"H": "5"}, "H: '5' is not a int"), ({"error_feedback": 1}, "error_feedback: 1"),
                         ({"outer_lr": True}, "outer_lr: True"), ({"compression": "fp8"}, "unknown compression"),
                         ({"data": "file:/etc/passwd"}, "expected 'generated"),
                         ({"initial_peers": "x"}, "expected a list")):
        with pytest.raises(ValueError, match=message):
            build(DilocoSettings, bad, "cfg.toml", "[diloco]")


def test_data_is_a_function_of_seed_round_and_peer() -> None:
    spec = CorpusSpec.parse("generated:sequences=256,seq_len=8,vocab=16,seed=3")
    corpus = generate(spec)
    assert torch.equal(corpus, generate(spec)) and corpus.shape == (256, 9) and int(corpus.max()) < 16
    a, b = peer_key(Identity.from_seed(b"a" * 32).peer_id), peer_key(Identity.from_seed(b"b" * 32).peer_id)
    assert torch.equal(round_batch(corpus, 0, 2, a, 1, 4), round_batch(corpus, 0, 2, a, 1, 4))
    assert not torch.equal(round_batch(corpus, 0, 2, a, 1, 4), round_batch(corpus, 0, 2, b, 1, 4))
    assert not torch.equal(round_batch(corpus, 0, 2, a, 1, 4), round_batch(corpus, 0, 3, a, 1, 4))
    one_round = torch.cat([round_batch(corpus, 0, 2, a, step, 4) for step in range(64)])
    assert len({tuple(row.tolist()) for row in one_round}) == len({tuple(row.tolist()) for row in corpus})  # no repeats
    with pytest.raises(ValueError, match="needs 260 samples"):
        round_batch(corpus, 0, 2, a, 64, 4)


@pytest.mark.parametrize("compression", ["int8", "topk128"])
@pytest.mark.parametrize("outer", [(0.7, 0.9), (1.0, 0.0)])
def test_eager_point_starts_an_overlapped_round_near_the_groups_next_parameters(compression, outer) -> None:
    """Two members' pseudo-gradients share a direction and differ by noise; the overlapped round of
    member 0 starts at ``eager_point``. It must land nearer the group's real θ_{r+1} than member
    0's own end point θ - x (the old start) wherever that end point is off (momentum, sparse), and
    leave the global state untouched."""
    from intellect_node.node.diloco.peer import eager_point

    torch.manual_seed(3)
    layout = Layout(("w",), ((3 * CHUNK,),))
    state = GlobalState(layout, torch.randn(3 * CHUNK), torch.randn(3 * CHUNK) * 1e-2, 5)
    before = (state.params.clone(), state.momentum.clone(), state.round)
    s = DilocoSettings(compression=compression, outer_lr=outer[0], outer_momentum=outer[1])
    common = torch.randn(3 * CHUNK) * 1e-2
    xs = [common + torch.randn(3 * CHUNK) * 5e-3 for _ in range(2)]
    shared = grid.shared_exponents([grid.exponents(x, s.levels) for x in xs])
    sums = sum(grid.quantize(x, shared, s.levels, s.sparse_k) for x in xs).to(torch.int32)
    group = GlobalState(layout, state.params.clone(), state.momentum.clone(), state.round)
    outer_step(group, grid.average(sums, shared, 2), s.outer_lr, s.outer_momentum)

    eager = eager_point(state, xs[0], s)
    end = state.params - xs[0]
    assert torch.equal(state.params, before[0]) and torch.equal(state.momentum, before[1]) and state.round == before[2]
    gap, old_gap = float((eager - group.params).norm()), float((end - group.params).norm())
    if compression == "int8" and outer == (1.0, 0.0):  # the end point is already the group's step but for noise
        assert gap < 1.01 * old_gap
    else:
        assert gap < 0.7 * old_gap, (gap, old_gap)
