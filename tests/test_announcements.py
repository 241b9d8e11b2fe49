"""The run's announcements topic (node/swarm/announcements.py): every node relays the rollout
announcements of its run, and a receiver (node/rollouts/exchange.py) counts those the node accepted."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from libp2p.peer.id import ID

from intellect_node.crypto.identity import Identity
from intellect_node.node.app.config import NodeConfig
from intellect_node.node.app.roles import RoleOptions, assemble
from intellect_node.protocol import codec
from intellect_node.protocol.rollouts import RolloutAnnouncement
from tests.support.inprocess_nodes import make_node

RUN = "announce-run"


def announcement(worker: Identity, run_id: str = RUN) -> SimpleNamespace:
    note = RolloutAnnouncement(run_id=run_id, worker=worker.peer_id, policy_step=1, batch_digest=bytes(32), groups=1,
                               completions=8)
    return SimpleNamespace(data=codec.encode(note, worker, lifetime_s=60),
                           from_id=ID.from_base58(worker.peer_id).to_bytes())


def topic_validator(node) -> object:  # type: ignore[no-untyped-def]
    """The validator ``Node.run`` installs on the announcements topic, without running the node."""
    validators = {}
    node.announcements.pubsub = SimpleNamespace(set_topic_validator=lambda t, fn, _: validators.__setitem__(t, fn))
    assert node.announcements.install()
    return validators[node.announcements.topic]


def test_a_node_without_services_relays_rollout_announcements_of_its_run_only(tmp_path: Path) -> None:
    node = make_node(tmp_path, "bare", RUN)
    validate, worker = topic_validator(node), Identity.generate()
    forwarder = ID.from_base58(Identity.generate().peer_id)
    assert validate(forwarder, announcement(worker)) is True
    assert validate(forwarder, announcement(worker, run_id="other-run")) is False
    assert node.scores.rejections["invalid_value"] == 1


def test_a_receiver_counts_the_announcements_its_node_accepted(tmp_path: Path) -> None:
    node = make_node(tmp_path, "validator", RUN)
    config = NodeConfig(dataclasses.replace(node.config, run_id=RUN, roles=("validator",)))
    receiver = next(s for s in assemble(node, config, RoleOptions()) if s.name == "rollouts")
    validate, worker = topic_validator(node), Identity.generate()
    forwarder = ID.from_base58(Identity.generate().peer_id)
    assert validate(forwarder, announcement(worker)) and validate(forwarder, announcement(worker))
    assert not validate(forwarder, announcement(worker, run_id="other-run"))
    assert receiver.status()["announced"] == 2
