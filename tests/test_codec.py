import re
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intellect_node.crypto.envelope import DOMAIN, HEADER_SIZE, MAGIC, now_ms, seal
from intellect_node.crypto.identity import Identity
from intellect_node.protocol import codec, errors
from intellect_node.protocol.messages import ACCELERATORS, ROLES, Hardware, NodeAdvert
from tests.support.protocol_samples import sample_advert

IDENTITY = Identity.generate()
OTHER = Identity.generate()


def sealed_body(body: object, *, identity: Identity = IDENTITY, message_type: str = "node_advert",
                version: int = codec.PROTOCOL_VERSION, lifetime_s: float = 60.0,
                timestamp_ms: int | None = None) -> bytes:
    """An envelope with a correct signature around an arbitrary body: schema errors in isolation."""
    return seal(identity, message_type, version, msgpack.packb(body, use_bin_type=True),
                lifetime_s=lifetime_s, timestamp_ms=timestamp_ms)


def test_round_trip():
    advert = sample_advert(IDENTITY)
    signed = codec.decode(codec.encode(advert, IDENTITY, lifetime_s=60), NodeAdvert)
    assert signed.message == advert
    assert signed.signer_peer_id == IDENTITY.peer_id
    assert signed.envelope.expiry_ms - signed.envelope.timestamp_ms == 60_000


def test_oversize_is_rejected_before_decoding():
    with pytest.raises(errors.Oversize):
        codec.decode(b"\x00" * (NodeAdvert.MAX_SIZE + 1), NodeAdvert)


@pytest.mark.parametrize("data", [b"", b"INE", b"garbage" * 40, MAGIC + b"\x00" * 10])
def test_garbage_is_malformed(data):
    with pytest.raises(errors.MalformedEnvelope):
        codec.decode(data, NodeAdvert)


def test_unknown_type_is_rejected():
    with pytest.raises(errors.UnknownMessageType):
        codec.decode(sealed_body({}, message_type="no_such_type"), NodeAdvert)


def test_unsupported_version_is_rejected():
    body = sample_advert(IDENTITY).to_wire()
    with pytest.raises(errors.UnsupportedVersion):
        codec.decode(sealed_body(body, version=99), NodeAdvert)


def test_newer_version_costs_nothing_older_or_invented_costs():
    from intellect_node.node.swarm.peer_scores import PeerScores

    body = sample_advert(IDENTITY).to_wire()
    with pytest.raises(errors.NewerVersion) as newer:
        codec.decode(sealed_body(body, version=codec.PROTOCOL_VERSION + 1), NodeAdvert)
    with pytest.raises(errors.UnsupportedVersion) as invented:
        codec.decode(sealed_body(body, version=0), NodeAdvert)
    assert newer.value.reason == "newer_version" and invented.value.reason == "unsupported_version"
    scores = PeerScores()
    for _ in range(50):  # an upgraded peer's whole stream of messages
        scores.reject("upgraded", newer.value.reason)
    scores.reject("stale", invented.value.reason)
    assert scores.penalty("upgraded") == 0 and scores.penalty("stale") > 0 and not scores.banned
    assert scores.rejections["newer_version"] == 50


def test_penalty_table_in_the_spec_is_the_one_in_force():
    from pathlib import Path

    from intellect_node.node.swarm.peer_scores import DEFAULT_PENALTY, PENALTIES

    spec = (Path(__file__).parents[1] / "specs" / "wire.md").read_text()
    section = spec[spec.index("## 5. Penalties"):]
    table = {m[0]: float(m[1]) for m in re.findall(r"^\| `(\w+)` \| ([0-9.]+) \|$", section, re.M)}
    assert table == PENALTIES
    assert f"(any reason not listed: {DEFAULT_PENALTY:g})" in section


def test_missing_field():
    body = sample_advert(IDENTITY).to_wire()
    del body["roles"]
    with pytest.raises(errors.MissingField, match="roles"):
        codec.decode(sealed_body(body), NodeAdvert)


def test_extra_field():
    body = sample_advert(IDENTITY).to_wire() | {"bonus": 1}
    with pytest.raises(errors.ExtraField, match="bonus"):
        codec.decode(sealed_body(body), NodeAdvert)


@pytest.mark.parametrize("field,value", [
    ("policy_step", "7"), ("policy_step", True), ("policy_step", 7.0), ("roles", "inference"),
    ("throughput_tokens_per_s", 12), ("hardware", []), ("peer_id", b"12D3"),
])
def test_wrong_type(field, value):
    body = sample_advert(IDENTITY).to_wire() | {field: value}
    with pytest.raises(errors.WrongType):
        codec.decode(sealed_body(body), NodeAdvert)


@pytest.mark.parametrize("field,value", [
    ("policy_step", -1), ("roles", ["inference", "inference"]), ("roles", ["emperor"]),
    ("run_id", "Bad Run"), ("addrs", ["not-a-multiaddr"]), ("throughput_tokens_per_s", float("nan")),
    ("software_version", "x" * 33),
])
def test_invalid_value(field, value):
    body = sample_advert(IDENTITY).to_wire() | {field: value}
    with pytest.raises(errors.InvalidValue):
        codec.decode(sealed_body(body), NodeAdvert)


