"""GGUF -> HF layout (safetensors weights, config, tokenizer, chat template, generation config).

transformers dequantizes the GGUF into float32 tensors (its own loader, so the tensor-name mapping
and llama.cpp's Q/K permutation are undone the way transformers expects), then the model is made an
ordinary one again: a GGUF-loaded model keeps its quantizer and a ``quantization_config`` entry, and
``save_pretrained`` refuses to write it (and a saved entry would send every later load back to the
GGUF path). The result is written to a temporary sibling of ``out`` and renamed into place, so an
interrupted import never leaves a half-written model that a role would try to load.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from intellect_node.node.models.gguf_file import GGUFInfo, read_gguf_info

Progress = Callable[[str], None]


class ModelImportError(RuntimeError):
    """The import could not complete; the message names the file or directory."""


@dataclass(frozen=True)
class ImportReport:
    source: GGUFInfo
    out: Path
    parameters: int
    seconds: float
    chat_template: bool


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelImportError(f"{out}: already exists and is not an empty directory")


def import_gguf(path: Path, out: Path, progress: Progress = lambda _message: None) -> ImportReport:
    """Convert the GGUF file at ``path`` into an HF-layout model directory at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    path, out = Path(path), Path(out).expanduser()
    _check_out(out)
    info = read_gguf_info(path)
    progress(
        f"{path.name}: {info.architecture}, {info.tensor_count} tensors, "
        f"{info.parameters / 1e6:.1f}M parameters, {info.file_bytes / 2**20:.0f} MiB"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-", dir=out.parent))
    try:
        progress("dequantizing weights (transformers)")
        source = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name, "local_files_only": True}
        try:
            model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(**source)
        except Exception as exc:  # transformers' loader errors are many and unrelated in type
            raise ModelImportError(f"{path}: transformers could not load it ({type(exc).__name__}: {exc})") from exc
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
            model.config.pad_token_id = tokenizer.pad_token_id
        progress(f"writing safetensors, tokenizer and chat template to {out}")
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        parameters = sum(p.numel() for p in model.parameters())
        del model
        if out.exists():
            out.rmdir()  # checked empty above
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ImportReport(
        source=info,
        out=out,
        parameters=parameters,
        seconds=time.monotonic() - started,
        chat_template=tokenizer.chat_template is not None,
    )
