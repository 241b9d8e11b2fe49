"""``join``'s flags and the config's sections become each role's options in one place
(node/app/join.py): every section has its environment layer, flags win, and mistakes are
``ConfigError``s naming the key before anything is built."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from intellect_node.node.app.config import load_config
from intellect_node.node.app.join import role_options
from intellect_node.node.config.base import ConfigError
from intellect_node.node.config.loader import load_section
from intellect_node.node.metagene.job import MetageneJob
from tests.support.engine_helpers import quick_tiny_model

TASKS = "toy:seed=0,count=4"


def options(home: Path, toml: str, environ: dict[str, str], roles: tuple[str, ...], **flags):
    """The role options of a node in ``home`` with ``toml`` as its config file and ``join``'s ``flags``."""
    (home / "config.toml").write_text(toml)
    said: list[str] = []
    config = load_config({"home": str(home)}, environ={})
    return config, role_options(config, roles, flags, said.append, environ), said


@pytest.fixture
def model_dir() -> Path:
    """A model for the checks made before a node starts (its config, its tokenizer on the tasks)."""
    return quick_tiny_model()


def test_role_sections_layer_file_then_environment_then_flags(tmp_path: Path, model_dir: Path) -> None:
    toml = f'[inference]\nmodel = "{model_dir}"\ntasks = "{TASKS}"\nengine = "auto"\ngroups_per_step = 2\n'
    _, roles, _ = options(tmp_path, toml, {"INTELLECT_NODE_INFERENCE_ENGINE": "torch"}, roles=("inference",))
    inference = roles.inference
    assert (inference.model_dir, inference.engine, inference.groups_per_step) == (model_dir, "torch", 2)
    _, roles, _ = options(tmp_path, toml, {"INTELLECT_NODE_INFERENCE_ENGINE": "torch"}, roles=("inference",),
                          engine="vllm", groups_per_step=0)
    assert (roles.inference.engine, roles.inference.groups_per_step) == ("vllm", 0)


def test_a_validator_reads_its_own_section_and_shares_the_model(tmp_path: Path, model_dir: Path) -> None:
    toml = f'[validator]\nmodel = "{model_dir}"\ntasks = "{TASKS}"\n'
    _, roles, _ = options(tmp_path, toml, {"INTELLECT_NODE_VALIDATOR_VERIFY_FRACTION": "0.25"},
                          roles=("validator",))
    assert roles.validator.model_dir == model_dir and roles.validator.verify_fraction == 0.25
    assert roles.inference is None and roles.trainer is None


def test_trainer_section_environment_sits_between_file_and_flags(tmp_path: Path, model_dir: Path) -> None:
    toml = "[trainer]\nbatch_groups = 4\n[trainer.optim]\nlr = 1e-3\n"
    env = {"INTELLECT_NODE_TRAINER_BATCH_GROUPS": "3"}
    _, roles, _ = options(tmp_path, toml, env, roles=("trainer",), model=str(model_dir), tasks=TASKS)
    assert roles.trainer.batch_groups == 3 and roles.trainer.optim.lr == 1e-3
    _, roles, _ = options(tmp_path, toml, env, roles=("trainer",), model=str(model_dir), tasks=TASKS, batch_groups=5)
    assert roles.trainer.batch_groups == 5
    with pytest.raises(ConfigError, match="batch_groups from environment"):
        options(tmp_path, toml, {"INTELLECT_NODE_TRAINER_BATCH_GROUPS": "many"}, roles=("trainer",),
                model=str(model_dir), tasks=TASKS)


def test_trainer_async_level_is_the_runs_unless_its_section_names_it(tmp_path: Path, model_dir: Path) -> None:
    toml = "[run]\nasync_level = 0\n[trainer.optim]\nlr = 1e-3\nweight_decay = 0.25\n"
    env = {"INTELLECT_NODE_TRAINER_OPTIM_LR": "2e-3"}  # a sub-table's key, by its path
    _, roles, _ = options(tmp_path, toml, env, roles=("trainer",), model=str(model_dir), tasks=TASKS)
    assert roles.trainer.async_level == 0 and (roles.trainer.optim.lr, roles.trainer.optim.weight_decay) == (2e-3, 0.25)
    _, roles, _ = options(tmp_path, toml + "[trainer]\nasync_level = 1\n", {}, roles=("trainer",),
                          model=str(model_dir), tasks=TASKS)
    assert roles.trainer.async_level == 1


