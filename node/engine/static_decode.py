"""Decode steps over a KV cache allocated once, for the torch engine's per-token loop.

transformers' ``DynamicCache`` grows every layer's keys and values by concatenation each step (a
copy of the whole cache per token: a fifth of a CPU decode step on the tiny model), and its
forward rebuilds masks and cache bookkeeping in Python per step. A GPU decoding a 135M model is
bound by that Python and by kernel launches, not by arithmetic (bench/HISTORY.md, "Real model on
a GPU"): the cure vLLM uses is one CUDA graph per batch size, replayed each step, which needs
every tensor the step touches at a fixed address and every shape fixed.

``StaticDecoder`` is that step, for HF-layout Llama and Qwen2 decoders with full attention. It
runs the model's own modules (embedding, norms, projections, MLPs, rotary table) in their order,
with the attention written here: the new token's key and value go into column ``column`` of
buffers sized ``capacity x length`` once, and each query attends over its row's valid columns.
Grouped-query attention folds a key/value head's query heads into that head's query rows (the
same products as repeating the keys, without copying them), so any SDPA kernel serves it.

Two shapes of the same step:

- **exact** (the CPU default): the step runs on the live rows only and attends over the columns
  written so far, so no work is spent on finished rows or future columns;
- **padded** (the GPU default): the live rows are padded to a power of two and every step attends
  over the full length with the future columns masked, so a step has one shape per row bucket.
  On CUDA each bucket's step is captured once as a CUDA graph and replayed; elsewhere the same
  padded step runs eagerly (how the tests check it on a CPU).

Rows that finish are dropped by moving the live rows to the front of every buffer (``keep``):
the buffers never move, so graphs captured on their leading rows stay valid.
"""

from __future__ import annotations

import logging
import threading

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

log = logging.getLogger(__name__)

# one capture at a time in the process: captures share torch's default capture stream, and engines
# of several roles (inference, validator, trainer) may share one GPU from different threads
_CAPTURING = threading.Lock()
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rotary tables fixed at load: no sync per step


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the HF layout (the two halves of each head rotated against each other)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def bucket_rows(rows: int, capacity: int) -> int:
    """The padded step's row count for ``rows`` live rows: the next power of two, at most ``capacity``."""
    return min(capacity, 1 << max(0, rows - 1).bit_length())


