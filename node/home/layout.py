"""Every path under a node's home, named once.

A node's home holds its identity and everything it must find again after a restart. Code asks
``HomeLayout`` for a path instead of spelling one out, so a reader sees the whole home here and a
rename happens in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HomeLayout:
    root: Path

    @property
    def identity_key(self) -> Path:
        """The Ed25519 key (mode 0600); the peer id derives from it."""
        return self.root / "identity.key"

    @property
    def config_file(self) -> Path:
        """The TOML configuration read when ``--config`` names no other file."""
        return self.root / "config.toml"

    @property
    def control_socket(self) -> Path:
        """The unix socket ``intellect-node status`` asks a running node through."""
        return self.root / "control.sock"

    @property
    def peer_cache(self) -> Path:
        """Peers seen before, so a restart needs no bootstrap peer."""
        return self.root / "peers.json"

    @property
    def shards(self) -> Path:
        """The checkpoint overlay's store (partial and complete checkpoints, status.json)."""
        return self.root / "shards"

    @property
    def publish(self) -> Path:
        """Where a trainer writes each step's weights for the overlay to publish."""
        return self.root / "publish"

    @property
    def inbox(self) -> Path:
        """Received rollout batches not yet judged."""
        return self.root / "inbox"

    @property
    def verdicts(self) -> Path:
        """One JSON record per judged batch."""
        return self.root / "verdicts"

    @property
    def bans(self) -> Path:
        """Every peer this node banned, one JSON line each (read back at start)."""
        return self.root / "bans.jsonl"

    @property
    def commitments(self) -> Path:
        """The work commitments a judge stored, one JSON line each, for steps not yet settled."""
        return self.root / "commitments.jsonl"

    @property
    def quarantine(self) -> Path:
        """Batches whose judging failed (kept for ``intellect-node verify``, newest few only)."""
        return self.root / "quarantine"

    @property
    def validator_secret(self) -> Path:
        """The local secret a verifier draws its sampled batches from (mode 0600)."""
        return self.root / "validator_secret"

    @property
    def inference_counters(self) -> Path:
        """The next task counter per policy step of this worker."""
        return self.root / "inference_counters.json"

    @property
    def trainer(self) -> Path:
        """The trainer's state, pool, ledger and metrics."""
        return self.root / "trainer"

    @property
    def diloco(self) -> Path:
        """The DiLoCo role's checkpoint, metrics.jsonl, and its averager child's socket and log."""
        return self.root / "diloco"

    @property
    def models(self) -> Path:
        """Models built or imported on this machine (``tiny`` is built here on first use)."""
        return self.root / "models"
