"""`intellect-node doctor`: each check's OK and FAIL path, on real files, sockets and nodes."""

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from intellect_node.crypto.identity import Identity, save_identity
from intellect_node.node.app.doctor import (
    FAIL,
    OK,
    WARN,
    check_config,
    check_disk,
    check_gpu,
    check_identity,
    check_listen,
    check_peers,
    check_reachability,
    check_sandbox,
    dialback_check,
    skew_check,
)
from tests.support.inprocess_nodes import make_node


def test_config_parses_or_fails_naming_the_key(tmp_path):
    assert check_config({"home": tmp_path}, None)[0].level == OK
    (tmp_path / "config.toml").write_text("[node]\nno_such_key = 1\n")
    check, config = check_config({"home": tmp_path}, None)
    assert check.level == FAIL and "no_such_key" in check.detail
    assert config.home == tmp_path  # the other checks still look at the right home


def test_identity_missing_is_fine_readable_by_others_fails(tmp_path):
    key = tmp_path / "identity.key"
    assert check_identity(key).level == OK and "created" in check_identity(key).detail
    identity = Identity.generate()
    save_identity(identity, key)
    assert check_identity(key).level == OK and identity.peer_id in check_identity(key).detail
    key.chmod(0o644)
    check = check_identity(key)
    assert check.level == FAIL and "chmod 600" in check.fix


def test_listen_port_free_or_held():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        assert check_listen([f"/ip4/127.0.0.1/tcp/{port}"]).level == FAIL
    assert check_listen([f"/ip4/127.0.0.1/tcp/{port}"]).level == OK


def test_reachability_from_the_addresses_a_node_would_advertise():
    assert check_reachability(["/ip4/9.9.9.9/tcp/4001"]).level == OK
    loopback = check_reachability(["/ip4/127.0.0.1/tcp/4001"])
    assert loopback.level == WARN and "loopback" in loopback.detail
    private = check_reachability(["/ip4/10.1.2.3/tcp/4001"])
    assert private.level == WARN and "NAT" in private.detail and "forward" in private.fix


def test_disk_thresholds(tmp_path):
    assert check_disk(tmp_path / "not" / "yet", fail_below=1, warn_below=1).level == OK
    assert check_disk(tmp_path, fail_below=2**62).level == FAIL


def test_gpu_and_engine_are_reported_never_fatal_without_a_gpu():
    import torch

    gpu, engine = check_gpu()
    assert gpu.level == (OK if torch.cuda.is_available() else WARN)
    assert engine.name == "engine" and engine.level in (OK, WARN)


@pytest.mark.parametrize("installed, level, says", [
    (None, WARN, "vllm not installed: the torch engine generates (slower)"),
    ("0.33.0", WARN, "vllm 0.33.0 installed; the vLLM engine was run on 0.26.0 only"),
    ("0.26.0", OK, "vllm 0.26.0 installed"),
])
def test_vllm_is_checked_by_its_version_without_importing_it(monkeypatch, installed, level, says):
    from intellect_node.node.app import doctor

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name != "vllm":
            return real_find_spec(name, *args)
        return object() if installed else None

    monkeypatch.setattr(doctor.importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(doctor.importlib.metadata, "version", lambda name: installed)
    check = doctor.check_vllm()
    assert (check.level, check.detail) == (level, says)
    if level == WARN:
        assert "intellect-node[gpu]" in check.fix and "0.26.0" in check.fix


def test_the_gpu_extra_pins_the_vllm_the_engine_was_run_on():
    from intellect_node.node.engine import TESTED_VLLM

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["gpu"] == [f"vllm=={TESTED_VLLM}"]


def test_clock_skew_levels():
    assert skew_check("p", 1.0).level == OK
    assert skew_check("p", 10.0).level == WARN
    assert skew_check("p", 60.0).level == FAIL  # its adverts would be refused as from the future
    assert skew_check("p", -200.0, lifetime_s=120.0).level == FAIL  # every advert looks expired to us


async def test_a_live_bootstrap_peer_answers_and_gives_the_clock(tmp_path, nursery):
    node = make_node(tmp_path, "boot", "doctor-test")
    addrs = await nursery.start(node.run)
    checks = await check_peers(addrs[:1], timeout_s=5.0)
    assert [c.level for c in checks if c.name == "bootstrap"] == [OK]
    clock = next(c for c in checks if c.name == "clock")
    assert clock.level == OK and node.peer_id in clock.detail


async def test_an_unreachable_bootstrap_peer_fails_with_the_reason():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    checks = await check_peers([f"/ip4/127.0.0.1/tcp/{port}/p2p/{Identity.generate().peer_id}"], timeout_s=2.0)
    bootstrap = [c for c in checks if c.name == "bootstrap"]
    assert len(bootstrap) == 1 and bootstrap[0].level == FAIL and "refused" in bootstrap[0].detail
    assert (await check_peers([]))[0].level == WARN


def test_cli_json_and_exit_status(tmp_path):
    (tmp_path / "config.toml").write_text("bootstrap = 3\n")  # not a list: a config FAIL
    result = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "doctor", "--home", str(tmp_path),
                             "--listen", "/ip4/127.0.0.1/tcp/0", "--json"], check=False, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["config"]["level"] == FAIL and "bootstrap" in checks["config"]["detail"]
    assert {"identity", "listen port", "reachability", "disk", "gpu", "engine", "bootstrap"} <= set(checks)


async def test_a_bootstrap_peer_dials_the_machine_back(tmp_path, nursery):
    """The dial-back check: a live peer reaches a listening port (OK, with the IP it saw); the
    verdict for a port nobody can reach names NAT and what the node does about it."""
    node = make_node(tmp_path, "boot", "doctor-test")
    addrs = await nursery.start(node.run)
    checks = await check_peers(addrs[:1], timeout_s=5.0)
    dialback = next(c for c in checks if c.name == "dial-back")
    assert dialback.level == OK and "127.0.0.1" in dialback.detail and node.peer_id in dialback.detail
    nated = dialback_check(node.peer_id, False, "203.0.113.9", 4001)
    assert nated.level == WARN and "relay" in nated.detail and "4001" in nated.fix


def test_sandbox_check_runs_a_program_or_says_how_to_get_bubblewrap(tmp_path, monkeypatch):
    if shutil.which("bwrap") is not None:
        check = check_sandbox()
        assert check.level == OK and "program ran" in check.detail, check
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # this machine before `apt-get install bubblewrap`
    check = check_sandbox()
    assert check.level == WARN and "humaneval" in check.detail and "bwrap" in check.detail
    assert "apt-get install -y bubblewrap" in check.fix and "user namespaces" in check.fix
    monkeypatch.undo()
    check_sandbox()  # probe again with the real PATH: nothing of the test's stays cached
