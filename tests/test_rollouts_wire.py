import dataclasses

import msgpack
import numpy as np
import pytest

from intellect_node.crypto.envelope import seal
from intellect_node.crypto.identity import Identity
from intellect_node.protocol import codec, errors
from intellect_node.protocol.rollouts import (
    RolloutBatch,
    RolloutGroup,
    pack_logprobs,
    pack_tokens,
    proof_count,
    unpack_logprobs,
    unpack_tokens,
)
from tests.support.protocol_samples import SAMPLE_WORKER, sample_advert, sample_batch, sample_completion


def resealed(body: dict) -> bytes:
    return seal(SAMPLE_WORKER, RolloutBatch.TYPE, codec.PROTOCOL_VERSION, msgpack.packb(body, use_bin_type=True),
                lifetime_s=60)


def test_round_trip_and_packed_arrays():
    original = sample_batch()
    decoded = codec.decode(codec.encode(original, SAMPLE_WORKER, lifetime_s=600), RolloutBatch).message
    assert decoded == original
    first = decoded.groups[0].completions[0]
    assert unpack_tokens(first.token_ids).tolist() == list(range(40))
    assert np.allclose(unpack_logprobs(first.logprobs), -0.5)
    assert proof_count(32) == 1 and proof_count(33) == 2 and proof_count(1) == 1


def test_a_batch_signed_by_someone_other_than_the_worker_is_refused():
    with pytest.raises(errors.SignerMismatch):
        codec.decode(resealed(sample_batch(worker=Identity.generate().peer_id).to_wire()), RolloutBatch)


@pytest.mark.parametrize("broken,match", [
    (lambda c: dataclasses.replace(c, token_ids=c.token_ids + b"\x00"), "whole number"),
    (lambda c: dataclasses.replace(c, logprobs=c.logprobs[:-4]), "values for"),
    (lambda c: dataclasses.replace(c, proofs=c.proofs[:-1]), "proofs for"),
    (lambda c: dataclasses.replace(c, proofs=c.proofs + (bytes(258),)), "proofs for"),
    (lambda c: dataclasses.replace(c, logprobs=pack_logprobs([0.5] * c.num_tokens)), "<= 0"),
    (lambda c: dataclasses.replace(c, logprobs=pack_logprobs([float("nan")] * c.num_tokens)), "finite"),
])
def test_inconsistent_completions_are_invalid(broken, match):
    bad = sample_batch(groups=(RolloutGroup(counter=0, task_id="t", length_target=None, prompt_ids=pack_tokens([1]),
                                     completions=(broken(sample_completion(40)),)),))
    with pytest.raises(errors.InvalidValue, match=match):
        codec.decode(resealed(bad.to_wire()), RolloutBatch)


def test_duplicate_counters_empty_groups_and_overlong_completions_are_invalid():
    group = RolloutGroup(counter=5, task_id="t", length_target=None, prompt_ids=pack_tokens([1]),
                         completions=(sample_completion(4),))
    with pytest.raises(errors.InvalidValue, match="twice"):
        codec.decode(resealed(sample_batch(groups=(group, group)).to_wire()), RolloutBatch)
    with pytest.raises(errors.InvalidValue, match="empty group"):
        empty = dataclasses.replace(group, completions=())
        codec.decode(resealed(sample_batch(groups=(empty,)).to_wire()), RolloutBatch)
    with pytest.raises(errors.InvalidValue, match="max_tokens"):
        long = dataclasses.replace(group, completions=(sample_completion(65),))
        codec.decode(resealed(sample_batch(groups=(long,)).to_wire()), RolloutBatch)


def test_malformed_proof_length_is_invalid():
    bad = sample_completion(10, proofs=(bytes(257),))
    body = sample_batch(groups=(RolloutGroup(counter=0, task_id="t", length_target=None, prompt_ids=pack_tokens([1]),
                                      completions=(bad,)),)).to_wire()
    with pytest.raises(errors.InvalidValue):
        codec.decode(resealed(body), RolloutBatch)


def test_a_node_advert_is_not_accepted_where_a_batch_is_expected():
    with pytest.raises(errors.UnknownMessageType):
        codec.decode(codec.encode(sample_advert(SAMPLE_WORKER), SAMPLE_WORKER, lifetime_s=60), RolloutBatch)


def test_announcement_round_trip_and_binding():
    from intellect_node.protocol.rollouts import RolloutAnnouncement

    note = RolloutAnnouncement(run_id="r", worker=SAMPLE_WORKER.peer_id, policy_step=2, batch_digest=bytes(32),
                               groups=4, completions=32)
    assert codec.decode(codec.encode(note, SAMPLE_WORKER, lifetime_s=60), RolloutAnnouncement).message == note
    forged = seal(SAMPLE_WORKER, RolloutAnnouncement.TYPE, codec.PROTOCOL_VERSION, msgpack.packb(
        {**note.to_wire(), "worker": Identity.generate().peer_id}, use_bin_type=True), lifetime_s=60)
    with pytest.raises(errors.SignerMismatch):
        codec.decode(forged, RolloutAnnouncement)
