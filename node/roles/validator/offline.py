"""The offline judge: one stored batch through the validator's own ``verify_batch``, no network.

What a contributor runs to learn why a batch was rejected, and what an auditor runs to re-check a
verdict (``intellect-node verify``). The code path is the service's: the same wire decoding, the
same ``RunContext`` and ``verify_batch``; only the facts a live validator learns from the swarm
are given here instead:

- the checkpoint is the directory passed in. When it holds the signed manifest (``manifest.ine``,
  as the shard store keeps it) the batch's ``manifest_hash`` must be that envelope's sha256 and its
  step the manifest's; otherwise the directory is taken to be the batch's checkpoint, and the
  report says the binding was not checked;
- the newest step is the batch's own (a stored batch is judged as if it had just arrived);
- counters below the batch's first one are taken as judged earlier (a single file carries no
  history): the ledger then checks the batch's own counters for gaps, replays and the cap.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from intellect_node.node.engine import build_engine
from intellect_node.node.roles.validator.ledger import JudgeState
from intellect_node.node.roles.validator.validation import (
    BatchVerdict,
    RunContext,
    verify_batch,
)
from intellect_node.node.shards.store import MANIFEST_FILE
from intellect_node.node.tasks.schema import Task
from intellect_node.protocol import codec
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.manifest import CheckpointManifest
from intellect_node.protocol.rollouts import RolloutBatch
from intellect_node.protocol.run_spec import RunSpec

T = TypeVar("T")


@dataclass(frozen=True)
class OfflineVerdict:
    batch: RolloutBatch
    verdict: BatchVerdict
    checkpoint_bound: bool  # the manifest hash was checked against a signed manifest


def load_batch(path: Path) -> codec.Signed[RolloutBatch]:
    """A stored batch envelope, with every wire check (signature, schema, size, expiry)."""
    return naming_file(path, partial(codec.read_signed, kind=RolloutBatch))[1]


def naming_file(path: Path, load: Callable[[Path], T]) -> T:
    """``load(path)``, its refusal naming the file: the wire's messages ("bad magic") do not say
    which of a user's files was refused."""
    try:
        return load(path)
    except Rejected as exc:
        raise type(exc)(f"{path}: {exc}") from None


def judge_stored_batch(signed: codec.Signed[RolloutBatch], *, checkpoint_dir: Path, spec: RunSpec,
                       tasks: list[Task], engine_name: str = "torch") -> OfflineVerdict:
    """The verdict the validator would give ``signed`` with ``checkpoint_dir`` loaded."""
    batch = signed.message
    manifest_path = checkpoint_dir / MANIFEST_FILE
    if manifest_path.exists():
        envelope, signed_manifest = naming_file(manifest_path, partial(codec.read_signed, kind=CheckpointManifest))
        manifest = signed_manifest.message
        known = {hashlib.sha256(envelope).digest(): manifest.step}
    else:
        known = {batch.manifest_hash: batch.policy_step}
    run = RunContext(spec, tasks)
    engine = build_engine(engine_name, checkpoint_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    state = JudgeState()
    state.credit(batch.worker, batch.policy_step, range(min(g.counter for g in batch.groups)))
    verdict = verify_batch(signed, engine=engine, tokenizer=tokenizer, run=run, checkpoint_step_of=known.get,
                           newest_step=batch.policy_step, state=state)
    return OfflineVerdict(batch, verdict, checkpoint_bound=manifest_path.exists())
