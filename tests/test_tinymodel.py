"""The tiny model: HF layout, tokenizer coverage of the toy prompts, reuse, determinism."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from intellect_node.node.engine.base import encode_prompt
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.node.models.tiny import ensure_tiny_model
from intellect_node.node.models.tiny.build import RECIPE_FILE, _training_batch
from intellect_node.node.tasks.schema import filter_by_solve_rate, with_length_target
from intellect_node.node.tasks.solve_rate import measure_solve_rates
from intellect_node.node.tasks.toy import generate_toy_tasks
from tests.support.engine_helpers import QUICK_RECIPE, quick_tiny_model


def test_hf_layout_and_tokenizer() -> None:
    path = quick_tiny_model()
    for name in ("config.json", "model.safetensors", "tokenizer.json", RECIPE_FILE):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    tokenizer = AutoTokenizer.from_pretrained(path)
    for task in generate_toy_tasks(seed=3, count=20):
        prompt = with_length_target(task, 128).prompt
        ids = encode_prompt(tokenizer, prompt)
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == prompt + "\n"
        assert len(ids) <= 30, "the BPE merges the fixed prompt words"
        answer = task.verification_info["answer"]
        assert len(tokenizer.encode(answer, add_special_tokens=False)) == len(answer)  # digits
    # any text still encodes (byte-level): nothing is unknown
    text = "Unicode ∑ and emoji 🙂 survive"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_reuse_and_recipe_check() -> None:
    path = quick_tiny_model()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(path, QUICK_RECIPE) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    with pytest.raises(ValueError, match="another recipe"):
        ensure_tiny_model(path, dataclasses.replace(QUICK_RECIPE, train_steps=1))


def test_build_is_deterministic(tmp_path: Path) -> None:
    recipe = dataclasses.replace(QUICK_RECIPE, train_steps=3)
    first = load_file(ensure_tiny_model(tmp_path / "a", recipe) / "model.safetensors")
    second = load_file(ensure_tiny_model(tmp_path / "b", recipe) / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_training_lowers_the_answer_loss(tmp_path: Path) -> None:
    untrained = ensure_tiny_model(tmp_path / "u", dataclasses.replace(QUICK_RECIPE, train_steps=0))
    trained = quick_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(trained)
    ids, mask, labels = _training_batch(random.Random(99), QUICK_RECIPE, tokenizer)
    losses = []
    for path in (untrained, trained):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            losses.append(float(model(input_ids=ids, attention_mask=mask, labels=labels).loss))
    assert losses[1] < losses[0] - 1.0


def test_solve_rates_feed_the_offline_filter() -> None:
    """Measured with the model itself: rates in [0, 1] in steps of 1/samples, reproducible."""
    path = quick_tiny_model()
    engine = TorchEngine.from_checkpoint(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = generate_toy_tasks(seed=5, count=6)
    rated = measure_solve_rates(engine, tokenizer, tasks, samples=4)
    assert [t.problem_id for t in rated] == [t.problem_id for t in tasks]
    assert all(t.solve_rate is not None and t.solve_rate * 4 in range(5) for t in rated)
    assert rated == measure_solve_rates(engine, tokenizer, tasks, samples=4)
    band = filter_by_solve_rate(rated, 0.25, 0.75)
    assert all(0.25 <= t.solve_rate <= 0.75 for t in band)
