"""Bounded msgpack decoding (protocol/bounded_msgpack.py, specs/wire.md "Bounded decoding").

The memory tests decode hostile 16 MiB bodies, signed as a ``rollout_batch`` (the largest type, so
the loosest budgets), in a child process and read its peak RSS (VmHWM) before and after: no input
may raise it by more than 200 MiB. Unbounded, 16 MiB of empty maps cost 1.09 GiB.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import msgpack
import pytest

from intellect_node.crypto.envelope import seal
from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco import frames
from intellect_node.protocol import codec
from intellect_node.protocol.bounded_msgpack import MAX_OBJECTS, Limits, record_limits, scan, unpack
from intellect_node.protocol.errors import MalformedBody, Oversize
from intellect_node.protocol.messages import NodeAdvert
from intellect_node.protocol.rollouts import RolloutBatch

MIB = 1 << 20
LIMITS = Limits(max_bytes=1024, max_str_len=8, max_bin_len=8, max_array_len=4, max_map_len=2, max_objects=10,
                max_depth=3)

# Builds a hostile body of about 16 MiB, seals it as a rollout_batch, records VmHWM, decodes it
# with the node's codec and prints the peak before and after, and how the decode ended.
CHILD = r"""
import json, struct, sys
import msgpack
from intellect_node.crypto.envelope import seal
from intellect_node.crypto.identity import Identity
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.rollouts import RolloutBatch

SIZE = (16 << 20) - 256  # room for the envelope around the body
BUDGET = 1 << 20  # bounded_msgpack.MAX_OBJECTS

