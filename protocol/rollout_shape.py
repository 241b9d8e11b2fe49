"""The run's rollout shape: one type, its defaults written once, for every role that reads it.

Workers generate with it, validators and the trainer judge by it, and the run's authority signs
it into the run spec, so a worker generating another shape than its judges expect has every batch
refused: the nodes of a run must agree on it, and agreeing starts with one definition. ``RunSpec``
carries the signed part as its own flat fields (``group_size``, ``temperature``, ``top_p``,
``max_tokens``, ``length_targets``: the wire format specs/run_spec.md fixes), ``build_run_spec``
reads them from here, and ``[run]`` (node/app/config.py) defaults to these values.
``groups_per_batch`` alone is a worker's own choice, never signed: how many groups go to the engine
in one call and so into one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from intellect_node.protocol.rollouts import SamplingSettings

DEFAULT_LENGTH_TARGETS = (16, 32, 64, 128)


@dataclass(frozen=True)
class RolloutShape:
    group_size: int = 8  # completions per prompt: one GRPO group
    groups_per_batch: int = 4  # the worker's: groups per engine call and per batch (not in the spec)
    # sampling temperature; INTELLECT-2's 1.0 suits large models, a 135M model at 1.0 writes noise
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64  # completion budget of every rollout
    length_targets: tuple[int, ...] = DEFAULT_LENGTH_TARGETS

    @property
    def sampling(self) -> SamplingSettings:
        """What a batch of this shape declares (``RolloutBatch.sampling``), and validators compare
        with the run spec's."""
        return SamplingSettings(temperature=float(self.temperature), top_p=float(self.top_p),
                                max_tokens=self.max_tokens)
