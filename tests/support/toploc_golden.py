"""Golden TOPLOC vectors: deterministic inputs, and the reference package's proofs for them.

The inputs are built from SHA-256 output by integer operations only (no RNG whose stream could
change between library versions), so the committed file ``tests/golden/toploc_reference.json``
pins the reference's bytes forever, also where the reference is not installed. Each case also
has a deterministic "recomputation" (mantissa low bits flipped here and there) and the figures
that the reference's C++ verifier reported for it against the golden proofs.

Regenerate (needs the reference: scripts/setup-reference.sh):
    .venv/bin/python -m tests.support.toploc_golden
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

GOLDEN_PATH = Path(__file__).parent.parent / "golden" / "toploc_reference.json"


@dataclass(frozen=True)
class Case:
    """One golden input: ``tokens`` x ``hidden`` bf16 values of the named ``kind``.

    kinds: ``binomial`` (exponents binomially spread: moderate ties), ``ties`` (exponents in a
    narrow band: around a hundred equal magnitudes at the top-k boundary), ``nan`` (binomial
    with inf and NaN planted in the first chunk, which sends that chunk down torch's path).
    """

    name: str
    kind: str
    tokens: int
    hidden: int
    chunk_size: int = 32
    topk: int = 128


CASES = (
    Case("binomial-70x512", "binomial", 70, 512),
    Case("ties-40x4096", "ties", 40, 4096),
    Case("nan-33x512", "nan", 33, 512),
    Case("small-10x64-c4-k16", "binomial", 10, 64, chunk_size=4, topk=16),
)


def _stream(label: str, count: int) -> np.ndarray:
    """``count`` pseudo-random u32 words from SHA-256(label, block index)."""
    blocks = -(-count // 8)
    data = b"".join(hashlib.sha256(f"{label}/{i}".encode()).digest() for i in range(blocks))
    return np.frombuffer(data, dtype="<u4")[:count].astype(np.int64)


def golden_input(case: Case) -> torch.Tensor:
    """The case's bf16 hidden states [tokens, hidden], built bit by bit."""
    count = case.tokens * case.hidden
    words = _stream(case.name, count)
    sign = (words >> 31) & 1
    mantissa = (words >> 24) & 0x7F
    if case.kind == "ties":
        exponent = 120 + (words & 0xFFFF) % 9
    else:
        low = words & 0xFFFFFF
        popcount = np.zeros_like(low)
        for bit in range(24):
            popcount += (low >> bit) & 1
        exponent = 115 + popcount
    bits = (sign << 15) | (exponent << 7) | mantissa
    if case.kind == "nan":
        first_chunk = case.chunk_size * case.hidden
        bits[: min(first_chunk, count) : 997] = 0x7F80  # +inf
        bits[5 : min(first_chunk, count) : 1499] = 0x7FC0  # NaN
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(torch.bfloat16).reshape(
        case.tokens, case.hidden
    )


def recomputed_input(case: Case) -> torch.Tensor:
    """A stand-in for an honest recomputation: the lowest mantissa bit flipped in 1 of 5 values."""
    bits = golden_input(case).view(torch.int16).numpy().copy().reshape(-1)
    flip = _stream(case.name + "/flip", bits.size) % 5 == 0
    bits[flip] ^= 1
    return torch.from_numpy(bits).view(torch.bfloat16).reshape(case.tokens, case.hidden)


def load() -> dict[str, dict[str, object]]:
    """The committed golden file: case name -> {"proofs": [hex], "figures": [[e, mean, median]]}."""
    return json.loads(GOLDEN_PATH.read_text())


def regenerate() -> None:
    """Write the golden file from the installed reference package (toploc 0.1.6)."""
    import toploc

    assert toploc.__version__ == "0.1.6", toploc.__version__
    out: dict[str, dict[str, object]] = {}
    for case in CASES:
        hidden = golden_input(case)
        proofs = toploc.build_proofs_bytes(hidden, case.chunk_size, case.topk, skip_prefill=True)
        results = toploc.verify_proofs_bytes(
            recomputed_input(case), proofs, case.chunk_size, case.topk, skip_prefill=True
        )
        out[case.name] = {
            "proofs": [p.hex() for p in proofs],
            "figures": [[r.exp_mismatches, r.mant_err_mean, r.mant_err_median] for r in results],
        }
    GOLDEN_PATH.parent.mkdir(exist_ok=True)
    GOLDEN_PATH.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    regenerate()
