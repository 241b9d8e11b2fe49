"""A GGUF file's header, read and checked before the model is dequantized.

transformers would report a bad file deep inside its loader (a numpy reshape error, a KeyError on a
metadata key) and only after allocating; these checks name the file and the fault first. The header
is read through ``gguf.GGUFReader``, which memory-maps the file, so nothing is loaded whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil
from gguf import GGUFReader

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# The architectures the project's engines run (TorchEngine's llama and qwen2), as GGUF names them.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
# Dequantized weights are float32; leave this much of the available memory for everything else.
MEMORY_HEADROOM = 0.8


class GGUFError(ValueError):
    """The file is not a GGUF model that can be imported; the message names the file."""


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    tensor_count: int
    parameters: int  # elements over all tensors, i.e. the imported model's parameter count
    file_bytes: int
    has_chat_template: bool

    @property
    def float32_bytes(self) -> int:
        return self.parameters * 4


def _field_str(reader: object, key: str) -> str | None:
    field = reader.fields.get(key)  # type: ignore[attr-defined]
    if field is None:
        return None
    try:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except (IndexError, UnicodeDecodeError):
        return None


def read_gguf_info(path: Path, check_memory: bool = True) -> GGUFInfo:
    """Read and check ``path``'s header; raise :class:`GGUFError` naming the file on any fault."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(8)
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read ({exc.strerror})") from None
    if head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (no GGUF magic at the start)")
    version = int.from_bytes(head[4:8], "little") if len(head) == 8 else -1
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version} not supported {SUPPORTED_VERSIONS}")
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # noqa: BLE001 - the reader raises ValueError, IndexError, struct errors on bad bytes
        raise GGUFError(f"{path}: unreadable or truncated GGUF header ({type(exc).__name__}: {exc})") from None
    architecture = _field_str(reader, "general.architecture")
    if architecture is None:
        raise GGUFError(f"{path}: no general.architecture in the GGUF metadata")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {architecture!r} not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if not reader.tensors:
        raise GGUFError(f"{path}: the file holds no tensors")
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size or tensor.data.size * tensor.data.itemsize < int(tensor.n_bytes):
            raise GGUFError(f"{path}: truncated: tensor {tensor.name} ends at byte {end}, file has {size}")
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise GGUFError(f"{path}: no tokenizer in the GGUF metadata (tokenizer.ggml.tokens)")
    info = GGUFInfo(
        path=path,
        architecture=architecture,
        name=_field_str(reader, "general.name") or path.stem,
        tensor_count=len(reader.tensors),
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        file_bytes=size,
        has_chat_template="tokenizer.chat_template" in reader.fields,
    )
    if check_memory:
        available = psutil.virtual_memory().available
        # transformers holds the dequantized tensors and the model at once: about twice float32
        needed = 2 * info.float32_bytes
        if needed > MEMORY_HEADROOM * available:
            raise GGUFError(
                f"{path}: {info.parameters / 1e6:.1f}M parameters need about {needed / 2**30:.1f} GiB "
                f"to dequantize; {available / 2**30:.1f} GiB available"
            )
    return info
