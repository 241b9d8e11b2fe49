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

    await trio.sleep(3 * TIMING["advert_lifetime_s"])  # every advert it held at the start has expired
    known = {m.advert.peer_id for m in deaf.view.members()}
    assert {first.peer_id, second.peer_id} <= known
    newest = max(m.timestamp_ms for m in deaf.view.members() if m.advert.peer_id == second.peer_id)
    assert newest >= second.view.get(second.peer_id).timestamp_ms - 2 * 1000 * TIMING["advert_refresh_s"]
