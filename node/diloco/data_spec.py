"""The ``[diloco] data`` spec's items, and the toy LM's ``generated:...`` spec (a corpus every peer
rebuilds from the spec) parsed and bounded; another workload's spec (``metagene:store=DIR``) is its
own (``workload``). Free of torch, so a config's data line is checked without importing what loads
the data (node/diloco/data.py)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SEQUENCES = 1 << 24


def spec_items(spec: str, kind: str, numeric: set[str], text: set[str], expected: str) -> dict[str, str]:
    """The ``key=value`` items of a ``kind:key=value,...`` data spec: only the named keys, whole
    numbers for ``numeric``, a clear error naming the item otherwise."""
    head, _, rest = spec.partition(":")
    if head != kind:
        raise ValueError(f"data spec {spec!r}: expected {expected}")
    values: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in numeric | text or not value or (key in numeric and not value.isdigit()):
            raise ValueError(f"data spec {spec!r}: bad item {item!r} (keys: {', '.join(sorted(numeric | text))})")
        values[key] = value
    return values


@dataclass(frozen=True)
class CorpusSpec:
    sequences: int = 4096
    seq_len: int = 64
    vocab: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if not (1 <= self.sequences <= MAX_SEQUENCES and 2 <= self.seq_len <= 4096 and 8 <= self.vocab <= 65536
                and 0 <= self.seed < 2**32):
            raise ValueError(f"corpus out of bounds: {self}")

    @classmethod
    def parse(cls, spec: str) -> CorpusSpec:
        """``generated:key=value,...`` with keys sequences, seq_len, vocab, seed."""
        values = spec_items(spec, "generated", {"sequences", "seq_len", "vocab", "seed"}, set(), "'generated:...'")
        return cls(**{key: int(value) for key, value in values.items()})
