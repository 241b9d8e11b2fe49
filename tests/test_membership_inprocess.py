"""Membership behaviour that needs a look inside running nodes."""

import trio

from intellect_node.protocol.keys import members_topic
from tests.support.inprocess_nodes import make_node

RUN = "anti-entropy"
TIMING = dict(advert_lifetime_s=4.0, advert_refresh_s=1.0, heartbeat_s=1.0, discovery_s=1.0)


async def test_a_node_that_hears_no_gossip_stays_current_through_anti_entropy(tmp_path, nursery):
    first = make_node(tmp_path, "first", RUN, **TIMING)
    addrs = await nursery.start(first.run)
    second = make_node(tmp_path, "second", RUN, bootstrap=addrs, **TIMING)
    await nursery.start(second.run)
    deaf = make_node(tmp_path, "deaf", RUN, bootstrap=addrs, **TIMING)
    await nursery.start(deaf.run)
    await deaf.pubsub.unsubscribe(members_topic(RUN))  # from now on it hears no heartbeats

    interval, lifetime, refresh = second.adverts.cadence()  # the run's size sets them (specs/dht.md)
    await trio.sleep(lifetime + 3 * interval)  # every advert it held at the start has expired
    known = {m.advert.peer_id for m in deaf.view.members()}
    assert {first.peer_id, second.peer_id} <= known
    newest = max(m.timestamp_ms for m in deaf.view.members() if m.advert.peer_id == second.peer_id)
    # re-signed at the first heartbeat after ``refresh``: deaf's copy is at most one re-signing and
    # one pull behind second's own, with one more re-signing of slack for a loaded machine
    resigned_every_s = interval * -(-refresh // interval)
    behind_ms = second.view.get(second.peer_id).timestamp_ms - newest
    assert behind_ms <= 1000 * (2 * resigned_every_s + TIMING["discovery_s"]), (behind_ms, interval, refresh)
