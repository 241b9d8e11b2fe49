"""The ``[diloco] data`` spec, parsed and bounded: ``generated:...`` (a corpus every peer rebuilds
from the spec) or ``metagene:store=DIR[,seq_len=L]`` (a tokenized read store). Its own module, free of
torch, so a config's data line is checked without importing what loads the data (node/diloco/data.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
        values = spec_items(spec, "generated", {"sequences", "seq_len", "vocab", "seed"}, set(),
                            "'generated:...' or 'metagene:store=DIR[,seq_len=L]'")
        return cls(**{key: int(value) for key, value in values.items()})


@dataclass(frozen=True)
class MetageneSpec:
    store: Path
    seq_len: int = 512

    @classmethod
    def parse(cls, spec: str) -> MetageneSpec:
        values = spec_items(spec, "metagene", {"seq_len"}, {"store"}, "'metagene:store=DIR[,seq_len=L]'")
        if "store" not in values:
            raise ValueError(f"data spec {spec!r}: needs store=DIR "
                             f"(a directory written by `intellect-node metagene store`)")
        seq_len = int(values.get("seq_len", 512))
        if not 2 <= seq_len <= 4096:
            raise ValueError(f"data spec {spec!r}: seq_len {seq_len} outside 2..4096")
        return cls(Path(values["store"]).expanduser(), seq_len)


def parse_data(spec: str) -> CorpusSpec | MetageneSpec:
    """The ``[diloco] data`` spec, checked for syntax (the store itself is opened by ``open_data``)."""
    return MetageneSpec.parse(spec) if spec.startswith("metagene:") else CorpusSpec.parse(spec)
