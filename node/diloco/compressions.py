"""The compressions a DiLoCo run may name, and each one's grid: levels ``Q`` (dense) or values kept
per chunk (sparse). Its own module, free of torch, so reading a ``[diloco]`` section or a signed run
spec checks the name without importing the grid's tensor code (specs/diloco.md section 4)."""

from __future__ import annotations

from intellect_node.protocol.run_spec import DILOCO_COMPRESSIONS

# fp16: the largest grid IEEE binary16 holds exactly (every integer up to 2048), so its integers
# travel in 2 bytes as OpenDiLoCo's fp16 all-reduce does, yet sum exactly (packing.py, tag 5)
DENSE = {"int4": 7, "int8": 127, "fp16": 2047, "int16": 32767}
SPARSE_LEVELS = 2  # 2-bit codes: -2, -1, 1, 2 (a zero is simply not sent)
SPARSE_PREFIX = "topk"  # topk<k>: k kept of each chunk of CHUNK elements
SPARSE = {name: int(name.removeprefix(SPARSE_PREFIX)) for name in DILOCO_COMPRESSIONS if name.startswith(SPARSE_PREFIX)}


def _levels_by_name(names: tuple[str, ...]) -> dict[str, int]:
    """``Q`` of every compression the protocol names, in its order. The wire names are the
    protocol's (a signed run spec carries one) and the levels are this grid's: a name either side
    lacks is an error when the module loads, so the two lists cannot drift apart."""
    dense = {name for name in names if name not in SPARSE}
    if dense != set(DENSE):
        raise RuntimeError(f"protocol DILOCO_COMPRESSIONS names dense grids {sorted(dense)}, "
                           f"node/diloco/compressions.py has levels for {sorted(DENSE)}")
    return {name: DENSE.get(name, SPARSE_LEVELS) for name in names}


LEVELS = _levels_by_name(DILOCO_COMPRESSIONS)


def levels_for(compression: str) -> int:
    try:
        return LEVELS[compression]
    except KeyError:
        raise ValueError(f"unknown compression {compression!r}; choose one of {', '.join(LEVELS)}") from None


def sparse_k(compression: str) -> int:
    """Values kept per chunk for a sparse compression; 0 for a dense one (every value sent)."""
    levels_for(compression)
    return SPARSE.get(compression, 0)
