"""``intellect-node verify``: a stored batch judged offline by the validator's own code path.

An honest batch written as the inbox stores it is accepted (exit 0) with its figures; the same
batch with one claimed logprob shifted is rejected with the validator's reason (exit 1); a run spec
signed by another key than ``--authority`` is refused before anything is judged (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from typer.testing import CliRunner

from intellect_node.cli.main import app
from intellect_node.crypto.identity import Identity
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.models.tiny import ensure_tiny_model
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.tasks.spec import load_task_spec
from intellect_node.protocol import codec
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import pack_logprobs, unpack_logprobs
from intellect_node.protocol.run_spec import build_run_spec
from tests.support.engine_helpers import QUICK_RECIPE

TASKS = "toy:seed=3,count=40"
SETTINGS = RolloutShape(group_size=2, groups_per_batch=2, max_tokens=40, top_p=0.9)
WORKER, AUTHORITY = Identity.generate(), Identity.generate()


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict[str, Path]:
    """An untrained tiny model (long completions over two TOPLOC chunks), a batch and a spec file."""
    torch.set_num_threads(2)
    recipe = dataclasses.replace(QUICK_RECIPE, hidden_size=128, num_heads=4, num_kv_heads=2, train_steps=0)
    model = ensure_tiny_model(Path(tempfile.mkdtemp(prefix="ina-verify-cli-")) / "tiny", recipe)
    tasks = load_task_spec(TASKS)
    batch = build_batch(TorchEngine.from_checkpoint(model), AutoTokenizer.from_pretrained(model), tasks,
                        run_id="cli-run", worker=WORKER.peer_id, step=3, manifest_hash=bytes(32),
                        first_counter=0, settings=SETTINGS).batch
    spec = build_run_spec(run_id="cli-run", authority=AUTHORITY.peer_id, tasks=tasks, settings=SETTINGS,
                          async_window=2)
    out = tmp_path_factory.mktemp("stored")
    paths = {"model": model, "batch": out / "batch.ine", "spec": out / "spec.ine", "forged": out / "forged.ine",
             "foreign_spec": out / "foreign.ine"}
    paths["batch"].write_bytes(codec.encode(batch, WORKER, lifetime_s=3600))
    paths["spec"].write_bytes(codec.encode(spec, AUTHORITY, lifetime_s=3600))
    impostor = Identity.generate()
    paths["foreign_spec"].write_bytes(codec.encode(dataclasses.replace(spec, authority=impostor.peer_id), impostor,
                                                   lifetime_s=3600))
    record = batch.groups[1].completions[0]
    shifted = dataclasses.replace(record, logprobs=pack_logprobs(unpack_logprobs(record.logprobs) - np.float32(0.05)))
    group = dataclasses.replace(batch.groups[1], completions=(shifted, *batch.groups[1].completions[1:]))
    paths["forged"].write_bytes(codec.encode(dataclasses.replace(batch, groups=(batch.groups[0], group)), WORKER,
                                             lifetime_s=3600))
    return paths


def run(stored: dict[str, Path], batch: str, spec: str = "spec") -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["verify", str(stored[batch]), "--checkpoint", str(stored["model"]),
                                      "--run-spec", str(stored[spec]), "--authority", AUTHORITY.peer_id,
                                      "--tasks", TASKS, "--json"])
    return result.exit_code, result.stdout, result.stderr


def test_an_honest_stored_batch_is_accepted_with_its_figures(stored) -> None:
    code, output, _ = run(stored, "batch")
    assert code == 0, output
    report = json.loads(output)
    assert report["run_spec_signer"] == AUTHORITY.peer_id and report["checkpoint_bound"] is False
    assert [g["accepted"] for g in report["groups"]] == [True, True]
    for group in report["groups"]:
        assert len(group["rewards"]) == SETTINGS.group_size
        assert group["min_sampling_margin"] is not None and group["max_logprob_error"] < 1e-3


def test_a_forged_batch_is_rejected_with_the_validators_reason(stored) -> None:
    code, output, _ = run(stored, "forged")
    assert code == 1, output
    groups = json.loads(output)["groups"]
    assert [g["reason"] for g in groups] == [None, "logprobs"]
    assert groups[1]["detail"].startswith("completion 0: error")


def test_a_run_spec_from_another_key_is_refused(stored) -> None:
    code, _, errors = run(stored, "batch", spec="foreign_spec")
    assert code == 2
    assert "SignerMismatch" in errors


def test_an_oversize_or_foreign_batch_file_is_refused_naming_it(tmp_path) -> None:
    """Refused before the file is read whole, and naming which of the inputs was wrong."""
    huge, garbage = tmp_path / "huge.ine", tmp_path / "garbage.ine"
    with open(huge, "wb") as handle:
        handle.truncate(1 << 30)  # sparse
    garbage.write_bytes(b"\xb6" * 100)
    for batch, match in ((huge, "larger than a rollout_batch's"), (garbage, "not an intellect-node envelope")):
        result = CliRunner().invoke(app, ["verify", str(batch), "--checkpoint", str(tmp_path)])
        assert result.exit_code == 2 and f"{batch}: " in result.stderr and match in result.stderr, result.stderr
