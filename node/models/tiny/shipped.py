"""The tiny model's shipped weights: one build of the default recipe, the same bytes on every machine.

Why ship bytes rather than build on first use (version 4): builds of the same recipe on different
CPUs round differently; the band on the demo's start (``build.START_BAND``) made every build start
near 0.15, but not learn alike. Two builds in the band, made on this project's 2-core machine
under its own (AVX-512) and AVX2 ATen kernels, read 0.85 and 0.71 held-out accuracy after 300
GRPO steps in one process, whichever kernels ran them: they start able to answer different prompt
forms, and GRPO cannot teach a form a build answers all wrong (bench/HISTORY.md, "Why the avx2
build learns slower"). So a user's first demo depended on their CPU. The build README's figures
were measured on is shipped here (``weights/``, 7 MB), checked against the hashes below on every
install; ``build.py`` still makes any recipe, and ``python -m intellect_node.node.models.tiny PATH
--rebuild`` rebuilds the default one from scratch (in the band, but other bytes on another CPU).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights")

# sha256 of every shipped file: an install that does not match (a damaged or edited package) is an
# error, not a model, since the swarm's checkpoint 0 is whatever the trainer loads.
SHIPPED_SHA256 = {
    "chat_template.jinja": "2d32605908b7596517ebc6381d69ae9663adfe9ac0df8498ded8bb58aafaeaa2",
    "config.json": "bc29816f69c2819f4342d15ed504d7670e09a08098463ed18e2ad6754cb6c121",
    "generation_config.json": "e9c42bd8c4e08af12d7090aa6d4ad66489ade8373cd9b7d49f651c60103ce14c",
    "model.safetensors": "6213ed282fc200227b37933ee8357fdb85e0995f1cdcdf3d6866c9cab2456cde",
    "tinymodel.json": "a0a8ffd6430eba6a601c60f289194ebc4455ba07a7edabaa389fcca7ff87f047",
    "tokenizer.json": "968a74c645469e5cda5c1f706b86fa636812a36c66fbc50fad187082208261cd",
    "tokenizer_config.json": "85a6452518ae1ce6a6e95e2397ba7200778ff4ffd2e36647342ff3ab7de3a077",
}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_shipped(target: Path) -> Path:
    """Copy the shipped weights into ``target`` (which must not exist yet), checking every file's
    hash on the copy, and return it. Raises ``RuntimeError`` naming the file that does not match."""
    target.mkdir(parents=True)
    for name, expected in SHIPPED_SHA256.items():
        copied = Path(shutil.copyfile(WEIGHTS / name, target / name))
        if file_sha256(copied) != expected:
            raise RuntimeError(f"the shipped tiny model's {name} does not match its recorded sha256 "
                               f"({WEIGHTS / name}): reinstall intellect-node")
    return target