def test_nested_record_is_strict_too():
    body = sample_advert(IDENTITY).to_wire()
    body["hardware"]["accelerator"] = "abacus"
    with pytest.raises(errors.InvalidValue, match="accelerator"):
        codec.decode(sealed_body(body), NodeAdvert)


def test_trailing_bytes_after_body_are_malformed():
    body = msgpack.packb(sample_advert(IDENTITY).to_wire(), use_bin_type=True) + b"\xc0"
    data = seal(IDENTITY, "node_advert", 1, body, lifetime_s=60)
    with pytest.raises(errors.MalformedBody):
        codec.decode(data, NodeAdvert)


def test_advert_signed_by_another_key_is_a_signer_mismatch():
    forged = sealed_body(sample_advert(IDENTITY).to_wire(), identity=OTHER)
    with pytest.raises(errors.SignerMismatch):
        codec.decode(forged, NodeAdvert)


def test_tampered_advert_fails_signature():
    data = bytearray(codec.encode(sample_advert(IDENTITY), IDENTITY, lifetime_s=60))
    data[-3] ^= 0x01
    with pytest.raises(errors.BadSignature):
        codec.decode(bytes(data), NodeAdvert)


def test_expired():
    data = codec.encode(sample_advert(IDENTITY), IDENTITY, lifetime_s=10, timestamp_ms=now_ms() - 20_000)
    with pytest.raises(errors.Expired):
        codec.decode(data, NodeAdvert)


def test_timestamp_far_in_the_future():
    data = codec.encode(sample_advert(IDENTITY), IDENTITY, lifetime_s=10, timestamp_ms=now_ms() + 120_000)
    with pytest.raises(errors.FromTheFuture):
        codec.decode(data, NodeAdvert)


def test_lifetime_longer_than_the_type_allows():
    data = sealed_body(sample_advert(IDENTITY).to_wire(), lifetime_s=NodeAdvert.MAX_LIFETIME_S * 2)
    with pytest.raises(errors.BadLifetime):
        codec.decode(data, NodeAdvert)


def test_domain_separation_a_signature_over_the_bare_payload_does_not_verify():
    data = codec.encode(sample_advert(IDENTITY), IDENTITY, lifetime_s=60)
    payload = data[HEADER_SIZE:]
    bare = MAGIC + IDENTITY.public_key + IDENTITY.sign(payload) + payload
    with pytest.raises(errors.BadSignature):
        codec.decode(bare, NodeAdvert)
    assert DOMAIN.endswith(b"\x00")


def test_encoder_refuses_what_receivers_reject():
    with pytest.raises(ValueError):
        codec.encode(sample_advert(IDENTITY), IDENTITY, lifetime_s=NodeAdvert.MAX_LIFETIME_S + 1)
    with pytest.raises(errors.SignerMismatch):
        codec.encode(sample_advert(IDENTITY), OTHER, lifetime_s=60)


hardware_strategy = st.builds(
    Hardware,
    accelerator=st.sampled_from(sorted(ACCELERATORS)),
    accelerator_name=st.text(max_size=128),
    accelerator_count=st.integers(0, 1024),
    accelerator_memory_bytes=st.integers(0, 2**50),
    cpu_cores=st.integers(1, 65536),
    ram_bytes=st.integers(0, 2**50),
    disk_free_bytes=st.integers(0, 2**50),
)
advert_changes = st.fixed_dictionaries({
    "run_id": st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True),
    "roles": st.lists(st.sampled_from(sorted(ROLES)), unique=True).map(tuple),
    "addrs": st.lists(st.from_regex(r"/ip4/127\.0\.0\.1/tcp/[0-9]{1,5}", fullmatch=True), unique=True,
                      max_size=4).map(tuple),
    "hardware": hardware_strategy,
    "throughput_tokens_per_s": st.none() | st.floats(0, 1e12, allow_nan=False),
    "policy_step": st.none() | st.integers(0, 2**40),
})


@settings(max_examples=150, deadline=None)
@given(advert_changes)
def test_property_round_trip(changes):
    advert = sample_advert(IDENTITY, **changes)
    assert codec.decode(codec.encode(advert, IDENTITY, lifetime_s=30), NodeAdvert).message == advert


SIGNED = codec.encode(sample_advert(IDENTITY), IDENTITY, lifetime_s=600)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(SIGNED) - 1), st.integers(1, 255))
def test_property_any_single_byte_change_is_rejected(position, flip):
    data = bytearray(SIGNED)
    data[position] ^= flip
    with pytest.raises(errors.Rejected):
        codec.decode(bytes(data), NodeAdvert)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_property_random_bytes_only_ever_raise_rejected(data):
    with pytest.raises(errors.Rejected):
        codec.decode(data, NodeAdvert)


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text() | st.binary(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20))
def test_property_any_signed_body_only_ever_raises_rejected(body):
    with pytest.raises(errors.Rejected):
        codec.decode(sealed_body(body), NodeAdvert)


def test_fixed_header_layout_matches_spec():
    data = SIGNED
    assert data[:4] == MAGIC
    assert data[4:36] == IDENTITY.public_key
    type_len = data[HEADER_SIZE]
    assert data[HEADER_SIZE + 1 : HEADER_SIZE + 1 + type_len] == b"node_advert"
    version, issued, expiry = struct.unpack_from(">HQQ", data, HEADER_SIZE + 1 + type_len)
    assert version == codec.PROTOCOL_VERSION and expiry - issued == 600_000
