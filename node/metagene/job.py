"""The ``[metagene]`` config section, with ``join``'s ``--reads`` and ``--tokenizer`` on top: which
reads a DiLoCo node pretrains on and how they become its store (node/metagene/prepare.py).

Why a section of its own rather than keys of ``[diloco]``: the DiLoCo role trains on whatever its
``data`` spec names; how reads are filtered and tokenized is this workload's concern, and the
same keys mean the same as the ``metagene tokenizer``/``store`` flags. Loaded by node/config's
``load_section`` (environment ``INTELLECT_NODE_METAGENE_<KEY>``); unknown keys and values of the
wrong kind are errors naming the file and the key, and a job with no reads is refused here.

    [metagene]
    reads = ["/data/run42/*.fastq.gz"]   # files, directories or globs
    tokenizer = "/data/metagene-tok"     # optional: a `metagene tokenizer` directory; else trained
    vocab = 1024                         # when trained
    tokenizer_reads = 200000             # when trained: reads it is trained on
    min_quality = 20.0                   # mean Phred; 0 turns the filter off
    max_n = 0.1
    min_length = 32
    on_bad = "error"                     # or "skip": a read with letters other than ACGTN and IUPAC codes
    seq_len = 512                        # tokens per packed training row
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from intellect_node.node.config.base import ConfigError, check_bounds
from intellect_node.node.metagene.build import ReadOptions
from intellect_node.node.metagene.filtering import FilterConfig
from intellect_node.node.metagene.tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class MetageneJob:
    reads: tuple[str, ...] = ()
    tokenizer: str = ""  # "": train one on the reads
    vocab: int = VOCAB_SIZE
    tokenizer_reads: int = 200_000
    min_quality: float = 20.0
    max_n: float = 0.1
    min_length: int = 32
    on_bad: str = "error"
    seq_len: int = 512

    def __post_init__(self) -> None:
        if not self.reads:
            raise ConfigError("the metagene workload needs reads: --reads PATH|DIR|GLOB or [metagene] reads")
        check_bounds("[metagene]", self, {
            "reads": 0 < len(self.reads) <= 4096 and all(0 < len(r) <= 4096 for r in self.reads),
            "tokenizer": len(self.tokenizer) <= 4096, "vocab": 16 <= self.vocab <= 65536,
            "tokenizer_reads": 1 <= self.tokenizer_reads <= 10_000_000, "min_quality": 0 <= self.min_quality <= 93,
            "max_n": 0 <= self.max_n <= 1, "min_length": 1 <= self.min_length <= 1 << 20,
            "on_bad": self.on_bad in ("error", "skip"), "seq_len": 2 <= self.seq_len <= 4096})

    @property
    def tokenizer_dir(self) -> Path | None:
        return Path(self.tokenizer).expanduser() if self.tokenizer else None

    def read_options(self) -> ReadOptions:
        return ReadOptions(FilterConfig(min_length=self.min_length, max_n_fraction=self.max_n,
                                        min_mean_quality=self.min_quality), self.on_bad)  # type: ignore[arg-type]

    def data_spec(self, store: Path) -> str:
        """The DiLoCo ``data`` spec of a store (``workload``: items are comma-separated)."""
        if "," in str(store) or "=" in str(store):
            raise ValueError(f"{store}: a store path with ',' or '=' cannot be named in a data spec; "
                             "use another --home")
        return f"metagene:store={store},seq_len={self.seq_len}"
