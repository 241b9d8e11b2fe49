"""SwarmSettings (node/swarm/settings.py): what the swarm reads, checked where it is made."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from intellect_node.node.app.config import APP_SWARM_DEFAULTS, NodeConfig, default_swarm, load_config
from intellect_node.node.config.base import ConfigError
from intellect_node.node.swarm.settings import DEFAULT_LISTEN, SwarmSettings


def _changed(name: str, default: object) -> object:
    """A value of the field's type other than its default, within every bound SwarmSettings checks
    when the other fields keep their defaults."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default + 1
    if isinstance(default, str):
        return default + "-changed"
    if isinstance(default, tuple):
        return ("/ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/2")
    raise AssertionError(f"{name}: teach this test a value of type {type(default).__name__}")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(list(value)) if isinstance(value, tuple) else repr(value)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(value) if isinstance(value, tuple) else str(value)


# every field but home, which the file cannot move (it lives there) and the environment sets first
KNOBS = [f for f in dataclasses.fields(SwarmSettings) if f.name != "home"]


@pytest.mark.parametrize("field", KNOBS, ids=lambda f: f.name)
def test_a_swarm_knob_is_one_field_the_file_and_environment_reach(tmp_path: Path, field: dataclasses.Field) -> None:
    """Adding a field to SwarmSettings is the whole change: [node] (and top-level keys) and
    INTELLECT_NODE_<KEY> set it by name, and its default is the one written in SwarmSettings (or
    the app's, for the few fields it decides: APP_SWARM_DEFAULTS)."""
    flags = {"home": str(tmp_path)}
    default = APP_SWARM_DEFAULTS.get(field.name, field.default)
    assert getattr(load_config(flags, environ={}).swarm, field.name) == default
    value = _changed(field.name, default)
    for text in (f"[node]\n{field.name} = {_toml(value)}\n", f"{field.name} = {_toml(value)}\n"):
        (tmp_path / "config.toml").write_text(text)
        assert getattr(load_config(flags, environ={}).swarm, field.name) == value
    (tmp_path / "config.toml").unlink()
    environ = {f"INTELLECT_NODE_{field.name.upper()}": _text(value)}
    assert getattr(load_config(flags, environ=environ).swarm, field.name) == value


def test_the_app_decides_who_a_node_is(tmp_path: Path) -> None:
    config = load_config({"home": str(tmp_path)}, environ={})
    assert config.swarm == SwarmSettings(home=tmp_path, **APP_SWARM_DEFAULTS)
    assert (config.home, config.run_id, config.roles) == (tmp_path, "intellect-public", ("inference",))
    assert config.swarm.listen_defaulted and config.swarm.listen == DEFAULT_LISTEN
    assert config.swarm.layout.peer_cache == config.layout.peer_cache
    assert NodeConfig().swarm == default_swarm()


def test_a_bound_the_swarm_refuses_names_the_key_and_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[node]\nmax_inbound = 0\n")
    with pytest.raises(ConfigError, match=r"config\.toml \[node\]: max_inbound"):
        load_config({"home": str(tmp_path)}, environ={})


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
