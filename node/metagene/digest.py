"""The content hash of a tokenized read store: what DiLoCo peers of one run must agree on.

Why: peers average pseudo-gradients of one model; if one of them trained on ids from another
tokenizer (or on other reads), its update means something else and poisons the average. So the
store's digest (tokenizer + token ids) joins the model's layout in the digest that every member
of a round signs and that the others compare (node/diloco/layout.py ``run_digest``); a peer with
another store is refused at matchmaking. Computed from the files every time a store is opened, not
read from a manifest, so a store edited after it was built cannot claim another's digest.

Covered: the tokenizer's model (vocabulary, merges, specials: its ``tokenizer.json`` parsed and
re-serialised with sorted keys, so formatting does not matter), and each read's token ids
(``offsets`` and ``tokens`` as little-endian bytes). Not covered: the per-read source labels, which
only evaluation uses.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from intellect_node.node.config.loader import read_json_bounded
from intellect_node.node.metagene.build import TOKENIZER_DIR
from intellect_node.node.metagene.dataset import TokenizedReads
from intellect_node.node.metagene.tokenizer import MAX_TOKENIZER_BYTES

DOMAIN = b"intellect-node/metagene-store/v1\0"
_CHUNK = 1 << 22  # elements hashed at a time: bounded memory on a memory-mapped store


def tokenizer_digest(tokenizer_dir: Path) -> bytes:
    """sha256 of a saved tokenizer's canonical ``tokenizer.json``; ValueError names the file."""
    path = tokenizer_dir / "tokenizer.json"
    try:
        canonical = json.dumps(read_json_bounded(path, MAX_TOKENIZER_BYTES), sort_keys=True, separators=(",", ":"))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (a METAGENE tokenizer directory holds one; a store carries its "
                         f"tokenizer in {TOKENIZER_DIR}/)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    return hashlib.sha256(b"tokenizer\0" + canonical.encode()).digest()


def _update(h: "hashlib._Hash", array: np.ndarray, dtype: str) -> None:
    for start in range(0, len(array), _CHUNK):
        h.update(np.ascontiguousarray(array[start:start + _CHUNK]).astype(dtype, copy=False).tobytes())


def store_digest(store_dir: Path, store: TokenizedReads | None = None) -> bytes:
    """sha256 over the store's tokenizer and token ids (``store``: the store at ``store_dir``,
    already loaded)."""
    store = store if store is not None else TokenizedReads.load(store_dir)
    h = hashlib.sha256(DOMAIN + tokenizer_digest(store_dir / TOKENIZER_DIR))
    h.update(len(store).to_bytes(8, "big"))
    _update(h, store.offsets, "<i8")
    _update(h, store.tokens, "<u2")
    return h.digest()
