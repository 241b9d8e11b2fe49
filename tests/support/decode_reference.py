"""transformers' own decode loop over its ``DynamicCache`` beside the same loop on a
``StaticDecoder``: the reference the static decoder is held to (tests/test_static_decode.py) and
measured against (bench/decode.py). Both feed fixed tokens: decoding is compared, not sampling."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from intellect_node.node.engine.static_decode import StaticDecoder


def prompt_run(model: PreTrainedModel, prompts: list[list[int]]) -> tuple[torch.Tensor, DynamicCache]:
    """The prompts left-padded and run once by transformers, as the torch engine runs them: the
    attention mask [prompts, width] and the cache."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    cache = DynamicCache(config=model.config)
    model.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache, use_cache=True)
    return mask, cache


def feed(step: int, rows: int, model: PreTrainedModel) -> torch.Tensor:
    """The tokens fed at ``step``: fixed, different per row and step."""
    return ((torch.arange(rows) * 7 + step * 13) % model.config.vocab_size).to(model.device)


def transformers_decode(model: PreTrainedModel, prompts: list[list[int]], steps: int,
                        drop: dict[int, list[int]] | None = None) -> list[torch.Tensor]:
    """Each step's final-norm hidden states [live rows, hidden], the rows named in ``drop[step]``
    (indices into the rows live then) kept from that step on."""
    drop = drop or {}
    mask, cache = prompt_run(model, prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=model.device)
    states = []
    for step in range(steps):
        if step in drop:
            keep = torch.tensor(drop[step], device=model.device)
            cache.batch_select_indices(keep)
            mask, lengths = mask[keep], lengths[keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], 1)
        out = model.model(input_ids=feed(step, mask.shape[0], model)[:, None], attention_mask=mask,
                          position_ids=(lengths + step)[:, None], past_key_values=cache, use_cache=True)
        states.append(out.last_hidden_state[:, -1])
    return states


def static_decode(model: PreTrainedModel, prompts: list[list[int]], steps: int,
                  drop: dict[int, list[int]] | None = None, padded: bool = False,
                  cuda_graphs: bool = False) -> tuple[list[torch.Tensor], StaticDecoder]:
    """The same decode on a ``StaticDecoder`` (room for 8 rows or the prompts, 5 spare columns):
    each step's states (copies), and the decoder."""
    drop = drop or {}
    mask, cache = prompt_run(model, prompts)
    width = mask.shape[1]
    decoder = StaticDecoder(model, capacity=max(8, len(prompts)), length=width + steps + 5, padded=padded,
                            cuda_graphs=cuda_graphs)
    decoder.load_prompts(cache, mask, repeats=1)
    lengths = torch.tensor([len(p) for p in prompts], device=model.device)
    states = []
    for step in range(steps):
        if step in drop:
            keep = torch.tensor(drop[step], device=model.device)
            decoder.keep(keep)
            lengths = lengths[keep]
        states.append(decoder.step(feed(step, decoder.live, model), lengths + step, width + step).clone())
    return states, decoder