def test_diloco_section_reads_the_environment(tmp_path: Path) -> None:
    _, roles, _ = options(tmp_path, "[diloco]\nH = 20\n", {"INTELLECT_NODE_DILOCO_H": "7"}, roles=("diloco",))
    assert roles.diloco.H == 7
    with pytest.raises(ConfigError, match=r"\[diloco\] H"):
        options(tmp_path, "", {"INTELLECT_NODE_DILOCO_H": "0"}, roles=("diloco",))


def test_metagene_section_reads_the_environment_under_the_flags(tmp_path: Path) -> None:
    section = {"reads": ["/data/a.fastq"], "min_length": 50}
    env = {"INTELLECT_NODE_METAGENE_MIN_LENGTH": "10", "INTELLECT_NODE_METAGENE_READS": "/data/b.fastq,/data/c.fastq"}
    job = load_section(MetageneJob, "metagene", section, "cfg.toml", {}, env)
    assert job.min_length == 10 and job.reads == ("/data/b.fastq", "/data/c.fastq")
    job = load_section(MetageneJob, "metagene", section, "cfg.toml", {"reads": ("/data/d.fastq",), "tokenizer": "/tok"},
                       env)
    assert job.reads == ("/data/d.fastq",) and job.tokenizer == "/tok"
    with pytest.raises(ConfigError, match=r"cfg.toml: the metagene workload needs reads: --reads PATH\|DIR\|GLOB"):
        load_section(MetageneJob, "metagene", {}, "cfg.toml", {}, {})


@pytest.mark.parametrize("flags,match", [
    ({"roles": ("inference",), "model": "tiny", "tasks": "nonsense:x"}, "--tasks"),
    ({"roles": ("inference",), "model": "/no/such/model", "tasks": TASKS}, "not an HF-layout model directory"),
    ({"roles": ("inference",), "model": "tiny", "engine": "torch:fp8"}, "--engine: .*unknown precision"),
    ({"roles": ("inference",), "model": "tiny", "groups_per_step": -1}, r"\[inference\] groups_per_step"),
    ({"roles": ("inference",), "workload": "metagene"}, "are for --role diloco"),
    ({"roles": ("diloco",), "workload": "rl"}, "unknown workload 'rl'"),
    ({"roles": ("diloco",), "reads": ("/a.fastq",)}, "go with --workload metagene"),
    ({"roles": ("diloco",), "workload": "metagene", "data": "generated:sequences=8"}, "drop --data"),
    ({"roles": ("diloco",), "workload": "metagene"}, "needs reads"),
])
def test_mistakes_are_named_before_anything_is_built(tmp_path: Path, flags: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        options(tmp_path, "", {}, **flags)
    assert not (tmp_path / "models").exists()  # the tiny model was never started


def test_async_level_flag_is_run_wide(tmp_path: Path, model_dir: Path) -> None:
    config, roles, said = options(tmp_path, "[run]\nasync_level = 2\n", {}, roles=("inference", "trainer"),
                                  model=str(model_dir), tasks=TASKS, async_level=0)
    assert config.run.async_level == 0 and roles.trainer.async_level == 0 and roles.inference is not None
    assert said == []


def test_roles_without_a_model_relay_and_say_so(tmp_path: Path) -> None:
    _, roles, said = options(tmp_path, "", {}, roles=("inference", "trainer"))
    assert roles.inference is None and roles.trainer is None and roles.shards is not None
    assert any("generates no rollouts" in line for line in said) and any("trains nothing" in line for line in said)


def test_run_section_reads_the_environment(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[run]\nasync_level = 2\nmax_tokens = 32\n")
    config = load_config({"home": str(tmp_path)}, environ={"INTELLECT_NODE_RUN_ASYNC_LEVEL": "0"})
    assert (config.run.async_level, config.run.max_tokens) == (0, 32)
    with pytest.raises(ConfigError, match="group_size from environment"):
        load_config({"home": str(tmp_path)}, environ={"INTELLECT_NODE_RUN_GROUP_SIZE": "eight"})


def test_tasks_whose_prompts_leave_no_room_for_a_completion_are_refused_before_the_node_starts(
        tmp_path: Path, model_dir: Path) -> None:
    """A worker cannot choose its tasks: one it cannot generate would come back after every restart."""
    long_tasks = "math:seed=3,count=64"  # word problems: some prompts pass 192 of the tiny model's 256 positions
    for roles in (("inference",), ("validator",), ("trainer",)):
        with pytest.raises(ConfigError, match=r"prompts leave fewer than \[run\] max_tokens = 64 of the model's 256"):
            options(tmp_path, "", {}, roles=roles, model=str(model_dir), tasks=long_tasks)
    # with room for the completions they are taken
    _, roles, _ = options(tmp_path, "[run]\nmax_tokens = 16\n", {}, roles=("inference",), model=str(model_dir),
                          tasks=long_tasks)
    assert roles.inference.task_spec == long_tasks


def _huge_config(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"vocab_size": 10**12, "hidden_size": 10**6}))


