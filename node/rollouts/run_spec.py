"""The RunSpec a node judges and generates by: built by the authority from its settings, or
loaded from a file the authority signed (specs/run_spec.md).

Until the overlay distributes the signed spec (DHT + gossip, like manifests), every role builds
the same spec from the run's shared defaults, so their judgements agree; ``load_run_spec`` is the
authoritative path (the ``--run-spec`` of ``intellect-node verify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from intellect_node.node.roles.inference.builder import RolloutSettings
from intellect_node.node.roles.validator.validation import tasks_digest
from intellect_node.node.tasks.schema import Task
from intellect_node.protocol.run_spec import EnginePair, RunSpec, load_signed_spec

# Measured honest figures of the torch engine judged by itself (specs/sampling.md section 4,
# specs/validation.md): TOPLOC limits that reject 1% weight noise, float32 logprob noise, and a
# sampling slack (logit units) about 1000x float32 logit noise; measured honest margins were
# never negative (every honest token the replay's exact choice).
TORCH_TORCH = EnginePair(worker="torch", validator="torch", toploc_max_exp_mismatches=38,
                         toploc_max_mant_err_mean=2.0, toploc_max_mant_err_median=2.0,
                         logprob_atol=1e-3, sampling_slack=1e-3)
DEFAULT_MAX_GROUPS_PER_STEP = 4096


def build_run_spec(*, run_id: str, authority: str, tasks: Sequence[Task], settings: RolloutSettings,
                   async_window: int, model_id: str = "", model_digest: bytes = bytes(32),
                   max_groups_per_step: int = DEFAULT_MAX_GROUPS_PER_STEP,
                   engines: tuple[EnginePair, ...] = (TORCH_TORCH,)) -> RunSpec:
    """The spec of a run with these settings. vLLM pairs are absent by default: the vLLM engine
    does not implement the replayable sampler yet, and a pair admits a claim only with
    tolerances the authority calibrated."""
    return RunSpec(run_id=run_id, authority=authority, model_id=model_id, model_digest=model_digest,
                   task_set_digest=tasks_digest(tasks), temperature=float(settings.temperature),
                   top_p=float(settings.top_p), max_tokens=settings.max_tokens, group_size=settings.group_size,
                   length_targets=tuple(settings.length_targets), async_window=async_window,
                   max_groups_per_step=max_groups_per_step, engines=engines)


def rollout_settings(spec: RunSpec, groups_per_batch: int) -> RolloutSettings:
    """What a worker generates with: the spec's values; only the batching is its own choice."""
    return RolloutSettings(group_size=spec.group_size, groups_per_batch=groups_per_batch,
                           temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens,
                           length_targets=spec.length_targets)


def load_run_spec(path: Path, *, authority: str, run_id: str) -> RunSpec:
    """A signed spec envelope from ``path``, refused unless ``authority`` signed it for ``run_id``."""
    return load_signed_spec(path.read_bytes(), RunSpec, authority=authority, run_id=run_id)
