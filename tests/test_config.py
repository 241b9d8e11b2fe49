import pytest

from intellect_node.node.app.config import ConfigError, load_config


def test_flags_override_environment_override_file_override_defaults(tmp_path):
    (tmp_path / "config.toml").write_text('run_id = "from-file"\nheartbeat_s = 3.0\nroles = ["trainer"]\nnew_swarm = true\n')
    env = {"INTELLECT_NODE_RUN_ID": "from-env", "INTELLECT_NODE_HEARTBEAT_S": "4"}
    config = load_config({"home": str(tmp_path), "run_id": "from-flag", "roles": None}, environ=env)
    assert config.run_id == "from-flag"
    assert config.heartbeat_s == 4.0
    assert config.roles == ["trainer"]
    assert config.new_swarm is True
    assert config.advert_lifetime_s == 120.0


def test_environment_lists_are_comma_separated(tmp_path):
    env = {"INTELLECT_NODE_HOME": str(tmp_path), "INTELLECT_NODE_BOOTSTRAP": "/ip4/1.2.3.4/tcp/1/p2p/x, /ip4/5.6.7.8/tcp/2/p2p/y"}
    assert load_config({}, environ=env).bootstrap == ["/ip4/1.2.3.4/tcp/1/p2p/x", "/ip4/5.6.7.8/tcp/2/p2p/y"]


@pytest.mark.parametrize("content,match", [
    ("bogus = 1\n", "unknown keys"),
    ("heartbeat_s = 'fast'\n", "heartbeat_s"),
    ("new_swarm = 'maybe'\n", "new_swarm"),
    ("advert_lifetime_s = 10.0\nadvert_refresh_s = 20.0\n", "advert_refresh_s"),
    ("not toml [", "cannot read"),
])
def test_bad_config_is_a_clear_error(tmp_path, content, match):
    (tmp_path / "config.toml").write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_config({"home": str(tmp_path)}, environ={})


def test_missing_explicit_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config({"home": str(tmp_path)}, config_file=tmp_path / "nope.toml", environ={})