def _header(model: Path, header: bytes, length: int | None = None) -> None:
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header) if length is None else length) + header)


HOSTILE_MODELS = {  # what is done to a good model directory, and the error that must name it
    "config_not_utf8": (lambda m: (m / "config.json").write_bytes(b"\xff\xfe"), "config.json: 'utf-8' codec"),
    "config_nested": (lambda m: (m / "config.json").write_text("[" * 10_000 + "]" * 10_000),
                      "config.json: JSON nested too deeply"),
    "config_a_list": (lambda m: (m / "config.json").write_text("[1]"), "config.json: not an HF config"),
    "config_wrong_type": (lambda m: (m / "config.json").write_text(
        (m / "config.json").read_text().replace('"vocab_size": 309', '"vocab_size": "big"')),
        "config.json: cannot load the config"),
    "config_terabytes": (_huge_config, "config.json: describes 1,000,0"),
    "config_a_directory": (lambda m: ((m / "config.json").unlink(), (m / "config.json").mkdir()),
                           "config.json: .*Is a directory"),
    "safetensors_huge_header": (lambda m: _header(m, b"{}", 1 << 62), "model.safetensors: not a readable"),
    "safetensors_offsets_out_of_range": (lambda m: _header(m, json.dumps({"w": {
        "dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}}).encode()),
        "model.safetensors: not a readable"),
    "safetensors_truncated": (lambda m: (m / "model.safetensors").write_bytes(
        (m / "model.safetensors").read_bytes()[:1000]), "model.safetensors: not a readable"),
    "no_weights": (lambda m: (m / "model.safetensors").unlink(), "no safetensors weights"),
    "tokenizer_garbage": (lambda m: (m / "tokenizer.json").write_bytes(b"\xb6" * 64), "cannot load the tokenizer"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_MODELS))
def test_a_hostile_model_directory_is_named_before_the_node_starts(tmp_path: Path, model_dir: Path,
                                                                    name: str) -> None:
    """Found later, in the running node, a bad model is a role restarting forever (or terabytes
    allocated for a config its weights do not back)."""
    spoil, match = HOSTILE_MODELS[name]
    model = shutil.copytree(model_dir, tmp_path / "model")
    spoil(model)
    with pytest.raises(ConfigError, match=match) as caught:
        options(tmp_path, "", {}, roles=("validator",), model=str(model), tasks=TASKS)
    assert str(model) in str(caught.value)


@pytest.mark.parametrize("content", [b"\xff\xfe", b"[" * 10_000 + b"]" * 10_000, b'{"reads": "many"}'])
def test_a_hostile_metagene_store_is_a_configuration_error(tmp_path: Path, content: bytes) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "reads.json").write_bytes(content)
    with pytest.raises(ConfigError, match=r"store/reads.json: not a store's reads.json"):
        options(tmp_path, "", {}, roles=("diloco",), data=f"metagene:store={store}", model="tiny")
