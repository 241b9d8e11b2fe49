import json

from intellect_node.node.swarm.peer_cache import MAX_PEERS, SILENT_REPLACE_S, PeerCache


def test_keeps_only_dialable_addresses_newest_first_and_bounded(tmp_path):
    cache = PeerCache(tmp_path / "peers.json")
    cache.remember("a", ["/ip4/1.1.1.1/tcp/1/p2p/a", "/ip4/1.1.1.1/tcp/2/http"], now=0.0)
    cache.remember("b", ["/ip4/2.2.2.2/tcp/1/http"])  # nothing dialable: not kept
    assert cache.addresses() == ["/ip4/1.1.1.1/tcp/1/p2p/a"]
    later = SILENT_REPLACE_S + 1.0
    for i in range(MAX_PEERS + 5):  # heard long after "a" and each other: each replaces the most silent
        cache.remember(f"p{i}", [f"/ip4/3.3.3.3/tcp/{i}/p2p/p{i}"], now=later * (i + 1))
    assert len(cache.addresses()) == MAX_PEERS
    assert cache.addresses()[0].endswith(f"p{MAX_PEERS + 4}")
    assert not any(addr.endswith("/p2p/a") for addr in cache.addresses())


def test_a_full_cache_keeps_the_members_it_still_hears_from(tmp_path):
    """In a run larger than the cache, re-signings of members outside it must not rotate it (each
    rotation was a durable write); a newcomer takes only the place of a member silent for long."""
    cache = PeerCache(tmp_path / "peers.json")
    for i in range(MAX_PEERS):
        cache.remember(f"p{i}", [f"/ip4/3.3.3.3/tcp/{i}/p2p/p{i}"], now=0.0)
    cache.save()
    kept = cache.addresses()
    for i in range(MAX_PEERS, 3 * MAX_PEERS):  # a 192-member run: the others' adverts keep coming
        cache.remember(f"p{i}", [f"/ip4/3.3.3.3/tcp/{i}/p2p/p{i}"], now=10.0)
    assert cache.addresses() == kept and not cache.dirty
    for i in range(1, MAX_PEERS):  # all but p0 heard from again (a re-signing, same addresses)
        cache.remember(f"p{i}", [f"/ip4/3.3.3.3/tcp/{i}/p2p/p{i}"], now=SILENT_REPLACE_S)
    cache.remember("new", ["/ip4/4.4.4.4/tcp/1/p2p/new"], now=SILENT_REPLACE_S + 1.0)
    assert cache.dirty and len(cache.addresses()) == MAX_PEERS
    assert cache.addresses()[0].endswith("/p2p/new")
    assert not any(addr.endswith("/p2p/p0") for addr in cache.addresses())  # the silent one made room


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
