import subprocess
import sys

import pytest

from intellect_node.node.app.config import load_config
from intellect_node.node.config.base import ConfigError


def test_flags_override_environment_override_file_override_defaults(tmp_path):
    (tmp_path / "config.toml").write_text(
        'run_id = "from-file"\nheartbeat_s = 3.0\nroles = ["trainer"]\nnew_swarm = true\n')
    env = {"INTELLECT_NODE_RUN_ID": "from-env", "INTELLECT_NODE_HEARTBEAT_S": "4"}
    config = load_config({"home": str(tmp_path), "run_id": "from-flag", "roles": None}, environ=env)
    assert config.run_id == "from-flag"
    assert config.swarm.heartbeat_s == 4.0
    assert config.roles == ("trainer",)
    assert config.swarm.new_swarm is True
    assert config.swarm.advert_lifetime_s == 120.0


def test_environment_lists_are_comma_separated(tmp_path):
    env = {"INTELLECT_NODE_HOME": str(tmp_path),
           "INTELLECT_NODE_BOOTSTRAP": "/ip4/1.2.3.4/tcp/1/p2p/x, /ip4/5.6.7.8/tcp/2/p2p/y"}
    assert load_config({}, environ=env).swarm.bootstrap == ("/ip4/1.2.3.4/tcp/1/p2p/x", "/ip4/5.6.7.8/tcp/2/p2p/y")


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


def test_one_file_with_sections(tmp_path):
    from intellect_node.node.config.loader import load_section
    from intellect_node.node.roles.trainer.config import TrainerOptions
    from intellect_node.node.shards.config import ShardConfig

    (tmp_path / "config.toml").write_text(
        '[node]\nheartbeat_s = 3.0\n[run]\nrun_id = "sectioned"\nasync_level = 0\nmax_tokens = 128\ngroup_size = 4\n'
        'temperature = 0.5\n'
        '[shards]\nkeep_steps = 5\n[inference]\nengine = "torch"\n'
        '[trainer]\nbatch_groups = 4\n[trainer.optim]\nlr = 1e-3\n')
    config = load_config({"home": str(tmp_path)}, environ={})
    assert config.run_id == "sectioned" and config.swarm.heartbeat_s == 3.0 and config.run.async_level == 0
    assert (config.run.max_tokens, config.run.group_size, config.run.temperature) == (128, 4, 0.5)
    assert config.sections["inference"] == {"engine": "torch"}
    shards = load_section(ShardConfig, "shards", config.sections["shards"], str(config.config_file), {},
                          environ={"INTELLECT_NODE_SHARDS_DISCOVERY_S": "1.5"}, data_dir=config.layout.shards)
    assert shards.keep_steps == 5 and shards.discovery_s == 1.5 and shards.data_dir == tmp_path / "shards"
    trainer = load_section(TrainerOptions, "trainer", config.sections["trainer"], str(config.config_file),
                           {"batch_groups": None}, {}, model_dir=tmp_path, task_spec="toy:seed=0,count=4",
                           publish_dir=tmp_path)
    assert trainer.batch_groups == 4 and trainer.optim.lr == 1e-3  # [run] async_level: tests/test_join_options.py


@pytest.mark.parametrize("content,match", [
    ("[nodes]\nheartbeat_s = 1\n", r"unknown keys \['nodes'\]"),
    ("[run]\nasync_lvl = 1\n", r"\[run\]: unknown keys \['async_lvl'\]"),
    ("[run]\nasync_level = -1\n", "async_level"),
    ("[run]\nmax_tokens = 0\n", "max_tokens"),
    ("[run]\ngroup_size = 'eight'\n", "group_size"),
    ("[run]\ntemperature = 0\n", "temperature"),
    ("[inference]\nmodle = 'x'\n", r"\[inference\]: unknown keys \['modle'\]"),
    ("[node]\nheartbeat = 1\n", r"unknown keys \['heartbeat'\]"),
])
def test_bad_sections_name_the_key_and_file(tmp_path, content, match):
    (tmp_path / "config.toml").write_text(content)
    with pytest.raises(ConfigError, match=match) as caught:
        load_config({"home": str(tmp_path)}, environ={})
    assert "config.toml" in str(caught.value)


def load_shards(home, table, flags=None, environ=None, source="config file"):
    """``[shards]`` as node/app/join.py loads it: ``data_dir`` fixed under the home."""
    from intellect_node.node.config.loader import load_section
    from intellect_node.node.shards.config import ShardConfig

    return load_section(ShardConfig, "shards", table, source, flags, {} if environ is None else environ,
                        data_dir=home / "shards")


def test_unknown_shards_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"\[shards\]: unknown keys \['shard_mib'\]"):
        load_shards(tmp_path, {"shard_mib": 4})


