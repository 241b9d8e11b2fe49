"""The verifiable sampler (specs/sampling.md): pinned bits, the right distribution, replay of
honest tokens with a positive margin, and the same tokens whatever the threads and batch shape."""

from __future__ import annotations

import hashlib
import math
import os
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from intellect_node.node.engine.base import SamplingParams, derive_seed
from intellect_node.node.engine.calibration import NOISE_SAFETY, noise_of_flips
from intellect_node.node.engine.torch_engine import TorchEngine
from intellect_node.protocol.compiled import CompiledOn
from intellect_node.protocol.sampling import (
    FLIP_SUSPECT,
    Replay,
    _full_choice,
    _full_replay,
    first_failure,
    flip_test,
    gumbel,
    key_tensor,
    margins,
    margins_of_rows,
    poisson_at_least,
    position_key,
    sample,
)
from tests.support.engine_helpers import untrained_wide_tiny_model

M64 = (1 << 64) - 1


def reference_noise(key: int, token: int) -> float:
    """specs/sampling.md section 2 in plain Python integers."""
    z = ((key ^ token) + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return -math.log(-math.log(((z >> 11) + 0.5) * 2.0**-53))


def test_noise_is_pinned_bit_for_bit() -> None:
    digest = hashlib.sha256(b"intellect-node/sampling/race-key/v1" + struct.pack(">QQ", 1, 0)).digest()
    assert position_key(1, 0) == int.from_bytes(digest[:8], "big") == 0xBC83CB9398DA325B
    keys = [position_key(1, 0), (1 << 64) - 1, 0]  # including keys with the top bit set
    noise = gumbel(keys, 300)
    expected = torch.tensor([[reference_noise(k, t) for t in range(300)] for k in keys], dtype=torch.float64)
    assert torch.allclose(noise, expected, rtol=0, atol=1e-15)  # the integers exact; logs to an ulp


def test_draws_follow_the_temperature_and_top_p_distribution() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0, 1.5, 0.0, -3.0]])
    draws = 20000
    rows = logits.expand(draws, -1)
    counts = np.bincount(sample(rows, list(range(draws)), [3] * draws, 0.7, 1.0).numpy(), minlength=6)
    expected = torch.softmax(logits[0] / 0.7, dim=-1).numpy()
    assert np.abs(counts / draws - expected).max() < 0.015
    kept = sample(rows, list(range(draws)), [0] * draws, 1.0, 0.75).unique().tolist()
    assert kept == [0, 3]  # probabilities 0.49 + 0.30 reach 0.75: the top-p set is {0, 3}


def test_margins_of_rows_equal_each_rows_own_margins() -> None:
    """Completions raced together (one call per sampling setting) get each its own margins."""
    counts = [5, 0, 9, 1, 7]
    logits = torch.randn(sum(counts), 300, generator=torch.Generator().manual_seed(2))
    tokens = torch.randint(0, 300, (sum(counts),), generator=torch.Generator().manual_seed(3))
    replays = [Replay(seed=10 + i, temperature=0.8 if i % 2 else 1.0, top_p=0.9 if i < 3 else 1.0, slack=1e-3)
               for i in range(len(counts))]
    together = margins_of_rows(logits, tokens, replays, counts)
    at = 0
    for count, replay, got in zip(counts, replays, together, strict=True):
        np.testing.assert_array_equal(got.margins, margins(logits[at:at + count], tokens[at:at + count], replay))
        at += count
    with pytest.raises(ValueError):
        margins_of_rows(logits, tokens, replays, counts[:-1])


def test_replay_accepts_the_choice_and_names_the_first_forged_position() -> None:
    logits = torch.randn(40, 500, generator=torch.Generator().manual_seed(1))
    replay = Replay(seed=99, temperature=1.0, top_p=0.9, slack=1e-3)
    tokens = sample(logits, [99] * 40, list(range(40)), 1.0, 0.9)
    honest = margins(logits, tokens, replay)
    assert first_failure(honest, replay.slack) is None and honest.min() > 0
    forged = tokens.clone()
    forged[17] = logits[17].argmax() if forged[17] != logits[17].argmax() else logits[17].argsort()[-2]
    assert first_failure(margins(logits, forged, replay), replay.slack) == 17


