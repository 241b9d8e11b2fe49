"""protocol/run_spec.py, the one run-spec module: built from a run's shape, signed through the
nodes' own check, read from a file no further than its bound, refused for any other signer or run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from intellect_node.crypto.identity import Identity
from intellect_node.node.tasks.spec import load_task_spec
from intellect_node.protocol.errors import InvalidValue, Oversize, Rejected, SignerMismatch
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import SamplingSettings
from intellect_node.protocol.run_spec import (
    DilocoRunSpec,
    RunSpec,
    build_run_spec,
    read_signed_spec,
    sign_spec,
    task_set_digest,
)

AUTHORITY = Identity.generate()
SETTINGS = RolloutShape(group_size=4, max_tokens=48, top_p=0.9, temperature=0.7)


def spec(run_id: str = "spec-run") -> RunSpec:
    return build_run_spec(run_id=run_id, authority=AUTHORITY.peer_id, tasks=load_task_spec("toy:seed=1,count=8"),
                          settings=SETTINGS, async_window=2)


def test_the_spec_carries_the_runs_shape_and_what_batches_must_declare() -> None:
    built = spec()
    assert (built.group_size, built.max_tokens, built.length_targets) == (4, 48, tuple(SETTINGS.length_targets))
    assert built.sampling == SamplingSettings(temperature=0.7, top_p=0.9, max_tokens=48)


def test_the_task_digest_depends_on_every_task_in_order() -> None:
    tasks = load_task_spec("toy:seed=1,count=8")
    assert task_set_digest(tasks) == task_set_digest(list(tasks))
    assert task_set_digest(tasks) != task_set_digest(list(reversed(tasks)))
    changed = dataclasses.replace(tasks[3], verification_info={**tasks[3].verification_info, "extra": 1})
    assert task_set_digest(tasks) != task_set_digest([*tasks[:3], changed, *tasks[4:]])


def test_a_signed_spec_reads_back_only_for_its_authority_and_run(tmp_path: Path) -> None:
    path = tmp_path / "spec.ine"
    path.write_bytes(sign_spec(spec(), AUTHORITY, lifetime_s=3600))
    loaded, signer = read_signed_spec(path, RunSpec, authority=AUTHORITY.peer_id, run_id="spec-run")
    assert loaded == spec() and signer == AUTHORITY.peer_id
    with pytest.raises(SignerMismatch):
        read_signed_spec(path, RunSpec, authority=Identity.generate().peer_id, run_id="spec-run")
    with pytest.raises(SignerMismatch):  # an empty authority is a configured one, never "anyone"
        read_signed_spec(path, RunSpec, authority="", run_id="spec-run")
    with pytest.raises(InvalidValue, match="another-run"):
        read_signed_spec(path, RunSpec, authority=AUTHORITY.peer_id, run_id="another-run")
    with pytest.raises(Rejected):  # a RunSpec file is not a DiLoCo spec
        read_signed_spec(path, DilocoRunSpec, authority=AUTHORITY.peer_id, run_id="spec-run")


def test_a_spec_its_nodes_would_refuse_is_not_signed() -> None:
    with pytest.raises(SignerMismatch):
        sign_spec(dataclasses.replace(spec(), authority=Identity.generate().peer_id), AUTHORITY, lifetime_s=3600)
    with pytest.raises(InvalidValue, match="allowlist"):
        sign_spec(DilocoRunSpec(run_id="spec-run", authority=AUTHORITY.peer_id, allowlist=(), compression="int8"),
                  AUTHORITY, 3600)


def test_an_oversized_file_is_refused_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "huge.ine"
    path.write_bytes(b"\x00" * (64 * RunSpec.MAX_SIZE))
    with pytest.raises(Oversize):
        read_signed_spec(path, RunSpec, authority=AUTHORITY.peer_id, run_id="spec-run")
    with pytest.raises(OSError):
        read_signed_spec(tmp_path / "missing.ine", RunSpec, authority=AUTHORITY.peer_id, run_id="spec-run")
