"""Bans outlive the process: a proven cheat stays banned for the run after a restart."""

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.peer_scores import PeerScores
from tests.support.inprocess_nodes import make_node


def test_bans_are_logged_and_restored(tmp_path):
    log_path = tmp_path / "bans.jsonl"
    heard: list[str] = []
    scores = PeerScores(on_ban=heard.append, ban_log=log_path)
    cheat, flooder, honest = (Identity.generate().peer_id for _ in range(3))
    scores.ban(cheat, "sampling (own verdict)")
    for _ in range(20):
        scores.reject(flooder, "bad_signature")
    scores.reject(honest, "timeout")
    assert heard == [cheat, flooder]
    with open(log_path, "a") as handle:  # a torn last line (a crash mid-append) is skipped
        handle.write('{"peer_id": ')
    again = PeerScores(ban_log=log_path)
    assert again.restore() == 2
    assert again.is_banned(cheat) and again.is_banned(flooder) and not again.is_banned(honest)
    assert PeerScores(ban_log=tmp_path / "absent.jsonl").restore() == 0


def test_a_restarted_node_still_bans(tmp_path):
    cheat = Identity.generate().peer_id
    identity = Identity.generate()
    first = make_node(tmp_path, "node", "bans-test", identity)
    first.scores.ban(cheat, "toploc (own verdict)")
    restarted = make_node(tmp_path, "node", "bans-test", identity)
    assert restarted.scores.is_banned(cheat)
    assert not make_node(tmp_path, "other", "bans-test").scores.banned  # another home: its own bans
