"""What the validator role is given (``ValidatorOptions``): torch-free, so that ``join`` checks a node's
options without importing the verifier's engines (node/app/join.py builds it from the inference flags
and ``[validator]``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ValidatorOptions:
    """What the validator role needs beyond the node (the inference flags, reused)."""

    model_dir: Path
    task_spec: str
    engine: str = "auto"
    verify_fraction: float = 1.0
    trusted: tuple[str, ...] = ()
    # a judged-hook user (the trainer) adopts trusted verdicts on unsampled batches; this long it waits
    verdict_wait_s: float = 60.0
    # check 17: groups no trainer learns from are not verified (a trainer that trusts a validator,
    # which catches cheats in them); a validator verifies every group, its verdicts are what bans
    skip_uninformative: bool = False
