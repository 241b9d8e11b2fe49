"""A light member (``join --role seeder``) between real processes: it joins with no model, is seen
in the view with its role, holds the trainer's checkpoint through the overlay, and serves it to a
fetcher that joins after the trainer has gone, so the seeder is the only node that can."""

import pytest

from tests.support.shards_swarm import ShardSwarm, file_sha256, holds, shard_status

CONVERGENCE_BOUND_S = 60.0  # about a second on an idle machine; room for a loaded CI one
FETCH_BOUND_S = 120.0


def roles_seen(node, peer_id: str) -> list[str] | None:
    for member in node.status_or_empty().get("members", []):
        if member["peer_id"] == peer_id:
            return member["roles"]
    return None


@pytest.mark.slow
def test_seeder_joins_is_seen_and_serves_the_checkpoint_to_a_later_fetcher(tmp_path):
    shards = ShardSwarm(tmp_path, "light-member", {})
    swarm = shards.swarm
    try:
        origin = shards.start_origin()
        seeder = swarm.start("seeder", ["join", "--role", "seeder", "--bootstrap", origin.addr,
                                        "--trainer", origin.peer_id])
        swarm.wait_until(lambda: roles_seen(origin, seeder.peer_id) == ["seeder"], CONVERGENCE_BOUND_S)

        digest = shards.publish(1, 1, seed=7)
        swarm.wait_until(lambda: holds(seeder, 1), FETCH_BOUND_S)
        assert file_sha256(seeder, 1) == digest
        swarm.stop("origin")  # from here on only the seeder holds step 1

        fetcher = swarm.start("fetcher", ["join", "--role", "inference", "--bootstrap", seeder.addr,
                                          "--trainer", origin.peer_id])
        swarm.wait_until(lambda: roles_seen(fetcher, seeder.peer_id) == ["seeder"], CONVERGENCE_BOUND_S)
        swarm.wait_until(lambda: holds(fetcher, 1), FETCH_BOUND_S)
        assert file_sha256(fetcher, 1) == digest
        served = shard_status(seeder)
        assert served["uploaded_bytes"] >= served["steps"]["1"]["total_size"], served["uploaded_bytes"]
        assert set(seeder.status()["services"]) == {"shards"}  # the overlay is its whole job
    finally:
        swarm.stop_all()
