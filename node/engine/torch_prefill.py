"""The torch engine's verification prefill of one batch: the positions the generation captured,
computed the way the generation computed them.

Each distinct prompt runs once (a GRPO group's rows share one), its cache is repeated for the rows
that continue it, and only ``completion[:-1]`` runs per row, at the positions the generation gave
those tokens; the output head then runs over whole completions a bounded number of positions at a
time. Why a module of its own: generation and verification are the engine's two jobs, and the
verifier's half is the one a reader checking TOPLOC or the sampling replay needs to read.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from intellect_node.node.engine.base import PrefillResult
from intellect_node.protocol.sampling import Replay, margins_of_rows

if TYPE_CHECKING:
    from intellect_node.node.engine.torch_engine import TorchEngine

HEAD_ELEMENTS = 1 << 24  # verification logits at once: 64 MiB of float32 (a row of positions at least)
GPU_HEAD_ELEMENTS = 1 << 26  # on a GPU (256 MiB): fewer head calls, each with its sync back to the CPU


def prefill_batch(
    engine: TorchEngine,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    batch: list[int],
    replays: Sequence[Replay] | None,
) -> list[PrefillResult]:
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of_row = [distinct.setdefault(tuple(prompts[i]), len(distinct)) for i in batch]
    prompt_states, mask, cache = engine.run_prompts(list(distinct))
    rows = torch.tensor(prompt_of_row, device=engine.device)
    # completion[:-1] per row, right-padded after the prompt's columns, at positions len(prompt) + j
    tails = [list(completions[i])[:-1] for i in batch]
    tail_width = max(len(t) for t in tails)
    tail_states = None
    if tail_width:
        cache.batch_select_indices(rows)  # each row continues its prompt's cache
        tail_ids = torch.full((len(batch), tail_width), engine.pad_id, dtype=torch.long, device=engine.device)
        tail_mask = torch.zeros((len(batch), tail_width), dtype=torch.long, device=engine.device)
        for row, tail in enumerate(tails):
            tail_ids[row, : len(tail)] = torch.tensor(tail, dtype=torch.long, device=engine.device)
            tail_mask[row, : len(tail)] = 1
        lengths = torch.tensor([len(prompts[i]) for i in batch], device=engine.device)
        positions = lengths[:, None] + torch.arange(tail_width, device=engine.device)[None, :]
        tail_states = engine.model.model(input_ids=tail_ids,
                                       attention_mask=torch.cat([mask.index_select(0, rows), tail_mask], 1),
                                       position_ids=positions, past_key_values=cache,
                                       use_cache=True).last_hidden_state
    # the state before completion token j: the prompt's last for j = 0, tail token j - 1's after
    states = prompt_states.index_select(0, rows)[:, None]
    if tail_states is not None:
        states = torch.cat([states, tail_states], dim=1)
    counts = [len(completions[i]) for i in batch]
    valid = (torch.arange(states.shape[1], device=engine.device)[None, :]
             < torch.tensor(counts, device=engine.device)[:, None])
    flat = states[valid]  # row by row: each completion's positions in order
    hidden = flat.to("cpu", copy=True)
    bounds = [0, *itertools.accumulate(counts)]
    results = []
    budget = GPU_HEAD_ELEMENTS if engine.device.type == "cuda" else HEAD_ELEMENTS
    for first, last in _spans(counts, max(1, budget // engine.vocab_size)):
        part = flat[bounds[first] : bounds[last]]  # the head over whole completions, a bounded number of positions
        targets = torch.tensor([t for i in batch[first:last] for t in completions[i]], dtype=torch.long,
                               device=engine.device)
        logits = engine.head(part)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0].cpu()
        replayed = (margins_of_rows(logits, targets, [replays[i] for i in batch[first:last]],
                                    counts[first:last])
                    if replays is not None else [None] * (last - first))
        for row, replay in zip(range(first, last), replayed, strict=True):
            a, b = bounds[row] - bounds[first], bounds[row + 1] - bounds[first]
            results.append(PrefillResult(hidden_states=hidden[bounds[row] : bounds[row + 1]],
                                         logprobs=logprobs[a:b],
                                         sampling_margins=None if replay is None else replay.margins,
                                         sampling_gaps=None if replay is None else replay.gaps))
    return results




def _spans(counts: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive index ranges ``[first, last)`` of ``counts`` whose sum stays within ``budget``
    (a range holds at least one item, however large)."""
    spans, first, total = [], 0, 0
    for index, count in enumerate(counts):
        if index > first and total + count > budget:
            spans.append((first, index))
            first, total = index, 0
        total += count
    if first < len(counts):
        spans.append((first, len(counts)))
    return spans
