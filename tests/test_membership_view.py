import pytest

from intellect_node.crypto.envelope import now_ms
from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.membership import AdvertRecordValidator, MemberView
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec, errors
from intellect_node.protocol.keys import advert_key
from tests.support.protocol_samples import sample_advert

ALICE = Identity.generate()


def advert_at(timestamp_ms: int, lifetime_s: float = 60, **changes) -> bytes:
    return codec.encode(sample_advert(ALICE, run_id="r", **changes), ALICE, lifetime_s=lifetime_s,
                        timestamp_ms=timestamp_ms)


def test_newer_advert_replaces_older_and_an_older_one_is_a_replay():
    view = MemberView("r")
    t = now_ms()
    assert view.accept(advert_at(t - 2000, policy_step=1)) is not None
    assert view.accept(advert_at(t - 1000, policy_step=2)).advert.policy_step == 2
    with pytest.raises(errors.Replayed):
        view.accept(advert_at(t - 2000, policy_step=1))
    assert view.get(ALICE.peer_id).advert.policy_step == 2


def test_the_same_envelope_again_is_a_quiet_duplicate():
    view = MemberView("r")
    data = advert_at(now_ms())
    assert view.accept(data) is not None
    assert view.accept(data) is None


def test_another_runs_advert_is_refused():
    view = MemberView("other-run")
    with pytest.raises(errors.InvalidValue, match="run"):
        view.accept(advert_at(now_ms()))


def test_expired_members_are_pruned():
    view = MemberView("r")
    t = now_ms()
    view.accept(advert_at(t, lifetime_s=5), now=t)
    assert [m.advert.peer_id for m in view.members(now=t + 4000)] == [ALICE.peer_id]
    assert view.prune(now=t + 5001) == [ALICE.peer_id]
    assert view.members(now=t + 5001) == []


def test_dht_validator_requires_the_advert_under_its_own_key_and_selects_newest():
    scores = PeerScores()
    validator = AdvertRecordValidator(scores)
    t = now_ms()
    old, new = advert_at(t - 5000), advert_at(t - 1000)
    key = advert_key("r", ALICE.peer_id)
    validator.validate(key, new)
    with pytest.raises(ValueError, match="invalid_value"):
        validator.validate(advert_key("r", Identity.generate().peer_id), new)
    with pytest.raises(ValueError, match="malformed"):
        validator.validate(key, b"junk")
    assert validator.select(key, [old, b"junk", new]) == 2
    assert scores.rejections == {"invalid_value": 1, "malformed": 1}


def test_penalties_ban_at_threshold_and_decay():
    banned = []
    scores = PeerScores(ban_threshold=100, half_life_s=10, on_ban=banned.append)
    scores.reject("p", "bad_signature")
    assert not scores.is_banned("p")
    scores.reject("p", "bad_signature")
    assert scores.is_banned("p") and banned == ["p"]
    scores.reject("q", "timeout")
    assert scores.penalty("q", now=scores._penalty["q"][1] + 10) == pytest.approx(2.5)
    scores.reject(None, "malformed")
    assert scores.rejections["malformed"] == 1


def test_stale_messages_from_honest_relays_are_counted_but_never_ban():
    scores = PeerScores(ban_threshold=100)
    for _ in range(1000):
        scores.reject("relay", "expired")
        scores.reject("relay", "replayed")
    assert not scores.is_banned("relay")
    assert scores.rejections == {"expired": 1000, "replayed": 1000}
