"""The global state as a shard-overlay checkpoint file, and back (specs/diloco.md section 2).

Why a file the overlay already knows (safetensors, cut into shards named by a signed manifest):
joiners fetch the state the way workers fetch checkpoints, chunk by verified chunk from any peer
that holds it, so there is no second transfer path to harden. The file is a pure function of the
state: tensors ``params.<name>`` and ``momentum.<name>`` (fp32, the layout's shapes),
``diloco.round`` (I64, one element), ``diloco.state_hash`` (U8, 32) and ``diloco.run`` (U8, 32:
the run digest, ``Layout.run_digest``: the model's layout bound to the data's digest), written by
safetensors in its fixed order. So every honest peer writes the same bytes after an outer step, signs manifests
with the same checkpoint hash, and a joiner can count which hash most peers vouch for, then take
the shards from any of them. Reading checks every entry against the model's layout (no other
tensor, no other shape or dtype), the round against the manifest's step and the recomputed state
hash against the one inside, and the run digest against the reader's own: a file that passes is
exactly the state it claims to be, of the run the reader trains (a peer on another METAGENE store
must not adopt a state it can never average with).
"""

from __future__ import annotations

from pathlib import Path

import torch

from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.outer import GlobalState
from intellect_node.node.diloco.state_hash import state_hash
from intellect_node.node.shards.checkpoint import write_safetensors
from intellect_node.node.shards.loader import load_tensors
from intellect_node.protocol.manifest import CheckpointManifest

ROUND, HASH, RUN = "diloco.round", "diloco.state_hash", "diloco.run"
MAX_HEADER = 1 << 24  # the safetensors header: about 150 bytes per tensor (65,536 tensors at most)


class StateFileError(ValueError):
    """A fetched state file that is not the state its manifest and its own hash say."""


def _entries(layout: Layout) -> dict[str, tuple[str, tuple[int, ...]]]:
    expected = {ROUND: ("I64", (1,)), HASH: ("U8", (32,)), RUN: ("U8", (32,))}
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        expected[f"params.{name}"] = ("F32", tuple(shape))
        expected[f"momentum.{name}"] = ("F32", tuple(shape))
    return expected


def write_state_file(state: GlobalState, digest: bytes, run_digest: bytes, path: Path) -> None:
    """``state`` (whose hash is ``digest``) of the run ``run_digest`` as the overlay file at ``path``."""
    tensors: dict[str, torch.Tensor] = {ROUND: torch.tensor([state.round], dtype=torch.int64),
                                        HASH: torch.frombuffer(bytearray(digest), dtype=torch.uint8),
                                        RUN: torch.frombuffer(bytearray(run_digest), dtype=torch.uint8)}
    for part, flat in (("params", state.params), ("momentum", state.momentum)):
        for name, view in state.layout.views(flat).items():
            tensors[f"{part}.{name}"] = view
    write_safetensors(tensors, path)


def check_manifest(manifest: CheckpointManifest, layout: Layout) -> None:
    """Refuse (``StateFileError``) a manifest whose tensors are not exactly this model's state."""
    expected = _entries(layout)
    found = {e.name: (e.dtype, tuple(e.shape)) for e in manifest.tensors}
    if found != expected:
        odd = sorted(set(found) ^ set(expected)) or sorted(n for n in found if found[n] != expected[n])
        raise StateFileError(f"the state file's tensors do not match this model's layout (first: {odd[0][:80]!r})")
    if manifest.total_size > sum(e.nbytes for e in manifest.tensors) + MAX_HEADER:
        raise StateFileError(f"a state file of {manifest.total_size} bytes is larger than this model's state")


def read_state_file(path: Path, manifest: CheckpointManifest, layout: Layout,
                    run_digest: bytes) -> tuple[GlobalState, bytes]:
    """The state in a verified file of the run ``run_digest`` and its hash, or ``StateFileError``
    naming what was wrong."""
    check_manifest(manifest, layout)
    tensors = load_tensors(path, manifest)
    if bytes(tensors[RUN].tolist()) != run_digest:
        raise StateFileError("the state file is of another run: it trains another model or other data "
                             f"(run digest {bytes(tensors[RUN].tolist()).hex()[:12]}, ours {run_digest.hex()[:12]})")
    round_ = int(tensors[ROUND][0])
    if round_ != manifest.step:
        raise StateFileError(f"the state file holds round {round_}, its manifest names round {manifest.step}")
    views = {part: layout.flatten({name: tensors[f"{part}.{name}"] for name in layout.names})
             for part in ("params", "momentum")}
    state = GlobalState(layout, views["params"], views["momentum"], round_)
    digest = state_hash(state)
    if digest != bytes(tensors[HASH].tolist()):
        raise StateFileError(f"the round-{round_} state file's tensors do not hash to the state hash it carries")
    return state, digest
