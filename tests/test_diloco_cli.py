"""``join --role diloco`` refuses a bad ``[diloco]`` section, or a run spec that fails its
signature checks, before starting anything, naming the file and the key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from intellect_node.node.diloco.run_spec import RunSpecError, sign_run_spec, with_run_spec
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.protocol.errors import InvalidValue
from tests.support.diloco_helpers import identity

MEMBER = identity("member")


def _join(home, config: str) -> subprocess.CompletedProcess[str]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(config)
    return subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "join", "--role", "diloco", "--new-swarm",
                           "--home", str(home), "--listen", "/ip4/127.0.0.1/tcp/0"],
                          capture_output=True, text=True, timeout=60)


def test_bad_diloco_section_is_a_clear_error(tmp_path) -> None:
    done = _join(tmp_path / "a", "[diloco]\nH = 0\n")
    assert done.returncode == 2 and "H = 0 is out of bounds" in done.stderr and "config.toml" in done.stderr
    done = _join(tmp_path / "b", "[diloco]\ncompresion = \"int8\"\n")
    assert done.returncode == 2 and "unknown keys ['compresion']" in done.stderr


def test_run_spec_signed_by_the_owner_sets_the_allowlist_and_a_bad_signature_is_a_clear_error(tmp_path) -> None:
    owner = tmp_path / "owner"
    signed = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", "diloco-spec", "--home", str(owner),
                             "--allow", MEMBER.peer_id, "--out", str(tmp_path / "spec.ine")],
                            capture_output=True, text=True, timeout=60)
    assert signed.returncode == 0, signed.stderr
    authority = signed.stdout.strip()
    spec = (tmp_path / "spec.ine").read_bytes()
    settings = with_run_spec(DilocoSettings(run_spec="spec.ine", authority=authority), "intellect-public", tmp_path)
    assert settings.allowlist == (MEMBER.peer_id,)

    tampered = bytearray(spec)
    tampered[-1] ^= 1  # the signature's last byte
    (tmp_path / "bad.ine").write_bytes(bytes(tampered))
    done = _join(tmp_path / "a", f'[diloco]\nrun_spec = "{tmp_path / "bad.ine"}"\nauthority = "{authority}"\n')
    assert done.returncode == 2 and "bad.ine refused (bad_signature)" in done.stderr, done.stderr
    stranger = MEMBER.peer_id  # a valid spec, but not signed by the authority this node trusts
    with pytest.raises(RunSpecError, match="refused \\(signer_mismatch\\)"):
        with_run_spec(DilocoSettings(run_spec="spec.ine", authority=stranger), "intellect-public", tmp_path)
    with pytest.raises(RunSpecError, match="refused \\(invalid_value\\).*not 'another-run'"):
        with_run_spec(DilocoSettings(run_spec="spec.ine", authority=authority), "another-run", tmp_path)
    with pytest.raises(RunSpecError, match="both set"):
        with_run_spec(DilocoSettings(run_spec="spec.ine", authority=authority, allowlist=(authority,)),
                      "intellect-public", tmp_path)
    with pytest.raises(ValueError, match="run_spec and authority go together"):
        DilocoSettings(run_spec="spec.ine")
    with pytest.raises(InvalidValue, match=r"allowlist\[0\]: 'bogus' does not match"):
        sign_run_spec(MEMBER, "intellect-public", ("bogus",), 600)  # the owner learns before its nodes do