class StaticDecoder:
    """One token per live row per ``step``, over caches of ``capacity`` rows and ``length`` columns.

    ``load_prompts`` fills the cache from a prompt run (left-padded, ``width`` columns), then each
    ``step`` feeds the rows' chosen tokens at ``column`` (the same for every row: prompts are
    left-padded) and returns their final-norm hidden states, valid until the next call.
    """

    def __init__(
        self, model: PreTrainedModel, capacity: int, length: int, padded: bool, cuda_graphs: bool = False
    ) -> None:
        config = model.config
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError(f"static decoding supports full attention only, not {sorted(kinds)}")
        base = model.model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.layers = list(base.layers)
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        attention = self.layers[0].self_attn
        self.head_dim = int(attention.head_dim)
        self.kv_heads = int(config.num_key_value_heads)
        self.groups = int(config.num_attention_heads) // self.kv_heads
        self.scale = float(attention.scaling)
        self.capacity, self.length, self.padded = capacity, length, padded
        # dynamic and long-context rotary tables look at the positions on the CPU: not capturable
        rope = str(getattr(self.rotary, "rope_type", "default"))
        self.cuda_graphs = cuda_graphs and padded and self.device.type == "cuda" and rope in STATIC_ROPE
        shape = (capacity, self.kv_heads, length, self.head_dim)
        # zeros, not empty: padding rows are computed too (their results are dropped; zeros keep them finite)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.valid = torch.zeros((capacity, length), dtype=torch.bool, device=self.device)  # real columns
        self.columns = torch.arange(length, device=self.device)
        self.ids = torch.zeros(capacity, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(capacity, dtype=torch.long, device=self.device)
        self.column = torch.zeros(1, dtype=torch.long, device=self.device)
        self.hidden = torch.zeros((capacity, int(config.hidden_size)), dtype=self.dtype, device=self.device)
        self.live = 0
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None

    def load_prompts(self, cache: DynamicCache, mask: torch.Tensor, repeats: int) -> None:
        """Take a prompt run's cache (``mask``: [prompts, width], 1 on real tokens), each prompt's
        row repeated ``repeats`` times, as the first ``width`` columns of the first rows."""
        prompts, width = mask.shape
        rows = prompts * repeats
        if rows > self.capacity or width >= self.length:
            raise ValueError(f"{rows} rows x {width} columns do not fit {self.capacity} x {self.length}")
        for layer, keys, values in zip(cache.layers, self.keys, self.values, strict=True):
            keys[:rows, :, :width] = layer.keys.repeat_interleave(repeats, dim=0)
            values[:rows, :, :width] = layer.values.repeat_interleave(repeats, dim=0)
        self.valid[:rows, :width] = mask.repeat_interleave(repeats, dim=0).bool()
        self.valid[:, width:] = True  # generated columns: each step attends up to its own
        if self.padded:
            # a padded step reads every column, masked or not, and a masked inf is still a NaN
            # (0 x inf): an earlier call's columns must not reach this one
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[:, :, width:] = 0
                values[:, :, width:] = 0
        self.positions.zero_()  # padding rows' positions stay 0 (rotary tables that scale by the largest)
        self.live = rows

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these live rows (indices into the live rows, in order), moved to the front."""
        for buffer in (*self.keys, *self.values, self.valid, self.positions):
            buffer[: rows.numel()] = buffer[: self.live].index_select(0, rows)
        self.positions[rows.numel():] = 0
        self.live = rows.numel()

    def step(self, ids: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """Run the live rows' tokens ``ids`` at ``positions`` into ``column``; their hidden states."""
        if ids.shape[0] != self.live:
            raise ValueError(f"{ids.shape[0]} tokens for {self.live} live rows")
        if not 0 <= column < self.length:
            raise ValueError(f"column {column} outside the cache's {self.length}")
        self.ids[: self.live] = ids
        self.positions[: self.live] = positions
        self.column.fill_(column)
        if self.padded:
            rows = bucket_rows(self.live, self.capacity)
            if self.cuda_graphs:
                self._replay(rows)
            else:
                self._forward(rows, self.length)
        else:
            self._forward(self.live, column + 1)
        return self.hidden[: self.live]

    def _forward(self, rows: int, end: int) -> None:
        """The step on the first ``rows`` rows, attending over columns ``[0, end)``."""
        x = self.embed(self.ids[:rows, None])  # [rows, 1, hidden]
        cos, sin = self.rotary(x, self.positions[:rows, None])
        cos, sin = cos[:, None], sin[:, None]  # [rows, 1, 1, head_dim] against [rows, heads, 1, head_dim]
        attend = (self.valid[:rows, :end] & (self.columns[:end] <= self.column))[:, None, None, :]
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            attention = layer.self_attn
            h = layer.input_layernorm(x)
            q = attention.q_proj(h).view(rows, 1, -1, self.head_dim).transpose(1, 2)
            k = attention.k_proj(h).view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attention.v_proj(h).view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            keys[:rows].index_copy_(2, self.column, k)
            values[:rows].index_copy_(2, self.column, v)
            # query head h reads key/value head h // groups: its group's heads become that head's query rows
            q = q.reshape(rows, self.kv_heads, self.groups, self.head_dim)
            out = F.scaled_dot_product_attention(
                q, keys[:rows, :, :end], values[:rows, :, :end], attn_mask=attend, scale=self.scale
            )
            x = x + attention.o_proj(out.reshape(rows, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.hidden[:rows] = self.norm(x)[:, 0]

    def _replay(self, rows: int) -> None:
        """The padded step for ``rows`` rows as a CUDA graph, captured on first use. A step that
        cannot be captured (a model whose modules synchronise with the CPU) runs eagerly from
        then on, with a warning: slower, never wrong."""
        graph = self._graphs.get(rows)
        if graph is None:
            stream = torch.cuda.current_stream()
            try:
                with _CAPTURING:
                    graph = self._capture(rows)
            except RuntimeError as error:  # torch.AcceleratorError and OutOfMemoryError are RuntimeErrors
                # a capture that fails part-way can leave this thread on the capture stream
                torch.cuda.set_stream(stream)
                log.warning("CUDA graph capture failed (%s); decoding without graphs", error)
                self.cuda_graphs = False
                self._forward(rows, self.length)
                return
            self._graphs[rows] = graph
        graph.replay()

    def _capture(self, rows: int) -> torch.cuda.CUDAGraph:
        # warm-up on a side stream (kernels chosen, workspaces allocated) as torch.cuda.graphs asks;
        # it writes the same key and value the real step writes, so running it is harmless
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(rows, self.length)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads' allocations and syncs (other roles' engines) do not break it
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._forward(rows, self.length)
        self._pool = graph.pool()
        return graph
