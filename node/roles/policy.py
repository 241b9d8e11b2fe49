"""The policy a worker generates with and a validator judges with: one engine following the run.

Inference and validation need the same three things: an engine loaded once from the base model
(off the trio loop), its weights swapped to whichever verified checkpoint of the overlay the work
is about, and the newest step the run has reached (the newest checkpoint held here, or a newer
step a trainer advertises but the overlay has not brought yet). They live here once.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from intellect_node.node.engine import build_engine
from intellect_node.node.engine.base import Engine
from intellect_node.node.shards.loader import load_tensors

if TYPE_CHECKING:
    from intellect_node.node.shards.service import ShardService
    from intellect_node.node.shards.store import Checkpoint
    from intellect_node.node.swarm.context import NodeContext

log = logging.getLogger(__name__)


class PolicySetupError(Exception):
    """The engine cannot be built from the base model; the message says what to fix."""


class PolicyFollower:
    def __init__(self, shards: ShardService, model_dir: Path, engine_name: str) -> None:
        self.shards = shards
        self.model_dir = model_dir
        self.engine_name = engine_name
        self.engine: Engine | None = None
        self.tokenizer: Any = None
        self.loaded_step: int | None = None

    async def load(self) -> Engine:
        """Build the engine and tokenizer from the base model, in a worker thread."""
        self.engine, self.tokenizer = await trio.to_thread.run_sync(self._build)
        return self.engine

    def _build(self) -> tuple[Engine, Any]:
        from transformers import AutoTokenizer

        if not (self.model_dir / "config.json").exists():
            raise PolicySetupError(f"{self.model_dir} is not an HF-layout model directory (no config.json)")
        return (build_engine(self.engine_name, self.model_dir),
                AutoTokenizer.from_pretrained(self.model_dir))

    async def use(self, checkpoint: Checkpoint) -> bool:
        """Swap the engine's weights to ``checkpoint`` unless they already are; True if swapped."""
        assert self.engine is not None, "load() first"
        if checkpoint.step == self.loaded_step:
            return False
        tensors = load_tensors(checkpoint.data_path, checkpoint.manifest)
        await trio.to_thread.run_sync(self.engine.load_state_dict, tensors)
        self.loaded_step = checkpoint.step
        return True

    def newest_complete(self) -> Checkpoint | None:
        return self.shards.store.newest_complete()

    async def wait_complete_after(self, step: int) -> Checkpoint:
        """The newest complete checkpoint, once one newer than ``step`` is held here."""
        return await self.shards.wait_complete_after(step)

    def complete_since(self, step: int) -> list[Checkpoint]:
        """The complete checkpoints held of ``step`` and later, newest first."""
        held = [c for c in self.shards.store.held() if c.complete and c.step >= step]
        return sorted(held, key=lambda c: c.step, reverse=True)

    def newest_known_step(self, node: NodeContext) -> int:
        """The run's newest step as far as this node knows: held here, or advertised by a trainer."""
        newest = self.newest_complete()
        advertised = [m.advert.policy_step for m in node.view.members()
                      if "trainer" in m.advert.roles and m.advert.policy_step is not None]
        return max([newest.step if newest is not None else 0, *advertised])

    def checkpoint_with_manifest(self, manifest_hash: bytes) -> Checkpoint | None:
        """The complete checkpoint whose signed manifest hashes to ``manifest_hash``."""
        for checkpoint in self.shards.store.held():
            if checkpoint.complete and hashlib.sha256(checkpoint.envelope).digest() == manifest_hash:
                return checkpoint
        return None
