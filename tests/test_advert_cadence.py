"""How often a node re-signs and repeats its advert as the run grows (specs/dht.md, item 2).

A new signing costs every node in the run about 11 RPCs (one from each mesh peer, forwarded to
each), a repeat costs only the origin's mesh: the run's new signings a second must stay flat as it
grows, and no advert may expire before its owner re-signs it, even when the run grew meanwhile.
"""

from pathlib import Path

import pytest
import trio

from intellect_node.crypto.envelope import now_ms
from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.adverts import PROMPT_STEP_GOSSIPS, Advertiser
from intellect_node.node.swarm.membership import MemberView
from intellect_node.node.swarm.settings import SwarmSettings
from intellect_node.protocol import codec
from intellect_node.protocol.messages import NodeAdvert
from tests.support.protocol_samples import CPU_HARDWARE, sample_advert

RUN = "cadence"


def advertiser_among(members: int, **timing) -> Advertiser:
    """An advertiser whose view holds ``members`` members, itself included."""
    view = MemberView(RUN)
    for index in range(members - 1):
        identity = Identity.generate()
        advert = sample_advert(identity, run_id=RUN, addrs=(f"/ip4/10.{index // 250}.{index % 250}.1/tcp/4001",))
        view.accept(codec.encode(advert, identity, lifetime_s=600.0))
    settings = SwarmSettings(home=Path("/nonexistent"), run_id=RUN, **timing)
    advertiser = Advertiser(Identity.generate(), settings, CPU_HARDWARE, view, pubsub=None, dht=None,
                            addresses=lambda extra: ["/ip4/10.255.0.1/tcp/4001", *extra])
    earlier = now_ms() - 1000  # its own signing comes later
    advertiser.view.accept(codec.encode(advertiser.own_advert(), advertiser.identity, lifetime_s=60.0,
                                        timestamp_ms=earlier))
    return advertiser


@pytest.mark.parametrize(("members", "expected"), [
    (5, (10.0, 120.0, 40.0)),  # the configured cadence, as set
    (10, (10.0, 120.0, 40.0)),
    (40, (40.0, 240.0, 160.0)),  # re-signing stretched: 40 members sign 0.25 a second
    (100, (100.0, 600.0, 400.0)),
    (1000, (1000.0, NodeAdvert.MAX_LIFETIME_S, 2400.0)),  # the lifetime's cap: the budget gives
])
def test_the_run_signs_a_flat_number_of_adverts_a_second(members, expected):
    advertiser = advertiser_among(members)
    assert len(advertiser.view.members()) == members
    interval, lifetime, refresh = advertiser.cadence()
    assert (interval, lifetime, refresh) == pytest.approx(expected)
    if 10 <= members <= 600:
        assert members / refresh == pytest.approx(10 / 40.0)  # new signings a second, run-wide
    assert lifetime >= 1.5 * refresh - 1e-9  # a late re-signing still lands before expiry
    assert interval <= refresh  # heartbeats between re-signings are repeats


def test_small_test_timings_are_kept_as_configured():
    timing = dict(advert_lifetime_s=9.0, advert_refresh_s=3.0, heartbeat_s=1.0)
    assert advertiser_among(5, **timing).cadence() == pytest.approx((3.0, 9.0, 3.0))


async def test_a_signing_is_replaced_before_its_own_lifetime_ends_when_the_run_grew():
    advertiser = advertiser_among(10)
    _, lifetime, refresh = advertiser.cadence()
    advertiser.sign(lifetime)
    signed_at = trio.current_time()
    assert signed_at + 0.9 * refresh <= advertiser.resign_due(refresh) <= signed_at + refresh

    grown = advertiser_among(99)  # the run grew tenfold since that signing (to 100 with this node)
    advertiser.view = grown.view
    advertiser.view.accept(advertiser.envelope)
    _, _, grown_refresh = advertiser.cadence()
    assert grown_refresh == pytest.approx(400.0)
    due = advertiser.resign_due(grown_refresh)
    assert due <= signed_at + lifetime / 1.5  # due by the old envelope's lifetime, not the new refresh
    advertiser.sign(advertiser.cadence()[1])
    assert advertiser.resign_due(grown_refresh) >= trio.current_time() + 0.9 * grown_refresh


def gossiped_soon(advertiser: Advertiser, **change) -> bool:
    advertiser._changed = trio.Event()
    advertiser.update(**change)
    return advertiser._changed.is_set()


async def test_a_new_policy_step_is_gossiped_at_once_by_a_few_members_whatever_the_runs_size():
    """Every member's step changes with each checkpoint: gossiped by all, each step cost every node
    about 6 messages sent per member; now about PROMPT_STEP_GOSSIPS members gossip it at once."""
    for members in (10, 100):
        advertiser = advertiser_among(members)
        soon = sum(gossiped_soon(advertiser, policy_step=step) for step in range(1, 1001))
        expected = 1000 * min(1.0, PROMPT_STEP_GOSSIPS / members)
        assert abs(soon - expected) <= 4 * max(1.0, (expected * (1 - expected / 1000)) ** 0.5), (members, soon)
        assert advertiser.signed.policy_step == 1000  # every step signed at once: view and exchanges carry it
        assert advertiser.counts["deferred"] == 1000 - soon


async def test_a_new_address_and_a_trainers_step_are_gossiped_at_once():
    advertiser = advertiser_among(100)
    assert all(gossiped_soon(advertiser, policy_step=1, extra_addr=f"/ip4/10.0.0.{i}/tcp/1/http") for i in range(10))
    trainer = advertiser_among(100, roles=("trainer",))
    assert all(gossiped_soon(trainer, policy_step=step) for step in range(1, 50))
