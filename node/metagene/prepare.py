"""A node's tokenized store for ``join --role diloco --workload metagene --reads ...``, built once.

Why a cache keyed by content: a node re-joins a run many times (restarts, upgrades), and a store
costs a full parse, a tokenizer training and a tokenization of every read; rebuilding it each time
would also be a chance to build a different one. The key is sha256 over the inputs' content
(each file's bytes and its source label, in the order the store holds them), the tokenizer (a
given tokenizer's content, or the training settings) and the read filter; the store lives in
``<home>/metagene/stores/<key>``. It is built in a ``.partial`` directory and renamed when whole,
so a crash mid-build leaves nothing that looks complete. On reuse the store's digest
(node/metagene/digest.py) is recomputed from its files and compared with the one recorded at build
time: a store changed since is rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from intellect_node.node.metagene.build import TOKENIZER_DIR, ReadOptions, build_store, build_tokenizer
from intellect_node.node.metagene.dataset import TokenizedReads
from intellect_node.node.metagene.digest import store_digest, tokenizer_digest
from intellect_node.node.metagene.reads import expand_inputs, source_label

KEY_DOMAIN = b"intellect-node/metagene-inputs/v1\0"
MANIFEST = "prepared.json"
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class PreparedStore:
    """A store ready for ``metagene:store=<path>``, its content digest, and whether it was reused."""

    path: Path
    digest: bytes
    reused: bool
    reads: int
    tokens: int


def _file_digest(path: Path) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_READ_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None
    return h.digest()


def input_key(files: list[Path], tokenizer_dir: Path | None, options: ReadOptions, vocab: int,
              tokenizer_reads: int) -> str:
    """The cache key of a store built from ``files`` (hex sha256)."""
    tokenizer: Any = (tokenizer_digest(tokenizer_dir).hex() if tokenizer_dir is not None
                      else {"train": {"vocab": vocab, "max_reads": tokenizer_reads}})
    h = hashlib.sha256(KEY_DOMAIN + json.dumps({"filter": options.describe(), "tokenizer": tokenizer},
                                               sort_keys=True).encode())
    for path in files:
        label = source_label(path).encode()
        h.update(len(label).to_bytes(4, "big") + label + _file_digest(path))
    return h.hexdigest()


def _reuse(path: Path, log: Callable[[str], None]) -> PreparedStore | None:
    """The complete store at ``path`` if its files still hash to what was recorded, else None."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        store = TokenizedReads.load(path)
        digest = store_digest(path, store)
    except FileNotFoundError:
        return None
    except (OSError, KeyError, ValueError, TypeError) as exc:
        log(f"metagene store {path}: unreadable ({exc}); rebuilding it")
        return None
    if not isinstance(manifest, dict) or manifest.get("digest") != digest.hex():
        log(f"metagene store {path}: its content changed since it was built; rebuilding it")
        return None
    return PreparedStore(path, digest, True, len(store), int(store.offsets[-1]))


def prepare_store(reads: list[str], tokenizer_dir: Path | None, root: Path, options: ReadOptions, vocab: int,
                  tokenizer_reads: int, log: Callable[[str], None]) -> PreparedStore:
    """The store for these reads (and tokenizer) under ``root``: reused when one was built from the
    same content, else built (training the tokenizer first when none is given). ValueError
    (ReadFormatError included) or FileNotFoundError names the file or setting that was wrong."""
    from intellect_node.node.metagene.tokenizer import load_tokenizer

    files = expand_inputs(reads)
    given = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None  # checked before anything is built
    key = input_key(files, tokenizer_dir, options, vocab, tokenizer_reads)
    final = root / key[:32]
    reused = _reuse(final, log)
    if reused is not None:
        return reused
    partial = root / f"{key[:32]}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        names = [str(f) for f in files]
        if given is not None:
            tokenizer = given
        else:
            log(f"metagene: training the BPE tokenizer (vocabulary {vocab}) on up to {tokenizer_reads:,} reads")
            tokenizer, _ = build_tokenizer(names, options, vocab, tokenizer_reads, partial / TOKENIZER_DIR)
        log(f"metagene: tokenizing the reads of {len(files)} file(s) into {final}")
        report = build_store(names, tokenizer, options, partial)
        digest = store_digest(partial)
        (partial / MANIFEST).write_text(json.dumps({"key": key, "digest": digest.hex(), "inputs": names,
                                                    "tokenizer": str(tokenizer_dir) if tokenizer_dir else "trained",
                                                    "filter": options.describe(), "report": report}, indent=1))
        shutil.rmtree(final, ignore_errors=True)  # an unusable store of this key (the check above refused it)
        os.replace(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return PreparedStore(final, digest, False, report["reads"], report["tokens"])