def grid(item, objects_per_item, budget=None):
    # Arrays of 1000 arrays of 1000 items (every length bound passes), filling SIZE bytes, or
    # ``budget`` objects when given (just under the object budget: these pass the scan).
    item_bytes = len(msgpack.packb(item))
    row = [item] * 1000
    if budget is not None:
        rows = budget // (1000 * objects_per_item + 1) - 2
        return msgpack.packb([[row] * 1000] * (rows // 1000) + [[row] * (rows % 1000)])
    rows = SIZE // (3 + 1000 * item_bytes)
    return msgpack.packb([[row] * 1000] * (rows // 1000) + [[row] * (rows % 1000 - 1)])

def body(kind):
    if kind == "empty_maps":
        return grid({}, 1)
    if kind == "empty_arrays":
        return grid([], 1)
    if kind == "one_key_maps":      # {"": {}}: three objects in three bytes
        return grid({"": {}}, 3)
    if kind == "small_ints":
        return grid(1000, 1)
    if kind == "floats":
        return grid(0.5, 1)
    if kind.startswith("budget_"):  # the most objects the scan lets through, then the schema refuses
        item, objects = {"budget_empty_maps": ({}, 1), "budget_one_key_maps": ({"": {}}, 3),
                         "budget_floats": (0.5, 1), "budget_strings": ("abcdefghijklmno", 1)}[kind]
        return grid(item, objects, BUDGET)
    if kind == "deep_arrays":       # [[[[...]]]] 100000 deep
        return b"\x91" * 100_000 + b"\xc0"
    if kind == "huge_str_header":   # str32 announcing 4 GiB
        return b"\xdb\xff\xff\xff\xff" + b"a" * (SIZE - 5)
    if kind == "huge_map_header":   # map32 announcing 4 billion entries
        return b"\xdf\xff\xff\xff\xff" + b"\xc0" * (SIZE - 5)
    if kind == "huge_array_header":
        return b"\xdd\xff\xff\xff\xff" + b"\xc0" * (SIZE - 5)
    raise SystemExit(f"unknown kind {kind}")

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

kind = sys.argv[1]
data = seal(Identity.generate(), RolloutBatch.TYPE, codec.PROTOCOL_VERSION, body(kind), lifetime_s=60)
assert len(data) <= RolloutBatch.MAX_SIZE, len(data)
before = hwm()
try:
    codec.decode(data, RolloutBatch)
    outcome = "accepted"
except Rejected as exc:
    outcome = f"{exc.reason}: {exc}"
print(json.dumps({"before": before, "after": hwm(), "outcome": outcome, "size": len(data)}))
"""


@pytest.mark.parametrize("kind", ["empty_maps", "empty_arrays", "one_key_maps", "small_ints", "floats",
                                  "budget_empty_maps", "budget_one_key_maps", "budget_floats", "budget_strings",
                                  "deep_arrays", "huge_str_header", "huge_map_header", "huge_array_header"])
def test_no_16_mib_input_raises_rss_by_200_mib(kind: str) -> None:
    child = subprocess.run([sys.executable, "-c", CHILD, kind], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    result = json.loads(child.stdout)
    grown = result["after"] - result["before"]
    print(f"{kind}: {result['size'] / MIB:.1f} MiB input, peak RSS +{grown / MIB:.1f} MiB, {result['outcome'][:120]}")
    assert result["size"] > 15 * MIB or kind == "deep_arrays" or kind.startswith("budget_")
    assert not result["outcome"].startswith("accepted")
    assert grown <= 200 * MIB, f"{kind}: peak RSS grew {grown / MIB:.0f} MiB"


# ---- each bound, on its own -----------------------------------------------------------------


def test_within_every_bound_decodes() -> None:
    value = {"a": [1, [b"xy", None]], "b": "text"}
    assert unpack(msgpack.packb(value), LIMITS, "t") == value


@pytest.mark.parametrize(("value", "bound"), [
    ("x" * 9, "max_str_len"),
    (b"x" * 9, "max_bin_len"),
    ([0] * 5, "max_array_len"),
    ({"a": 0, "b": 0, "c": 0}, "max_map_len"),
    ([[[[]]]], "max_depth"),
    ([[1, 2, 3], [4, 5, 6], [7, 8, 9]], "max_objects"),
])
def test_each_bound_is_named_when_exceeded(value: object, bound: str) -> None:
    with pytest.raises(Oversize, match=bound):
        unpack(msgpack.packb(value, use_bin_type=True), LIMITS, "t")


def test_max_bytes_is_checked_first() -> None:
    with pytest.raises(Oversize, match="max_bytes"):
        scan(b"\xc0" * 1025, LIMITS, "t")


def test_lengths_are_checked_on_the_header_before_the_payload_arrives() -> None:
    limits = Limits(max_bytes=MIB, max_str_len=MIB, max_bin_len=MIB, max_array_len=MIB, max_map_len=MIB)
    for header in (b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"):  # str32, bin32 of 4 GiB
        with pytest.raises(Oversize, match="4294967295 bytes"):
            scan(header + b"abc", limits, "t")
    with pytest.raises(MalformedBody, match="only 3 remain|runs"):
        scan(b"\xc4\x10abc", limits, "t")  # bin8 of 16 with 3 bytes
    with pytest.raises(MalformedBody, match="announces"):
        scan(b"\xdd\x00\x01\x00\x00" + b"\xc0" * 100, limits, "t")  # array32 of 65536 in 105 bytes


@pytest.mark.parametrize(("data", "match"), [
    (b"", "ends inside a value"),
    (b"\x92\x92\x01\x02", "ends inside a value"),
    (b"\x92\x01", "announces 2 objects"),
    (b"\xcd\x01", "ends inside a number"),
    (b"\xda\x00", "length field"),
    (b"\x01\x02", "1 bytes after the value"),
    (b"\xc1", "0xc1"),
    (b"\xd4\x01\x00", "extension type"),
    (b"\xc7\x00\x01", "extension type"),
])
def test_malformed_frames_are_malformed_body(data: bytes, match: str) -> None:
    with pytest.raises(MalformedBody, match=match):
        unpack(data, LIMITS, "t")


def test_non_string_map_key_is_malformed_body() -> None:
    with pytest.raises(MalformedBody):
        unpack(msgpack.packb({1: 2}), LIMITS, "t")


def test_scan_agrees_with_msgpack_on_every_type() -> None:
    value = [None, True, False, 0, 127, -1, -32, -33, 255, 65535, 2**32 - 1, 2**64 - 1, -(2**63), 0.5,
             struct.unpack(">f", struct.pack(">f", 1.5))[0], "", "é" * 20, "x" * 300, "y" * 70000, b"", b"z" * 300,
             b"w" * 70000, [], [1] * 20, {}, {str(i): i for i in range(20)}]
    data = msgpack.packb(value, use_bin_type=True)
    limits = Limits(max_bytes=MIB, max_str_len=MIB, max_bin_len=MIB, max_array_len=MIB, max_map_len=MIB)
    assert unpack(data, limits, "t") == value
    for cut in range(len(data) - 1, 0, -997):  # every truncation is refused, never decoded
        with pytest.raises(MalformedBody):
            unpack(data[:cut], limits, "t")


def test_schema_budgets() -> None:
    advert = record_limits(NodeAdvert, NodeAdvert.MAX_SIZE)
    assert advert.max_depth == 3 and advert.max_objects < 200 and advert.max_map_len < 100
    batch = record_limits(RolloutBatch, RolloutBatch.MAX_SIZE)
    assert batch.max_objects == MAX_OBJECTS and batch.max_depth == 7 and batch.max_bin_len >= 4 * 32768


def test_codec_names_the_exceeded_bound_of_a_signed_body() -> None:
    identity = Identity.generate()
    deep = seal(identity, NodeAdvert.TYPE, codec.PROTOCOL_VERSION, b"\x91" * 10 + b"\xc0", lifetime_s=60)
    with pytest.raises(Oversize, match="node_advert body: nested deeper than max_depth 3"):
        codec.decode(deep, NodeAdvert)
    many = seal(identity, NodeAdvert.TYPE, codec.PROTOCOL_VERSION, msgpack.packb([[0] * 10] * 30), lifetime_s=60)
    with pytest.raises(Oversize, match="max_objects"):
        codec.decode(many, NodeAdvert)


def test_diloco_frames_are_bounded_too() -> None:
    with pytest.raises(frames.FrameError, match="max_depth"):
        frames.decode(b"\x81\xa1a" + b"\x91" * 10 + b"\xc0", 1 << 20)
    with pytest.raises(frames.FrameError, match="max_objects"):
        frames.decode(msgpack.packb({"type": "x", "v": [[0] * 1000] * 1100}), 16 << 20)
