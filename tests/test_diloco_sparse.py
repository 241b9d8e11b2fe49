"""Sparse compression (top-k of each chunk, 2-bit codes, error feedback) and the bound on one
member's say in the average (specs/diloco.md sections 4a and 8): the grid and the wire format on
their own, hivemind's reducer in a process of its own (hivemind and py-libp2p cannot share one),
then real averager children on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from intellect_node.node.diloco import compressions, grid, packing, sparse_indices
from intellect_node.node.diloco.client import Averaged, AveragerClient, ChildSettings
from intellect_node.node.diloco.layout import CHUNK, Layout, chunk_lengths
from intellect_node.node.diloco.settings import DilocoSettings
from tests.support.diloco_helpers import identity, make_peer, rounds_in_step, settings

K = 16


def _sparse_part(counts: list[int], indices: list[int], codes: list[int], pad_code: int = 0,
                 numel: int = CHUNK + 904) -> bytes:
    """A tag-8 part written field by field (its blocks those of ``numel`` elements), so a test can
    break exactly one field."""
    lengths = np.minimum(CHUNK, numel - CHUNK * np.arange(len(counts)))  # a count past numel's chunks too
    out = bytes([packing.TAG_SPARSE2]) + np.array(counts, dtype="<u2").tobytes()
    out += sparse_indices.encode(np.array(indices, dtype=np.int64), np.array(counts), lengths)
    padded = codes + [pad_code] * ((-len(codes)) % 4)
    return out + bytes(padded[i] | padded[i + 1] << 2 | padded[i + 2] << 4 | padded[i + 3] << 6
                       for i in range(0, len(padded), 4))


def _flip(buffer: bytes, byte: int, bit: int) -> bytes:
    return buffer[:byte] + bytes([buffer[byte] ^ (1 << bit)]) + buffer[byte + 1:]


def test_sparse_contribution_keeps_k_per_chunk_as_two_bit_codes() -> None:
    torch.manual_seed(0)
    x = torch.randn(3 * CHUNK + 100)
    q = grid.quantize(x, grid.exponents(x, compressions.SPARSE_LEVELS), compressions.SPARSE_LEVELS, K)
    chunks = torch.nn.functional.pad(q, (0, (-q.numel()) % CHUNK)).view(-1, CHUNK)
    assert ((chunks != 0).sum(dim=1) <= K).all() and ((chunks != 0).sum(dim=1) >= K // 2).all()
    assert set(q.unique().tolist()) <= {-2.0, -1.0, 0.0, 1.0, 2.0}
    kept = q != 0  # the kept values are the chunk's largest: none left out is larger than one kept
    for c in range(4):
        part = slice(c * CHUNK, (c + 1) * CHUNK)
        assert x[part].abs()[kept[part]].min() >= x[part].abs()[~kept[part]].max()
    assert compressions.sparse_k("topk64") == 64 and compressions.sparse_k("int8") == 0


@pytest.mark.parametrize("kind", ["distinct", "ties", "zeros"])
@pytest.mark.parametrize("k", [16, 128, 256])
def test_top_k_keeps_the_largest_and_breaks_ties_toward_the_lower_index(kind: str, k: int) -> None:
    """The mask equals the definition (a stable descending sort of each chunk's ``|x|``, first k),
    also where most values tie (few distinct integers, all zeros) and in the short last chunk."""
    torch.manual_seed(k)
    n = 3 * CHUNK + 1000
    x = {"distinct": torch.randn(n), "ties": torch.randint(-3, 4, (n,)).float(), "zeros": torch.zeros(n)}[kind]
    mask = grid._top_k_mask(x, k)
    padded = torch.nn.functional.pad(x.abs(), (0, (-n) % CHUNK)).view(-1, CHUNK)
    first_k = torch.argsort(padded, dim=1, descending=True, stable=True)[:, :k]
    expected = torch.zeros_like(padded, dtype=torch.bool).scatter_(1, first_k, True).view(-1)[:n]
    assert torch.equal(mask, expected)
    assert int(mask[:CHUNK].sum()) == k


def test_error_feedback_carries_a_coordinate_never_sent_until_it_is_sent() -> None:
    g = torch.zeros(CHUNK)
    g[:K] = 1.0  # K large coordinates fill the chunk's top-k every round ...
    g[100] = 0.1  # ... so this one is left out, and its residual grows until it is among them
    residual, sent_total, first_sent = torch.zeros(CHUNK), torch.zeros(CHUNK, dtype=torch.float64), None
    for t in range(40):
        x = g + residual
        shared = grid.exponents(x, compressions.SPARSE_LEVELS)
        q = grid.quantize(x, shared, compressions.SPARSE_LEVELS, K)
        sent = q.double() * 2.0 ** shared.double().repeat_interleave(CHUNK)[:CHUNK]
        if t == 0:
            assert q[100] == 0 and residual.abs().max() == 0
        if q[100] != 0 and first_sent is None:
            first_sent = t
            assert residual[100] > 0.5  # what it carried in
        sent_total += sent
        residual = grid.residual(x, q, shared)
    assert first_sent is not None and first_sent < 40
    # nothing is lost: what was sent plus what is still carried is what was produced
    torch.testing.assert_close(sent_total + residual.double(), 40 * g.double(), atol=1e-4, rtol=0)


def test_sparse_parts_travel_exactly_and_small() -> None:
    torch.manual_seed(1)
    x = torch.randn(5 * CHUNK + 7)
    q = grid.quantize(x, grid.exponents(x, 2), 2, 64)
    up = packing.pack(q, 0, 64)
    nonzero = int((q != 0).sum())
    assert up[0] == packing.TAG_SPARSE2 and torch.equal(packing.unpack(up, q.numel(), 0, 64), q)
    # 64 kept of a chunk of 4,096: 6 low bits and 2 bits of high bitmap an index, a 2-bit code
    assert len(up) <= 1 + 2 * 6 + (nonzero * (6 + 2) + 7) // 8 + 6 + (nonzero + 3) // 4
    twelve_bit_indices = 1 + 2 * 6 + 3 * ((nonzero + 1) // 2) + (nonzero + 3) // 4  # tags 6 and 7, retired
    assert len(up) < 0.75 * twelve_bit_indices and len(up) < q.numel() / 45  # int4 would take q.numel() / 2
    # a reducer's reply S/n - q over a union of indices: int8 multiples of 1/n, exact
    reply = (torch.randint(-8, 9, (q.numel(),)) * (torch.rand(q.numel()) < 0.05)).float() / 3
    down = packing.pack(reply, 3, 64)
    assert down[0] == packing.TAG_SPARSE_SCALED8 and torch.equal(packing.unpack(down, q.numel(), 3, 64), reply)
    dense_reply = torch.randint(-8, 9, (q.numel(),)).float() / 3  # denser than 40%: the dense tag is smaller
    assert packing.pack(dense_reply, 3, 64)[0] == packing.TAG_SCALED8


GOOD = _sparse_part([2, 1], [5, 9, 903], [0, 3, 1])


@pytest.mark.parametrize(("buffer", "numel", "error"), [
    (GOOD, CHUNK + 904, None),
    (_sparse_part([2, 1], [5, 9, 904], [0, 3, 1]), CHUNK + 904, "index out of range: 904"),
    (_sparse_part([2, 0], [9, 9], [0, 3]), CHUNK + 904, "duplicate or unsorted"),
    (_sparse_part([2, 0], [9, 5], [0, 3]), CHUNK + 904, "duplicate or unsorted"),
    (_sparse_part([3, 0], [1, 2, 3], [0, 0, 0]), CHUNK + 904, "k too large: a chunk lists 3 values, over k = 2"),
    (_sparse_part([1, 0], [1], [0], pad_code=1), CHUNK + 904, "bad code"),
    # the index section, bytes 5-9: chunk 0's high bitmap in bits 0-3 of byte 5 (indices 5 and 9 set
    # bits 0 and 1), chunk 1's in bits 4-6 (903 sets bit 5); then 11 + 11 + 9 low bits; 2 pad bits
    (_flip(_flip(GOOD, 5, 5), 5, 2), CHUNK + 904, "the high bits of chunk 0 mark 3 indices, its count is 2"),
    (_flip(GOOD, 5, 1), CHUNK + 904, "the high bits of chunk 0 mark 1 indices, its count is 2"),
    (_flip(GOOD, 5, 6), CHUNK + 904, "the high bits of chunk 1 mark 2 indices, its count is 1"),
    (_flip(GOOD, 9, 7), CHUNK + 904, "the padding bits after the indices are not zero"),
    # 3 chunks, 2 counts sent: the third count is read from the indices, and found impossible
    (GOOD, 2 * CHUNK + 904, "k too large: a chunk lists 675 values"),
    (_sparse_part([2, 1, 0], [5, 9, 903], [0, 3, 1]), CHUNK + 904,
     "sparse part of 13 bytes, expected 11 for 2 chunks and 3 values"),
    (GOOD[:-1], CHUNK + 904, "expected"),
    (bytes([6]) + GOOD[1:], CHUNK + 904, "unknown packing tag 6"),  # the retired 12-bit-index format
    (bytes([packing.TAG_SPARSE2]) + np.array([905], dtype="<u2").tobytes(), 904, "more than its 904"),
])
def test_sparse_parts_are_refused_naming_what_is_wrong(buffer: bytes, numel: int, error: str | None) -> None:
    if error is None:
        values = packing.unpack(buffer, numel, 0, 2)
        assert values[5] == -2 and values[9] == 2 and values[CHUNK + 903] == -1 and int((values != 0).sum()) == 3
        with pytest.raises(ValueError, match="a sparse part \\(tag 8\\) in a dense run"):
            packing.unpack(buffer, numel, 0, 0)
        return
    with pytest.raises(ValueError, match=error):
        packing.unpack(buffer, numel, 0, 2)


def test_shared_exponent_is_bounded_by_the_median_not_the_largest() -> None:
    honest = torch.tensor([-3, 0, 5], dtype=torch.int8)
    huge = torch.tensor([127, 127, 127], dtype=torch.int8)
    assert torch.equal(grid.shared_exponents([honest, honest, huge]), honest + 1)
    assert torch.equal(grid.shared_exponents([honest, huge]), honest + 1)  # two members: the smaller + 1
    slightly = honest + 1  # honest peaks within 2x of each other: nobody clips, as with the maximum
    assert torch.equal(grid.shared_exponents([honest, slightly, honest]), slightly)


def test_a_contribution_off_the_grid_is_named() -> None:
    honest = torch.zeros(2 * CHUNK)
    honest[:K] = torch.tensor([-2.0, -1.0, 1.0, 2.0]).repeat(K // 4)
    assert grid.contribution_error(honest, 1.0, 2, K) is None
    assert "weight 1000.0" in grid.contribution_error(honest, 1000.0, 2, K)
    assert "over the grid's 2" in grid.contribution_error(honest * 50, 1.0, 2, K)
    assert "not grid integers" in grid.contribution_error(honest / 3, 1.0, 2, K)
    dense = torch.ones(2 * CHUNK)
    assert f"{CHUNK} nonzero values in one chunk, over k = {K}" in grid.contribution_error(dense, 1.0, 2, K)
    assert grid.contribution_error(dense * 7, 1.0, 7, 0) is None  # a dense int4 part


def test_a_reducers_reply_past_what_n_members_sum_to_is_named() -> None:
    """``grid.sums_error`` sees hivemind's average in a member's span (sums / n) before any integer
    cast: n = 3 members on the int8 grid sum to at most 381 per element, k = 4 sparse ones to at
    most 12 nonzero values per chunk."""
    average = torch.zeros(2 * CHUNK)
    average[:3] = torch.tensor([127.0, -127.0, 1 / 3])
    assert grid.sums_error(average, 3, 127, 0) is None
    assert "over 3 members x 127 levels" in grid.sums_error(average + 200, 3, 127, 0)
    for poison in (float("nan"), float("inf"), -1e30, -2.0**31 / 3):  # would cast to INT_MIN, whose abs is itself
        bad = average.clone()
        bad[7] = poison
        assert grid.sums_error(bad, 3, 127, 0) is not None, poison
    sparse = torch.zeros(2 * CHUNK)
    sparse[:12] = 2.0
    assert grid.sums_error(sparse, 3, 2, 4) is None
    sparse[CHUNK: CHUNK + 13] = 1.0
    assert "13 nonzero sums in one chunk, over 3 members x k = 4" in grid.sums_error(sparse, 3, 2, 4)
    assert grid.sums_error(torch.zeros(0), 3, 127, 0) is None  # a member that reduced nothing


def test_sparse_needs_error_feedback() -> None:
    assert DilocoSettings(compression="topk64").sparse_k == 64
    with pytest.raises(Exception, match="error_feedback"):
        DilocoSettings(compression="topk64", error_feedback=False)


REDUCER = textwrap.dedent("""
    import asyncio, multiprocessing as mp, sys, torch
    from intellect_node.node.diloco import exact_averager
    from intellect_node.node.diloco.exact_averager import BoundedReducer, PoisonedPart
    exact_averager.SPARSE_K = 2

    async def main():
        refused = mp.Value("q", 0)
        reducer = BoundedReducer([torch.Size([8])], ["honest", "poisoner"], 2, refused)
        honest = torch.tensor([2.0, -1, 0, 0, 0, 0, 0, 0])
        for poison, weight in ((honest * 40, 1.0), (honest, 1000.0), (-torch.ones(8), 1.0)):
            try:
                await reducer.accumulate_part(1, 0, poison, weight)
                print("ACCEPTED")
            except PoisonedPart as exc:
                print("REFUSED", exc)
        print("COUNT", refused.value, sorted(exact_averager.REFUSED))
        reducer2 = BoundedReducer([torch.Size([8])], ["a", "b"], 2, refused)
        done = await asyncio.gather(reducer2.accumulate_part(0, 0, honest, 1.0),
                                    reducer2.accumulate_part(1, 0, -honest, 1.0))
        print("HONEST", done[0].tolist())

    asyncio.run(main())
""")


def test_hivemind_reducer_refuses_and_counts_parts_no_honest_member_sends() -> None:
    done = subprocess.run([sys.executable, "-c", REDUCER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("REFUSED member poisoner: part 0: a value of magnitude 80"), lines
    assert lines[1].startswith("REFUSED member poisoner: part 0: weight 1000.0"), lines
    assert lines[2].startswith("REFUSED member poisoner: part 0: 8 nonzero values in one chunk, over k = 2"), lines
    assert lines[3] == "COUNT 3 ['poisoner']" and lines[4] == "HONEST [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]"


# --- real averager children ------------------------------------------------------------------


@pytest.mark.slow
def test_sparse_rounds_between_real_peers_are_bit_identical_and_small(tmp_path) -> None:
    torch.set_num_threads(1)
    s = settings(compression="topk16", max_peers=2)
    first = make_peer(tmp_path, "p0", s)
    peers = [first, make_peer(tmp_path, "p1", s, tuple(first.client.maddrs))]
    try:
        sent, attempted = rounds_in_step(peers, 3)
        assert all(p.residual.abs().max() > 0 for p in peers)  # what was not sent is carried
        # int4 moves 1.5 bytes per element and round (half up, one back); 16 of 4096 per chunk, a
        # few bytes each way per value plus 2 bytes of counts per chunk, is far below
        elements = first.layout.elements
        assert 0 < sent < attempted * 1.5 * elements / 20, (sent, elements, attempted)
    finally:
        for p in peers:
            p.client.close()


def _average_together(clients: list[AveragerClient], values: list[torch.Tensor]) -> list[Averaged]:
    results: list[Averaged | BaseException] = [RuntimeError("did not finish")] * len(clients)

    def go(i: int) -> None:
        try:
            results[i] = clients[i].average(0, values[i], b"\0" * 32, 30.0, identity(f"m{i}"))
        except BaseException as exc:  # reported to the test
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert all(isinstance(r, Averaged) for r in results), results
    return results  # type: ignore[return-value]


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["topk64", "int8"])
def test_a_poisoning_member_moves_the_average_by_at_most_the_bound(tmp_path: Path, compression: str) -> None:
    """Three real members; one sends its groupmate's pseudo-gradient sign-flipped and scaled by
    10^4. Every member gets the same sums, and the poisoner's share of them is within the grid's
    levels on a grid no coarser than twice the honest members' own."""
    torch.set_num_threads(1)
    s = DilocoSettings(compression=compression)
    layout = Layout(("w",), ((3 * CHUNK + 500,),))
    clients: list[AveragerClient] = []
    try:
        for i in range(3):
            child = ChildSettings("diloco_poison", s.levels, tuple(clients[0].maddrs) if clients else (),
                                  max_peers=3, min_peers=3, matchmaking_s=2.0, sparse_k=s.sparse_k)
            clients.append(AveragerClient(tmp_path / f"m{i}.sock", layout, child, tmp_path / f"m{i}.log"))
            clients[-1].ensure_running()
        torch.manual_seed(2)
        honest = [torch.randn(layout.elements) * 1e-3, torch.randn(layout.elements) * 1e-3]
        poison = -1e4 * honest[0]
        results = _average_together(clients, [*honest, poison])
        assert [r.group_size for r in results] == [3, 3, 3]
        assert all(torch.equal(results[0].sums, r.sums) and torch.equal(results[0].exponents, r.exponents)
                   for r in results)
        shared = results[0].exponents
        assert (shared.to(torch.int16) <= torch.maximum(*(grid.exponents(h, s.levels) for h in honest)) + 1).all()
        own = [grid.quantize(h, shared, s.levels, s.sparse_k) for h in honest]
        poisoner_share = results[0].sums.float() - own[0] - own[1]
        assert poisoner_share.abs().max() <= s.levels
        if s.sparse_k:
            assert int((poisoner_share != 0).sum()) <= s.sparse_k * layout.chunks
        # so the average moved by at most levels * 2^E / n per element from the honest members' own
        average = grid.average(results[0].sums, shared, 3).double()
        honest_only = (own[0] + own[1]).double() * 2.0 ** shared.double().repeat_interleave(CHUNK)[:layout.elements] / 3
        bound = s.levels * 2.0 ** shared.double().repeat_interleave(CHUNK)[:layout.elements] / 3
        assert ((average - honest_only).abs() <= bound * (1 + 1e-6)).all()
        assert float((average - honest_only).abs().max()) < 1e-2  # where plain fp32 averaging moves it by ~30
    finally:
        for c in clients:
            c.close()


def test_members_on_another_grid_sign_and_compare_another_digest(tmp_path: Path) -> None:
    layout = Layout(("w",), ((10,),))

    def signed(levels: int, k: int) -> bytes:
        return AveragerClient(tmp_path / "c.sock", layout, ChildSettings("p", levels, sparse_k=k)).agreement

    assert len({signed(127, 0), signed(7, 0), signed(2, 64), signed(2, 128)}) == 4
    assert signed(2, 128) == signed(2, 128)


@pytest.mark.parametrize("seed", range(6))
def test_elias_fano_indices_round_trip_at_every_density(seed: int) -> None:
    """Any ascending block-local indices come back exactly, from empty chunks to full ones and a
    short last chunk, and the section never exceeds 2 + log2(U / n) bits an index."""
    rng = np.random.default_rng(seed)
    numel = int(rng.integers(1, 9)) * CHUNK + int(rng.integers(0, CHUNK))
    lengths = chunk_lengths(numel)
    counts = np.array([int(rng.choice([0, 1, 2, 16, 128, 700, length])) if length else 0 for length in lengths])
    counts = np.minimum(counts, lengths)
    local = np.concatenate([np.sort(rng.choice(length, count, replace=False))
                            for count, length in zip(counts, lengths, strict=True)]).astype(np.int64)
    section = sparse_indices.encode(local, counts, lengths)
    assert len(section) == sparse_indices.coded_size(counts, lengths)
    assert np.array_equal(sparse_indices.decode(section, counts, lengths), local)
    bound = sum(n * (2 + np.log2(u / n)) for n, u in zip(counts, lengths, strict=True) if n)
    assert 8 * len(section) <= bound + 8


def test_random_damage_to_a_sparse_part_is_refused_or_harmless() -> None:
    """Flipped bits and cut bytes anywhere in a real part give a ValueError or a part that still
    obeys the grid (k per chunk, codes in [-2, 2]): never another exception, never a crash."""
    torch.manual_seed(3)
    x = torch.randn(3 * CHUNK + 333)
    q = grid.quantize(x, grid.exponents(x, 2), 2, 64)
    part = packing.pack(q, 0, 64)
    rng = np.random.default_rng(0)
    for _ in range(400):
        damaged = bytearray(part)
        for _ in range(int(rng.integers(1, 4))):
            damaged[int(rng.integers(1, len(damaged)))] ^= 1 << int(rng.integers(0, 8))
        if rng.random() < 0.2:
            damaged = damaged[:int(rng.integers(1, len(damaged)))]
        try:
            values = packing.unpack(bytes(damaged), q.numel(), 0, 64)
        except ValueError:
            continue
        chunks = torch.nn.functional.pad(values, (0, (-values.numel()) % CHUNK)).view(-1, CHUNK)
        assert ((chunks != 0).sum(dim=1) <= 64).all() and values.abs().max() <= 2
