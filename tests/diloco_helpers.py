"""DiLoCo peers for tests: each a real ``DilocoPeer`` with its own real averager child (hivemind
DHT and averager in a child process), on 127.0.0.1, training a tiny Llama on the generated corpus."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import torch

from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco.client import AveragerClient, ChildSettings
from intellect_node.node.diloco.data import CorpusSpec, generate
from intellect_node.node.diloco.peer import DilocoPeer, RoundRecord
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.metagene.presets import Preset, build_model

MICRO = Preset("micro", hidden=32, layers=1, heads=2, intermediate=64, context=64, vocab=64)
DATA = "generated:sequences=512,seq_len=16,vocab=64"


def settings(**overrides: Any) -> DilocoSettings:
    base = dict(H=3, batch=4, data=DATA, matchmaking_s=2.0, round_timeout_s=30.0, max_peers=3, min_peers=2)
    return DilocoSettings(**(base | overrides))


def child_settings(s: DilocoSettings, initial_peers: tuple[str, ...] = ()) -> ChildSettings:
    return ChildSettings("diloco_test", s.levels, initial_peers, max_peers=s.max_peers, min_peers=s.min_peers,
                         matchmaking_s=s.matchmaking_s, allowlist=s.allowlist)


def identity(name: str) -> Identity:
    """A node identity per test peer name, the same on every run."""
    return Identity.from_seed(hashlib.sha256(name.encode()).digest())


def make_peer(tmp: Path, name: str, s: DilocoSettings, initial_peers: tuple[str, ...] = ()) -> DilocoPeer:
    """A peer whose model starts from the same seed as every other (the run's initial θ)."""
    model = build_model(MICRO, seed=0)
    client = AveragerClient(tmp / f"{name}.sock", _layout(model), child_settings(s, initial_peers), tmp / f"{name}.log")
    client.ensure_running()
    return DilocoPeer(model, s, client, generate(CorpusSpec.parse(DATA)), identity(name), tmp / f"{name}.safetensors")


def _layout(model: torch.nn.Module):
    from intellect_node.node.diloco.layout import Layout

    return Layout.of(dict(model.named_parameters()))


def run_rounds_together(peers: list[DilocoPeer], hooks: dict[int, Any] | None = None) -> list[RoundRecord | BaseException]:
    """One round on every peer at once (one thread each); a peer's failure is its result."""
    results: list[RoundRecord | BaseException] = [RuntimeError("did not finish")] * len(peers)

    def go(i: int) -> None:
        try:
            results[i] = peers[i].run_round((hooks or {}).get(i))
        except BaseException as exc:  # reported to the test, not swallowed
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(peers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results
