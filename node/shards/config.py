"""Settings of the weight broadcast overlay: defaults < the config file's ``[shards]`` section <
environment (INTELLECT_NODE_SHARDS_*) < flags, loaded by node/config's ``load_section`` with
``data_dir`` fixed under the home (it is not a setting: nothing is ever written outside it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from intellect_node.node.config.base import ConfigError
from intellect_node.protocol.messages import PEER_ID_PATTERN

MIB = 1 << 20


@dataclass(frozen=True)
class ShardConfig:
    data_dir: Path  # <home>/shards: nothing is ever written outside it
    trainer: str | None = None  # the peer id allowed to sign this run's manifests
    publish_dir: Path | None = None  # trainer: new step-<N>.safetensors files here are published
    shard_size: int = 64 * MIB
    keep_steps: int = 3  # async window (2) + 1
    http_port: int = 0  # 0: any free port (it is advertised, so peers find it either way)
    public_host: str | None = None  # host to advertise; default: the libp2p listen host
    max_uploads: int = 8  # concurrent shard uploads in total
    max_uploads_per_peer: int = 2
    peer_rate_mib_s: float = 0.0  # per-peer upload rate limit; 0: none
    max_downloads: int = 4  # concurrent shard downloads per checkpoint
    stall_s: float = 10.0  # a transfer with no progress for this long is cut and charged
    manifest_lifetime_s: float = 86400.0
    reannounce_s: float = 30.0  # the trainer repeats its newest manifest for late joiners
    discovery_s: float = 2.0
    # the trainer publishes each step's sparse delta against its parent where the body is at most
    # this fraction of the checkpoint (specs/deltas.md); 0: full checkpoints only
    max_delta_fraction: float = 0.5
    delta_attempts: int = 3  # holders a follower tries for a delta before it fetches the step in full
    # the trainer sends a step's delta body to this many members that serve, then names them to the
    # rest (409), who take it from them: a tree, not one body per follower through its uplink
    delta_seed_copies: int = 4

    def __post_init__(self) -> None:
        if self.trainer is not None and not re.fullmatch(PEER_ID_PATTERN, self.trainer):
            raise ConfigError(f"trainer: {self.trainer!r} is not a peer id (12D3KooW...)")
        if not 1 << 16 <= self.shard_size <= 1 << 30:
            raise ConfigError(f"shard_size: {self.shard_size} outside [64 KiB, 1 GiB]")
        for name in ("keep_steps", "max_uploads", "max_uploads_per_peer", "max_downloads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be at least 1")
        if not 0.0 <= self.max_delta_fraction <= 1.0:
            raise ConfigError(f"max_delta_fraction: {self.max_delta_fraction} outside [0, 1]")
        if self.delta_attempts < 1:
            raise ConfigError("delta_attempts: must be at least 1")
        if self.delta_seed_copies < 1:
            raise ConfigError("delta_seed_copies: must be at least 1")
        if not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http_port: {self.http_port} is not a port")

    @property
    def is_publisher(self) -> bool:
        return self.publish_dir is not None

