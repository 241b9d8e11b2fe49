"""SwarmSettings (node/swarm/settings.py): what the swarm reads, checked where it is made."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from intellect_node.node.app.config import NodeConfig
from intellect_node.node.swarm.settings import DEFAULT_LISTEN, SwarmSettings


def test_the_app_config_hands_the_swarm_every_field_it_reads(tmp_path: Path) -> None:
    config = NodeConfig(home=tmp_path, run_id="r", roles=["validator"], bootstrap=["/ip4/1.2.3.4/tcp/1/p2p/x"],
                        heartbeat_s=3.0, relay_max_reservations=0)
    settings = config.swarm()
    for field in dataclasses.fields(SwarmSettings):
        given = getattr(config, field.name)
        assert getattr(settings, field.name) == (tuple(given) if isinstance(given, list) else given), field.name
    assert settings.listen_defaulted and settings.listen == DEFAULT_LISTEN
    assert settings.layout.peer_cache == config.layout.peer_cache


@pytest.mark.parametrize(("change", "error", "names"), [
    ({"listen": ["/ip4/0.0.0.0/tcp/1"]}, TypeError, "listen"),  # a list could be changed under the node
    ({"new_swarm": 1}, TypeError, "new_swarm"),
    ({"relay_circuit_bytes": True}, TypeError, "relay_circuit_bytes"),
    ({"heartbeat_s": "10"}, TypeError, "heartbeat_s"),
    ({"advert_refresh_s": 0.0}, ValueError, "advert_refresh_s"),
    ({"relay_max_reservations": -1}, ValueError, "relay_max_reservations"),
])
def test_a_wrong_value_fails_where_it_is_made(tmp_path: Path, change: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        SwarmSettings(home=tmp_path, run_id="r", **change)


def test_settings_cannot_change_under_a_running_node(tmp_path: Path) -> None:
    settings = SwarmSettings(home=tmp_path, run_id="r")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.run_id = "other"  # type: ignore[misc]
