"""A tiny Llama-shaped decoder for the TOPLOC tests: real attention, RoPE, SwiGLU and RMSNorm.

TOPLOC must tell honest recomputation (other batch shapes, thread counts, kernels, precision)
from cheating (other or perturbed weights, other prompts, other layers). A single random
matrix cannot show that: the differences that matter come from how rounding propagates through
layers, attention and the final norm. This model is small enough for CPU tests (about 10M
parameters at the default size) and has the parts that shape those differences.

``generate`` plays the inference worker: token-by-token decoding with a KV cache, recording the
final hidden state (after the last norm) of every generated token. ``recompute`` plays the
validator: one forward pass over prompt + completion, with knobs for the honest variations
(batch, split matmuls, dtype) and for the cheats (which layer's states are returned).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 512
    hidden: int = 512
    layers: int = 3
    heads: int = 8
    mlp: int = 1408
    eps: float = 1e-5
    rope_theta: float = 10000.0
    # Trained Llama models have token embeddings far smaller than the residual stream they feed,
    # so hidden states depend on the context, not mostly on the current token as they would with
    # unit-scale random embeddings. That context dependence is what makes a changed prompt
    # visible, so the test model keeps it.
    embed_scale: float = 0.1


class TinyLlama:
    """Weights as plain tensors; ``seed`` fixes them so that two instances are the same model."""

    def __init__(self, config: TinyConfig = TinyConfig(), *, seed: int = 0) -> None:
        self.config = config
        gen = torch.Generator().manual_seed(seed)
        h, m = config.hidden, config.mlp

        def linear(out_dim: int, in_dim: int) -> torch.Tensor:
            return torch.randn(out_dim, in_dim, generator=gen) / math.sqrt(in_dim)

        def norm() -> torch.Tensor:
            return 1.0 + 0.1 * torch.randn(h, generator=gen)

        self.embed = config.embed_scale * torch.randn(config.vocab, h, generator=gen)
        self.blocks = [
            {
                "attn_norm": norm(),
                "q": linear(h, h),
                "k": linear(h, h),
                "v": linear(h, h),
                "o": linear(h, h),
                "mlp_norm": norm(),
                "gate": linear(m, h),
                "up": linear(m, h),
                "down": linear(h, m),
            }
            for _ in range(config.layers)
        ]
        self.final_norm = norm()

    def perturbed(self, relative: float, *, seed: int) -> TinyLlama:
        """A copy whose every weight has noise of ``relative`` times that tensor's RMS added."""
        gen = torch.Generator().manual_seed(seed)
        twin = TinyLlama.__new__(TinyLlama)
        twin.config = self.config

        def jitter(t: torch.Tensor) -> torch.Tensor:
            rms = t.pow(2).mean().sqrt()
            return t + relative * rms * torch.randn(t.shape, generator=gen)

        twin.embed = jitter(self.embed)
        twin.blocks = [{name: jitter(w) for name, w in block.items()} for block in self.blocks]
        twin.final_norm = jitter(self.final_norm)
        return twin

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        start: int = 0,
        cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        dtype: torch.dtype = torch.float32,
        split: int = 1,
        layer: int | None = None,
    ) -> torch.Tensor:
        """Hidden states [batch, len, hidden] for ``tokens`` [batch, len] at positions ``start``...

        ``cache`` (one (k, v) pair per layer, grown in place) holds earlier positions;
        ``split`` computes every projection as a sum over that many slices of its input
        dimension (another accumulation order, as another kernel would); ``layer`` stops after
        that many blocks and returns their output through the final norm (a worker skipping
        the last layers would hand in exactly that).
        """
        c = self.config
        head_dim = c.hidden // c.heads
        x = self.embed.to(dtype)[tokens]
        batch, length, _ = x.shape
        positions = torch.arange(start, start + length)
        cos, sin = _rope(positions, head_dim, c.rope_theta, dtype)
        for index, block in enumerate(self.blocks):
            if layer is not None and index == layer:
                break
            w = {name: t.to(dtype) for name, t in block.items()}
            hn = _rms_norm(x, w["attn_norm"], c.eps)
            q = _proj(hn, w["q"], split).view(batch, length, c.heads, head_dim).transpose(1, 2)
            k = _proj(hn, w["k"], split).view(batch, length, c.heads, head_dim).transpose(1, 2)
            v = _proj(hn, w["v"], split).view(batch, length, c.heads, head_dim).transpose(1, 2)
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
            if cache is not None:
                if len(cache) > index:
                    k = torch.cat([cache[index][0], k], dim=2)
                    v = torch.cat([cache[index][1], v], dim=2)
                    cache[index] = (k, v)
                else:
                    cache.append((k, v))
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
            total = k.shape[2]
            causal = torch.arange(total)[None, :] > (positions[:, None])
            scores = scores.masked_fill(causal, float("-inf"))
            attn = torch.softmax(scores.float(), dim=-1).to(dtype) @ v
            attn = attn.transpose(1, 2).reshape(batch, length, c.hidden)
            x = x + _proj(attn, w["o"], split)
            hn = _rms_norm(x, w["mlp_norm"], c.eps)
            gated = torch.nn.functional.silu(_proj(hn, w["gate"], split)) * _proj(hn, w["up"], split)
            x = x + _proj(gated, w["down"], split)
        return _rms_norm(x, self.final_norm.to(dtype), c.eps)

    def generate(self, prompt: torch.Tensor, new_tokens: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``new_tokens`` after ``prompt`` [len] with a KV cache in fp32, as a worker would.

        Returns (completion [new_tokens], hidden [new_tokens, hidden]): row j is the final
        hidden state at the position of completion token j, computed when that token was fed.
        """
        gen = torch.Generator().manual_seed(seed)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        h = self.forward(prompt[None], cache=cache)[0, -1]
        position = prompt.numel()
        completion, states = [], []
        for _ in range(new_tokens):
            logits = h.float() @ self.embed.T / (self.config.embed_scale * self.config.hidden**0.5)
            probs = torch.softmax(logits, dim=-1)
            token = torch.multinomial(probs, 1, generator=gen)
            completion.append(token)
            h = self.forward(token[None], start=position, cache=cache)[0, -1]
            states.append(h)
            position += 1
        return torch.cat(completion), torch.stack(states)

    def recompute(
        self,
        prompt: torch.Tensor,
        completion: torch.Tensor,
        *,
        dtype: torch.dtype = torch.float32,
        split: int = 1,
        batch_with: torch.Tensor | None = None,
        layer: int | None = None,
    ) -> torch.Tensor:
        """The completion's hidden states [len, hidden] from one pass over prompt + completion.

        ``batch_with`` [n, len] adds other sequences of the same length to the batch (another
        matmul shape); our sequence is placed in the middle of the batch.
        """
        sequence = torch.cat([prompt, completion])[None]
        if batch_with is not None:
            half = batch_with.shape[0] // 2
            sequence = torch.cat([batch_with[:half], sequence, batch_with[half:]])
            row = half
        else:
            row = 0
        out = self.forward(sequence, dtype=dtype, split=split, layer=layer)
        return out[row, prompt.numel() :]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def _proj(x: torch.Tensor, weight: torch.Tensor, split: int) -> torch.Tensor:
    if split == 1:
        return x @ weight.T
    pieces = torch.tensor_split(torch.arange(weight.shape[1]), split)
    out = x[..., pieces[0]] @ weight[:, pieces[0]].T
    for piece in pieces[1:]:
        out = out + x[..., piece] @ weight[:, piece].T
    return out


def _rope(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
