"""The ``[diloco]`` section: one checked dataclass, so the role, the bench and the tests read the
same names and bounds (specs/diloco.md section 7). Typed and loaded by node/config
(``build(DilocoSettings, table, source, "[diloco]")``): unknown keys are errors naming the key."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from intellect_node.node.config.base import ConfigError, check_bounds
from intellect_node.node.diloco.compressions import levels_for, sparse_k
from intellect_node.node.diloco.llama import Preset
from intellect_node.node.diloco.toy_lm import TINY
from intellect_node.node.diloco.workload import models, open_data, workload_of_data
from intellect_node.protocol.messages import PEER_ID_PATTERN
from intellect_node.protocol.run_spec import DILOCO_DEFAULT_COMPRESSION

if TYPE_CHECKING:  # data imports torch: a config is checked without it (a config error in under a second)
    from intellect_node.node.diloco.data import PeerData


@dataclass(frozen=True)
class DilocoSettings:
    H: int = 50
    inner_lr: float = 4e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    compression: str = DILOCO_DEFAULT_COMPRESSION  # dense int4/int8/fp16/int16, or sparse topk<k> (2-bit, k/chunk)
    error_feedback: bool = True
    overlap: bool = False  # one-round-delayed outer step; off: better per token, on for slow links (specs/diloco.md 1)
    round_timeout_s: float = 60.0
    matchmaking_s: float = 5.0
    min_peers: int = 2
    max_peers: int = 64
    seed: int = 0
    batch: int = 8
    model: str = TINY.name
    data: str = "generated:sequences=8192,seq_len=64"
    rounds: int = 0  # 0: until stopped
    initial_peers: tuple[str, ...] = ()
    allowlist: tuple[str, ...] = ()  # node peer ids admitted to rounds; empty: anyone
    run_spec: str = ""  # a signed diloco_run_spec file: its allowlist and compression are the run's (run_spec.py)
    authority: str = ""  # the peer id whose signature the run spec must carry (the run's owner)
    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        levels_for(self.compression)
        if sparse_k(self.compression) and not self.error_feedback:
            raise ConfigError(f"[diloco] compression = {self.compression!r} sends a few values per chunk: it needs "
                              "error_feedback = true, or what is not sent is lost")
        workload = workload_of_data(self.data)
        workload.parse(self.data)
        if workload.preset_rule and self.model not in workload.presets:
            raise ConfigError(f"[diloco] model = {self.model!r}: {workload.kind} data needs {workload.preset_rule}: "
                              f"one of {', '.join(workload.presets)}")
        check_bounds("[diloco]", self, {
            "H": 1 <= self.H <= 100_000, "inner_lr": 0 < self.inner_lr < 1, "weight_decay": 0 <= self.weight_decay < 1,
            "betas": all(0 <= b < 1 for b in self.betas) and len(self.betas) == 2,
            "outer_lr": 0 < self.outer_lr <= 10, "outer_momentum": 0 <= self.outer_momentum < 1,
            "round_timeout_s": max(1.0, self.matchmaking_s) < self.round_timeout_s <= 3600,
            "matchmaking_s": 0.1 <= self.matchmaking_s <= 60,
            "min_peers": 1 <= self.min_peers <= self.max_peers, "max_peers": 2 <= self.max_peers <= 256,
            "seed": 0 <= self.seed < 2**32, "batch": 1 <= self.batch <= 4096, "model": self.model in models(),
            "rounds": self.rounds >= 0, "port": 0 <= self.port <= 65535,
            "allowlist": len(self.allowlist) <= 4096
            and all(isinstance(p, str) and len(p) <= 64 for p in self.allowlist),
            "authority": not self.authority or re.fullmatch(PEER_ID_PATTERN, self.authority) is not None})
        if bool(self.run_spec) != bool(self.authority):
            raise ConfigError("[diloco] run_spec and authority go together: the signed spec file and the peer id "
                              "of the run's owner, whose signature it must carry")

    @property
    def preset(self) -> Preset:
        return models()[self.model]

    def open_data(self) -> PeerData:
        """The data source ``data`` names, for this run's seed, batch, round length and model."""
        return open_data(self.data, self.seed, self.batch, self.H, self.preset.context, self.preset.vocab)

    @property
    def levels(self) -> int:
        return levels_for(self.compression)

    @property
    def sparse_k(self) -> int:
        """Values each member sends per chunk; 0 for a dense compression."""
        return sparse_k(self.compression)
