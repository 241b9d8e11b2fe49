"""Calibrating an engine pair on this machine: honest batches from one engine, judged by another's
prefill with replays, measured by ``node.engine.calibration`` (``intellect-node calibrate`` and
``bench/cross_engine.py``).

The batches are built exactly as a worker builds them (``build_batch``: the run's sampler, claimed
log-probabilities and TOPLOC proofs), so the figures are those a validator of the run would see.
The replays use the widest slack the wire allows: calibration measures how deep honest flips go,
it must not cut them off.
"""

from __future__ import annotations

from collections.abc import Sequence

from intellect_node.node.engine.base import Engine, derive_seed
from intellect_node.node.engine.calibration import PairFigures, measure_pair
from intellect_node.node.roles.inference.builder import build_batch
from intellect_node.node.tasks.schema import Task
from intellect_node.protocol.assignment import sampling_seed
from intellect_node.protocol.rollout_shape import RolloutShape
from intellect_node.protocol.rollouts import proof_key, unpack_tokens
from intellect_node.protocol.sampling import MAX_SLACK, Replay

CALIBRATION_RUN = "calibration"
CALIBRATION_WORKER = "calibration-worker"
CALIBRATION_MANIFEST = bytes(32)


def measure_engines(worker: Engine, validator: Engine, tokenizer: object, tasks: Sequence[Task],
                    settings: RolloutShape, groups: int) -> PairFigures:
    """Figures of ``groups`` honest groups generated on ``worker`` and judged on ``validator``."""
    claims, keys, prompts, completions, replays = [], [], [], [], []
    for first in range(0, groups, settings.groups_per_batch):
        batch = build_batch(worker, tokenizer, tasks, run_id=CALIBRATION_RUN, worker=CALIBRATION_WORKER, step=0,
                            manifest_hash=CALIBRATION_MANIFEST, first_counter=first, settings=settings).batch
        for group in batch.groups:
            seed = sampling_seed(CALIBRATION_RUN, CALIBRATION_WORKER, 0, group.counter)
            for j, completion in enumerate(group.completions):
                claims.append(completion)
                keys.append(proof_key(CALIBRATION_MANIFEST, 0, group.prompt_ids, completion.token_ids))
                prompts.append(unpack_tokens(group.prompt_ids).tolist())
                completions.append(unpack_tokens(completion.token_ids).tolist())
                replays.append(Replay(derive_seed(seed, j), settings.temperature, settings.top_p, MAX_SLACK))
    return measure_pair(claims, validator.prefill(prompts, completions, replays), keys)