@pytest.mark.parametrize("table,match", [
    ({"keep_steps": True}, r"cfg.toml \[shards\] keep_steps: True is not a int"),  # int(True) passed before
    ({"stall_s": "10"}, r"\[shards\] stall_s: '10' is not a float"),
    ({"data_dir": "/x"}, r"unknown keys \['data_dir'\]"),
])
def test_shards_values_are_typed_strictly(tmp_path, table, match):
    with pytest.raises(ConfigError, match=match):
        load_shards(tmp_path, table, source="cfg.toml")


@pytest.mark.parametrize("value", ['"16"', "-1", "true", "2.5"])
def test_a_bad_groups_per_step_is_named_before_any_model_is_built(tmp_path, value):
    (tmp_path / "config.toml").write_text(f"[inference]\ngroups_per_step = {value}\n")
    done = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "join", "--role", "inference",
                           "--new-swarm",
                           "--model", "tiny", "--home", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "[inference] groups_per_step" in done.stderr, done.stderr
    assert not (tmp_path / "models").exists()  # refused before the tiny model's two minutes


PAIR = ('worker = "torch"\nvalidator = "torch"\ntoploc_max_exp_mismatches = 8\ntoploc_max_mant_err_mean = 10.0\n'
        'toploc_max_mant_err_median = 8.0\nlogprob_atol = 0.05\nsampling_slack = 0.5\nmargin_noise = 0.01\n')


def test_run_engines_are_the_calibrated_pairs_of_the_file(tmp_path):
    from intellect_node.protocol.run_spec import TORCH_TORCH

    assert load_config({"home": str(tmp_path)}, environ={}).run.engines == (TORCH_TORCH,)
    (tmp_path / "config.toml").write_text(f"[[run.engines]]\n{PAIR}")
    (pair,) = load_config({"home": str(tmp_path)}, environ={}).run.engines
    assert (pair.worker, pair.sampling_slack, pair.margin_noise) == ("torch", 0.5, 0.01)


@pytest.mark.parametrize("tables,match", [
    (f"[[run.engines]]\n{PAIR.replace('sampling_slack = 0.5', 'sampling_slack = 5.0')}", "sampling_slack"),
    (f"[[run.engines]]\n{PAIR.replace('margin_noise = 0.01', '')}", "missing field 'margin_noise'"),
    (f"[[run.engines]]\n{PAIR.replace('torch', 'trt', 1)}", "worker"),
    (f"[[run.engines]]\n{PAIR}[[run.engines]]\n{PAIR}", "one per"),
    ("[run]\nengines = 3\n", r"\[\[run.engines\]\] tables"),
])
def test_bad_engine_pairs_name_the_field(tmp_path, tables, match):
    (tmp_path / "config.toml").write_text(tables)
    with pytest.raises(ConfigError, match=match):
        load_config({"home": str(tmp_path)}, environ={})


@pytest.mark.parametrize("content,match", [
    (b"\xff\xfe run_id = 1\n", "codec can't decode"),
    (b"a = " + b"[" * 50_000 + b"]" * 50_000 + b"\n", "nested too deeply"),
    (b"# padding\n" * 200_000, "larger than 1,048,576 bytes"),  # read no further than the bound
])
def test_hostile_config_files_are_refused_naming_the_file(tmp_path, content, match):
    (tmp_path / "config.toml").write_bytes(content)
    with pytest.raises(ConfigError, match=match) as caught:
        load_config({"home": str(tmp_path)}, environ={})
    assert f"cannot read {tmp_path / 'config.toml'}" in str(caught.value)


def test_a_directory_as_config_file_is_refused(tmp_path):
    (tmp_path / "config.toml").mkdir()
    with pytest.raises(ConfigError, match="Is a directory"):
        load_config({"home": str(tmp_path)}, environ={})


HEAVY_LIBRARIES = ("torch", "transformers", "libp2p", "hivemind", "vllm")
READ_CONFIG = """
import sys
from intellect_node.cli.main import app
try:
    app(["join", "--role", sys.argv[1], "--home", sys.argv[2], "--listen", "/ip4/127.0.0.1/tcp/0"])
except SystemExit as exc:
    print("exit", exc.code)
print("loaded", *sorted(name for name in sys.argv[3:] if name in sys.modules))
"""


@pytest.mark.parametrize("role,section", [("inference", "[inference]\nbogus = 1\n"),
                                          ("validator", "[validator]\nverify_fraction = 2.0\n"),
                                          ("diloco", "[diloco]\nH = 0\n"),
                                          ("diloco", "[diloco]\ndata = \"metagene:seq_len=64\"\n")])
def test_a_config_error_is_reported_before_any_heavy_library_is_imported(tmp_path, role, section):
    """A typo costs a user a second, not the five to seven that importing torch, transformers and
    libp2p took before any line of the config was read (``intellect-node --help`` likewise)."""
    (tmp_path / "config.toml").write_text(section)
    done = subprocess.run([sys.executable, "-c", READ_CONFIG, role, str(tmp_path), *HEAVY_LIBRARIES],
                          capture_output=True, text=True, timeout=60)
    assert "configuration error" in done.stderr and "exit 2" in done.stdout, done.stderr
    assert done.stdout.splitlines()[-1] == "loaded", done.stdout
