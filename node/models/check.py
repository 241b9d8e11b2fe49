"""A model directory the user names (``join --model``, ``calibrate --model``, ``verify --checkpoint``,
``metagene eval --model``) checked before anything is built from it.

Without this check a bad directory surfaces only inside the engine: as a transformers traceback,
or in a running node as a role restarting forever. Worse, a ``config.json`` with a huge vocabulary
or width that its weights do not back makes transformers allocate and initialize the missing
parameters (terabytes). So: every JSON file is bounded before it is parsed, ``config.json`` is a
JSON object transformers accepts, the safetensors headers pass the safetensors library's own
checks (header length, offsets inside the file), and the model the config describes, built on the
meta device (nothing allocated), has no more parameters than the weight files hold values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from intellect_node.node.config.loader import read_json_bounded

MAX_CONFIG_BYTES = 1 << 20  # config.json of the largest HF models is a few KB
MAX_JSON_BYTES = 64 << 20  # tokenizer.json of a 256k vocabulary is about 35 MB
MAX_LAYERS = 1024  # above any released model; building more modules, even on meta, takes minutes
INDEX_FILE = "model.safetensors.index.json"


class ModelDirError(ValueError):
    """A model directory that cannot be loaded; the message names the file and what is wrong."""


def check_model_dir(path: Path) -> None:
    """Refuse (``ModelDirError``) a directory whose config, weights or tokenizer would fail to load
    or would allocate what its weight files do not hold."""
    if not path.is_dir():
        raise ModelDirError(f"{path}: not a directory")
    config = _read_json(path / "config.json", MAX_CONFIG_BYTES)
    for json_file in path.glob("*.json"):  # tokenizer and generation configs: transformers reads them whole
        try:
            size = json_file.stat().st_size
        except OSError as exc:
            raise ModelDirError(f"{json_file}: {exc}") from None
        if size > MAX_JSON_BYTES:
            raise ModelDirError(f"{json_file}: larger than {MAX_JSON_BYTES:,} bytes")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelDirError(f"{path / 'config.json'}: not an HF config (a JSON object with a model_type)")
    held = _weight_values(path)
    needed = _parameters(path)
    if needed > held:
        raise ModelDirError(f"{path / 'config.json'}: describes {needed:,} parameters but the safetensors files "
                            f"hold {held:,} values (a config that does not match its weights)")
    from transformers import AutoTokenizer

    _third_party(path, "tokenizer", lambda: AutoTokenizer.from_pretrained(path))


def _read_json(path: Path, limit: int) -> Any:
    try:
        return read_json_bounded(path, limit)
    except (OSError, ValueError) as exc:
        raise ModelDirError(f"{path}: {exc}") from None


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files transformers would load: the index's, else every ``*.safetensors``."""
    index = path / INDEX_FILE
    if not index.exists():
        return sorted(path.glob("*.safetensors"))
    weight_map = _read_json(index, MAX_JSON_BYTES)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(name, str) and name == Path(name).name for name in weight_map.values()):
        raise ModelDirError(f"{index}: no weight_map of file names in this directory")
    return [path / name for name in sorted(set(weight_map.values()))]


def _weight_values(path: Path) -> int:
    """How many values the weight files hold, each file's header checked by safetensors itself
    (read through an mmap: the tensors are not loaded)."""
    from safetensors import safe_open

    files = _weight_files(path)
    if not files:
        raise ModelDirError(f"{path}: no safetensors weights")
    total = 0
    for file in files:
        try:
            with safe_open(file, framework="pt") as weights:
                for name in weights.keys():
                    count = 1
                    for size in weights.get_slice(name).get_shape():
                        count *= size
                    total += count
        except Exception as exc:  # safetensors raises its own SafetensorError (an Exception) or OSError
            raise ModelDirError(f"{file}: not a readable safetensors file: {_line(exc)}") from None
    return total


def _parameters(path: Path) -> int:
    """The parameter count of the model ``config.json`` describes, built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = _third_party(path / "config.json", "config", lambda: AutoConfig.from_pretrained(path))
    layers = getattr(config, "num_hidden_layers", 0)
    if not isinstance(layers, int) or layers > MAX_LAYERS:
        raise ModelDirError(f"{path / 'config.json'}: num_hidden_layers {layers!r} (at most {MAX_LAYERS})")

    def count() -> int:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in model.parameters())

    return _third_party(path / "config.json", "model", count)


def _third_party(where: Path, what: str, load: Any) -> Any:
    """``load()``, whose failures on a hostile file come as any exception type transformers or
    tokenizers raise (OSError, ValueError, TypeError, KeyError, tokenizers' bare Exception, ...):
    each becomes a ``ModelDirError`` naming ``where``."""
    try:
        return load()
    except Exception as exc:
        raise ModelDirError(f"{where}: cannot load the {what}: {type(exc).__name__}: {_line(exc)}") from None


def _line(exc: BaseException) -> str:
    """An exception's message on one line, at most 300 characters: transformers' span several."""
    return " ".join(str(exc).split())[:300]
