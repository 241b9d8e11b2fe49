import json

from intellect_node.node.swarm.peer_cache import MAX_PEERS, PeerCache


def test_keeps_only_dialable_addresses_newest_first_and_bounded(tmp_path):
    cache = PeerCache(tmp_path / "peers.json")
    cache.remember("a", ["/ip4/1.1.1.1/tcp/1/p2p/a", "/ip4/1.1.1.1/tcp/2/http"])
    cache.remember("b", ["/ip4/2.2.2.2/tcp/1/http"])  # nothing dialable: not kept
    assert cache.addresses() == ["/ip4/1.1.1.1/tcp/1/p2p/a"]
    for i in range(MAX_PEERS + 5):
        cache.remember(f"p{i}", [f"/ip4/3.3.3.3/tcp/{i}/p2p/p{i}"])
    assert len(cache.addresses()) == MAX_PEERS
    assert cache.addresses()[0].endswith(f"p{MAX_PEERS + 4}")


def test_unchanged_addresses_do_not_dirty_the_cache(tmp_path):
    cache = PeerCache(tmp_path / "peers.json")
    cache.remember("a", ["/ip4/1.1.1.1/tcp/1/p2p/a"])
    cache.save()
    cache.remember("a", ["/ip4/1.1.1.1/tcp/1/p2p/a"])
    assert not cache.dirty
    cache.remember("a", ["/ip4/1.1.1.1/tcp/9/p2p/a"])
    assert cache.dirty


def test_survives_a_reload_and_ignores_a_corrupt_file(tmp_path):
    cache = PeerCache(tmp_path / "peers.json")
    cache.remember("a", ["/ip4/1.1.1.1/tcp/1/p2p/a"])
    cache.save()
    assert PeerCache(tmp_path / "peers.json").addresses() == ["/ip4/1.1.1.1/tcp/1/p2p/a"]
    (tmp_path / "peers.json").write_text("{not json")
    assert PeerCache(tmp_path / "peers.json").addresses() == []
    (tmp_path / "peers.json").write_text(json.dumps({"a": "not a list", "b": [1, 2]}))
    assert PeerCache(tmp_path / "peers.json").addresses() == []


def test_ignores_a_deeply_nested_or_oversize_file(tmp_path):
    path = tmp_path / "peers.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert PeerCache(path).addresses() == []
    with open(path, "wb") as handle:  # sparse: a gigabyte the cache must not read
        handle.truncate(1 << 30)
    assert PeerCache(path).addresses() == []
