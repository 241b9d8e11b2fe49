"""DiLoCo peers for tests: each a real ``DilocoPeer`` with its own real averager child (hivemind
DHT and averager in a child process), on 127.0.0.1, training a tiny Llama on the generated corpus,
and its real state server (``Overlays``)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import torch
import trio

from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco.adverts import state_endpoint
from intellect_node.node.diloco.client import AveragerClient, ChildSettings
from intellect_node.node.diloco.data import generate
from intellect_node.node.diloco.data_spec import CorpusSpec
from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.llama import Preset
from intellect_node.node.diloco.outer import GlobalState
from intellect_node.node.diloco.peer import DilocoPeer, RoundRecord
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.node.diloco.state_hash import state_hash
from intellect_node.node.diloco.state_overlay import StateOverlay
from intellect_node.node.diloco.toy_lm import build_toy
from intellect_node.node.shards.client import Endpoint
from intellect_node.node.swarm.peer_scores import PeerScores

MICRO = Preset("micro", hidden=32, layers=1, heads=2, intermediate=64, context=64, vocab=64)
DATA = "generated:sequences=512,seq_len=16,vocab=64"


def settings(**overrides: Any) -> DilocoSettings:
    base = dict(H=3, batch=4, data=DATA, matchmaking_s=2.0, round_timeout_s=30.0, max_peers=3, min_peers=2)
    return DilocoSettings(**(base | overrides))


def child_settings(s: DilocoSettings, initial_peers: tuple[str, ...] = ()) -> ChildSettings:
    return ChildSettings("diloco_test", s.levels, initial_peers, max_peers=s.max_peers, min_peers=s.min_peers,
                         matchmaking_s=s.matchmaking_s, allowlist=s.allowlist, sparse_k=s.sparse_k)


def identity(name: str) -> Identity:
    """A node identity per test peer name, the same on every run."""
    return Identity.from_seed(hashlib.sha256(name.encode()).digest())


def make_peer(tmp: Path, name: str, s: DilocoSettings, initial_peers: tuple[str, ...] = ()) -> DilocoPeer:
    """A peer whose model starts from the same seed as every other (the run's initial θ)."""
    model = build_toy(MICRO, seed=0)
    client = AveragerClient(tmp / f"{name}.sock", _layout(model), child_settings(s, initial_peers), tmp / f"{name}.log")
    client.ensure_running()
    return DilocoPeer(model, s, client, generate(CorpusSpec.parse(DATA)), identity(name), tmp / f"{name}.safetensors")


def _layout(model: torch.nn.Module) -> Layout:
    return Layout.of(dict(model.named_parameters()))


def run_rounds_together(peers: list[DilocoPeer],
                        hooks: dict[int, Any] | None = None) -> list[RoundRecord | BaseException]:
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


class Overlays:
    """Each test peer's state server: a real ``StateOverlay`` (the shard overlay's HTTP server,
    store, client and fetcher on 127.0.0.1), all in one trio loop on a background thread that the
    test thread calls into, as the node's event loop calls it between rounds."""

    def __init__(self, tmp: Path, allowlist: frozenset[str] = frozenset(), shard_size: int = 1 << 16) -> None:
        self.tmp, self.allowlist, self.shard_size = tmp, allowlist, shard_size  # small shards: a state spans several
        self.overlays: dict[str, StateOverlay] = {}
        self.endpoints: dict[str, Endpoint] = {}
        ready = threading.Event()

        async def loop() -> None:
            self.token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                ready.set()
                await trio.sleep_forever()

        self.thread = threading.Thread(target=trio.run, args=(loop,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def serve(self, name: str, layout: Layout) -> Endpoint:
        overlay = StateOverlay(self.tmp / f"{name}-states", "run", identity(name), PeerScores(), layout, self.allowlist,
                               self.shard_size)
        addr = trio.from_thread.run(self.nursery.start, overlay.serve, "127.0.0.1", trio_token=self.token)
        endpoint = state_endpoint(identity(name).peer_id, [addr])
        assert endpoint is not None, addr
        self.overlays[name], self.endpoints[name] = overlay, endpoint
        return endpoint

    def publish(self, name: str, state: GlobalState, digest: bytes | None = None) -> None:
        """Serve ``state`` from ``name``'s overlay; ``digest``: the hash it claims (its own by default)."""
        trio.from_thread.run(self.overlays[name].publish, state, digest or state_hash(state), trio_token=self.token)

    def fetch(self, name: str, members: list[str], timeout_s: float = 20.0, own_round: int = -1,
              diverged: bool = False) -> tuple[GlobalState, bytes] | None:
        """What ``name`` takes from the state servers of ``members``."""
        return trio.from_thread.run(self.overlays[name].fetch_majority, [self.endpoints[m] for m in members],
                                    timeout_s, own_round, diverged, trio_token=self.token)

    def sync(self, name: str, peer: DilocoPeer, members: list[str]) -> bool:
        """A joiner's (or a diverged peer's) sync, as the role runs it: fetch, adopt, serve."""
        fetched = self.fetch(name, members, own_round=peer.state.round, diverged=peer.diverged)
        adopted = peer.adopt(fetched[0] if fetched else None)
        self.publish(name, peer.state)
        return adopted

    def close(self) -> None:
        trio.from_thread.run_sync(self.nursery.cancel_scope.cancel, trio_token=self.token)
        self.thread.join(10)


def rounds_in_step(peers: list[DilocoPeer], rounds: int) -> tuple[int, int]:
    """Run ``rounds`` rounds of ``peers`` together, asserting each ends with every peer in one
    group at one state hash and the runs bit-identical; the all-reduce bytes all of them sent,
    and the attempts those rounds took (a round's attempts: the most any member began; an
    attempt that fails on a loaded machine is retried and sends its bytes again)."""
    sent = attempted = 0
    for expected_round in range(rounds):
        records = run_rounds_together(peers)
        assert all(not isinstance(r, BaseException) for r in records), records
        assert [r.group_size for r in records] == [len(peers)] * len(peers)
        assert all(r.round == expected_round for r in records)
        assert len({r.state_hash for r in records}) == 1 and all(r.hash_agreement for r in records)
        assert all(r.allreduce_attempts >= 1 for r in records), records
        sent += sum(r.allreduce_bytes for r in records)
        attempted += max(r.allreduce_attempts for r in records)
    for peer in peers[1:]:
        assert torch.equal(peers[0].state.params, peer.state.params)
        assert torch.equal(peers[0].state.momentum, peer.state.momentum)
    return sent, attempted