@pytest.fixture(scope="module")
def engine() -> TorchEngine:
    return TorchEngine.from_checkpoint(untrained_wide_tiny_model())


def test_same_seed_same_tokens_on_threads_and_batch_sizes_and_replay_margin(engine: TorchEngine) -> None:
    """1 and 2 threads, generation batches of 1 to 64 rows: identical tokens; a prefill at other
    batch sizes replays every one exactly (smallest margin positive: no honest token needs slack)."""
    tokenizer = AutoTokenizer.from_pretrained(untrained_wide_tiny_model())
    prompts = [tokenizer.encode(text) for text in ("12 + 30 =", "reverse abc", "hello")]
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=40, seed=5, stop_token_ids=())
    runs = []
    try:
        for threads, rows in ((1, 1), (2, 64), (1, 7), (2, 16)):
            torch.set_num_threads(threads)
            engine.max_batch_rows = rows
            runs.append([c.token_ids for group in engine.generate(prompts, 8, params, capture_hidden=False)
                         for c in group])
    finally:
        torch.set_num_threads(2)
    assert all(run == runs[0] for run in runs)
    smallest = math.inf
    for rows in (5, 64):
        engine.max_batch_rows = rows
        replays = [Replay(derive_seed(5, i), 1.0, 0.95, 1e-3) for i in range(len(runs[0]))]
        results = engine.prefill([p for p in prompts for _ in range(8)], runs[0], replays)
        smallest = min(smallest, min(float(r.sampling_margins.min()) for r in results))
    assert smallest > 0


def _race_order(logits: torch.Tensor, seed: int, temperature: float) -> torch.Tensor:
    """Each position's tokens by race score, best first (top-p 1)."""
    keys = [position_key(seed, p) for p in range(logits.shape[0])]
    return (logits.double() / temperature + gumbel(keys, logits.shape[-1])).argsort(dim=-1, descending=True)


def test_the_gap_is_how_far_the_runner_up_is_behind() -> None:
    """The sampler's own choice has margin = gap; the runner-up claimed instead has margin = -gap."""
    logits = torch.randn(40, 500, generator=torch.Generator().manual_seed(4))
    replay = Replay(seed=9, temperature=0.7, top_p=1.0, slack=0.5)
    order = _race_order(logits, replay.seed, replay.temperature)
    chosen, runner_up = order[:, 0], order[:, 1]
    [exact] = margins_of_rows(logits, chosen, [replay], [40])
    [second] = margins_of_rows(logits, runner_up, [replay], [40])
    assert (exact.gaps > 0).all()
    np.testing.assert_allclose(exact.margins, exact.gaps)
    np.testing.assert_allclose(second.margins, -exact.gaps)
    np.testing.assert_array_equal(second.gaps, exact.gaps)


def test_the_compiled_race_is_the_eager_race() -> None:
    """What a GPU runs (protocol/compiled.py; forced onto the CPU here): the same choices, and the
    margins and gaps of the eager race to the logarithms' ulps, whatever the rows, vocabulary and
    temperature (one compile serves every shape), called from a worker thread as the validator does."""
    choice, replay = CompiledOn(_full_choice, {"cpu"}), CompiledOn(_full_replay, {"cpu"})
    generator = torch.Generator().manual_seed(11)
    results: list[str] = []

    def compare() -> None:
        for rows, vocab, temperature in ((40, 500, 0.7), (7, 3000, 1.0), (1, 2, 1.3)):
            logits = torch.randn(rows, vocab, generator=generator) * 3
            keys = key_tensor([position_key(rows, p) for p in range(rows)])
            chosen = choice(logits.device, logits, keys, temperature)
            assert torch.equal(chosen, _full_choice(logits, keys, temperature))
            claimed = torch.where(torch.arange(rows) % 2 == 0, chosen, torch.randint(0, vocab, (rows,)))
            got, want = replay(logits.device, logits, claimed, keys, temperature), _full_replay(
                logits, claimed, keys, temperature)
            for compiled, eager in zip(got, want, strict=True):
                torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-12)
        results.append("done")

    worker = threading.Thread(target=compare)
    worker.start()
    worker.join(600)
    assert results == ["done"] and choice.failed is None and replay.failed is None


