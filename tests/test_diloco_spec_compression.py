"""The compression a DiLoCo run uses is in its signed spec (specs/run_spec.md, ``diloco_run_spec``):
signed by the owner, carried into the settings the role runs, and refused wherever it is unknown,
missing, or contradicts a node's own ``[diloco] compression``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from typer.testing import CliRunner

from intellect_node.cli.main import app
from intellect_node.crypto.envelope import seal
from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco import compressions
from intellect_node.node.diloco.run_spec import RunSpecError, sign_run_spec, with_run_spec
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue
from intellect_node.protocol.run_spec import DILOCO_COMPRESSIONS, DilocoRunSpec

OWNER = Identity.generate()
MEMBER = Identity.generate()
RUN = "spec-run"


def _node(**overrides: Any) -> DilocoSettings:
    """A node of the run whose ``[diloco]`` names the spec file ``spec.ine`` and trusts OWNER."""
    return DilocoSettings(run_spec="spec.ine", authority=OWNER.peer_id, **overrides)


def _write_spec(tmp_path: Path, compression: str) -> Path:
    path = tmp_path / "spec.ine"
    path.write_bytes(sign_run_spec(OWNER, RUN, (MEMBER.peer_id,), 600, compression=compression))
    return path


def _write_forged(tmp_path: Path, body: dict[str, Any]) -> None:
    """An envelope the owner really signed, around a body ``sign_run_spec`` would never write."""
    sealed = seal(OWNER, DilocoRunSpec.TYPE, codec.PROTOCOL_VERSION, msgpack.packb(body, use_bin_type=True),
                  lifetime_s=600)
    (tmp_path / "spec.ine").write_bytes(sealed)


def test_the_grid_averages_exactly_the_compressions_the_protocol_names() -> None:
    assert tuple(compressions.LEVELS) == DILOCO_COMPRESSIONS
    assert compressions.SPARSE == {"topk16": 16, "topk32": 32, "topk64": 64, "topk128": 128, "topk256": 256}
    with pytest.raises(RuntimeError, match="dense grids"):  # a name added to one list and not the other
        compressions._levels_by_name((*DILOCO_COMPRESSIONS, "int2"))


def test_the_specs_compression_reaches_the_settings_the_role_runs(tmp_path: Path) -> None:
    _write_spec(tmp_path, "topk64")
    run = with_run_spec(_node(), RUN, tmp_path)  # a node left at the default takes the spec's
    assert (run.compression, run.levels, run.sparse_k, run.allowlist) == ("topk64", 2, 64, (MEMBER.peer_id,))
    assert with_run_spec(_node(compression="topk64"), RUN, tmp_path).compression == "topk64"


def test_a_node_set_to_another_compression_than_the_spec_is_refused_naming_both(tmp_path: Path) -> None:
    path = _write_spec(tmp_path, "topk64")
    with pytest.raises(RunSpecError, match="compression = 'fp16'") as refused:
        with_run_spec(_node(compression="fp16"), RUN, tmp_path)
    assert "'topk64'" in str(refused.value) and str(path) in str(refused.value)


def test_a_sparse_spec_on_a_node_without_error_feedback_is_refused(tmp_path: Path) -> None:
    path = _write_spec(tmp_path, "topk32")
    with pytest.raises(RunSpecError, match="it needs error_feedback = true") as refused:
        with_run_spec(_node(error_feedback=False), RUN, tmp_path)
    assert "'topk32'" in str(refused.value) and str(path) in str(refused.value)


def test_an_unknown_compression_is_refused_at_signing_and_at_loading(tmp_path: Path) -> None:
    with pytest.raises(InvalidValue, match="compression: 'int3' not one of"):
        sign_run_spec(OWNER, RUN, (MEMBER.peer_id,), 600, compression="int3")
    _write_forged(tmp_path, {"run_id": RUN, "authority": OWNER.peer_id, "allowlist": [MEMBER.peer_id],
                             "compression": "int3"})
    with pytest.raises(RunSpecError, match="refused \\(invalid_value\\).*compression: 'int3' not one of"):
        with_run_spec(_node(), RUN, tmp_path)


def test_a_spec_without_a_compression_is_refused_naming_the_field(tmp_path: Path) -> None:
    _write_forged(tmp_path, {"run_id": RUN, "authority": OWNER.peer_id, "allowlist": [MEMBER.peer_id]})
    with pytest.raises(RunSpecError, match="refused \\(missing_field\\).*missing field 'compression'"):
        with_run_spec(_node(), RUN, tmp_path)


def test_diloco_spec_signs_the_chosen_compression_and_names_the_choices_for_an_unknown_one(tmp_path: Path) -> None:
    out = tmp_path / "spec.ine"
    signed = CliRunner().invoke(app, ["diloco-spec", "--home", str(tmp_path / "owner"), "--run-id", RUN,
                                      "--allow", MEMBER.peer_id, "--compression", "fp16", "--out", str(out)])
    assert signed.exit_code == 0, signed.output
    authority = signed.stdout.strip()
    run = with_run_spec(DilocoSettings(run_spec="spec.ine", authority=authority), RUN, tmp_path)
    assert run.compression == "fp16"
    refused = CliRunner().invoke(app, ["diloco-spec", "--home", str(tmp_path / "owner"), "--allow", MEMBER.peer_id,
                                       "--compression", "int3", "--out", str(tmp_path / "bad.ine")])
    assert refused.exit_code == 2 and "compression: 'int3' not one of" in refused.stderr and "topk64" in refused.stderr
    assert not (tmp_path / "bad.ine").exists()