def test_a_machine_that_cannot_compile_races_eagerly(tmp_path) -> None:
    """No working C++ compiler (or no triton on a GPU): one warning, the eager race's answer, and eager
    from then on; an error of the inputs is still raised, and does not switch compiling off."""
    script = tmp_path / "no_compiler.py"
    script.write_text(
        "import torch\n"
        "from intellect_node.protocol.compiled import CompiledOn\n"
        "from intellect_node.protocol.sampling import _full_choice, key_tensor, position_key\n"
        "choice = CompiledOn(_full_choice, {'cpu'})\n"
        "keys = key_tensor([position_key(3, p) for p in range(5)])\n"
        "try:\n"
        "    choice(torch.device('cpu'), torch.randn(4, 300), keys, 1.0)\n"
        "except RuntimeError:\n"
        "    print('bad rows raised; failed =', choice.failed)\n"
        "logits = torch.randn(5, 300)\n"
        "assert torch.equal(choice(logits.device, logits, keys, 1.0), _full_choice(logits, keys, 1.0))\n"
        "print('failed:', choice.failed)\n")
    env = {**os.environ, "CXX": "/bin/false", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bad rows raised; failed = None" in done.stdout
    assert "failed: InductorError" in done.stdout and "No working C++ compiler" in done.stdout
    assert done.stderr.count("runs eagerly: compiling it failed") == 1


def test_honest_noise_passes_the_flip_test_and_steering_near_ties_does_not() -> None:
    """A worker whose logits differ from the verifier's by noise flips about as many positions as
    the test expects at the scale calibrated on such honest flips (``noise_of_flips``, times the
    calibration's safety factor); one that takes the runner-up wherever it is close (inside a slack
    that admits the noise) flips far more and is caught."""
    noise, temperature = 0.05, 1.0
    generator = torch.Generator().manual_seed(5)
    honest, steered = [], []
    for seed in range(40):
        verifier = torch.randn(64, 800, generator=generator) * 3
        worker = verifier + torch.randn(64, 800, generator=generator) * (noise / np.sqrt(2))
        replay = Replay(seed=seed, temperature=temperature, top_p=1.0, slack=0.5)
        [replayed] = margins_of_rows(verifier, _race_order(worker, seed, temperature)[:, 0], [replay], [64])
        order = _race_order(verifier, seed, temperature)
        choice = torch.where(torch.from_numpy(replayed.gaps < 0.3), order[:, 1], order[:, 0])
        [cheat] = margins_of_rows(verifier, choice, [replay], [64])
        assert first_failure(cheat.margins, replay.slack) is None  # the slack alone would not catch it
        honest.append(replayed)
        steered.append(cheat)
    calibration, judged = honest[:20], honest[20:]  # the scale is measured on other groups than it judges
    gaps = np.concatenate([r.gaps for r in calibration])
    scale = NOISE_SAFETY * noise_of_flips(gaps, sum(int(np.count_nonzero(r.margins < 0)) for r in calibration))
    # "groups" of two 64-position rows: a group of the demo's shape has hundreds of positions
    assert min(flip_test(judged[i:i + 2], scale).p_value for i in range(0, 20, 2)) > 1e-3
    steered_tests = [flip_test(steered[i:i + 2], scale) for i in range(0, 40, 2)]
    assert sum(t.flips for t in steered_tests) >= 80 and max(t.p_value for t in steered_tests) < FLIP_SUSPECT


def test_the_poisson_tail() -> None:
    assert poisson_at_least(0, 3.0) == 1.0 and poisson_at_least(1, 0.0) == 0.0
    assert poisson_at_least(1, 0.5) == pytest.approx(1 - np.exp(-0.5))
    tail = sum(np.exp(-1.0) / math.factorial(i) for i in range(12, 40))  # summed upwards, no 1 - (1 - x) loss
    assert poisson_at_least(12, 1.0) == pytest.approx(tail, rel=1e-9) and 0 < tail < 1e-9
    assert poisson_at_least(10_000, 9_000.0) < 1e-20 < 0.4 < poisson_at_least(9_000, 9_000.0) < 0.6
