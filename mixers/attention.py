"""The ``transformer`` mixer: a causal multi-head attention block with an MLP (a whole sequence block).

    y = x + Attn(x);   out = y + MLP(RMSNorm(y))

Attention uses PyTorch's SDPA with rotary position embeddings (RoPE) on q and k, or sinusoidal
positions added to the input (``positions="sinusoidal"``). The model applies RMSNorm before and
after the block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixers.registry import register_mixer

POSITIONS = ("rope", "sinusoidal")


def sinusoidal_positions(length: int, dim: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """``(length, dim)`` parameter-free sinusoidal encoding (Vaswani et al.)."""
    pos = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    enc = torch.zeros(length, dim, device=device)
    enc[:, 0::2] = torch.sin(pos * freq)
    enc[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return enc.to(dtype)


def apply_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate pairs of channels of ``x (B, H, L, Dh)`` by position-dependent angles (Dh even)."""
    length, dh = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh)
    ang = torch.arange(length, device=x.device, dtype=torch.float32).unsqueeze(1) * inv  # (L, Dh/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class TransformerBlock(nn.Module):
    """Causal MHA + MLP. ``d_model`` split into ``num_heads``; MLP hidden ``mlp_ratio * d_model``."""

    is_block = True
    has_positions = True
    BACKENDS = ("torch", "auto")

    def __init__(self, d_model: int, num_heads: int = 4, mlp_ratio: float = 2.0, positions: str = "rope",
                 backend: str = "auto") -> None:
        super().__init__()
        if num_heads < 1 or d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"transformer: d_model={d_model} must split into num_heads={num_heads} even-sized heads")
        if positions not in POSITIONS:
            raise ValueError(f"transformer: positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
        if backend not in self.BACKENDS:
            raise ValueError(f"transformer: unknown backend {backend!r}; known: {', '.join(self.BACKENDS)}")
        hidden = int(round(mlp_ratio * d_model))
        self.num_heads, self.positions = num_heads, positions
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.norm = nn.RMSNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden, bias=False), nn.GELU(), nn.Linear(hidden, d_model, bias=False))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        bsz, length, d = x.shape
        if self.positions == "sinusoidal":
            x = x + sinusoidal_positions(length, d, x.device, x.dtype)
        q, k, v = self.qkv(x).view(bsz, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        if self.positions == "rope":
            q, k = apply_rope(q), apply_rope(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(bsz, length, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.attention(x)
        return y + self.mlp(self.norm(y))


@register_mixer("transformer")
def build_transformer(d_model: int, num_heads: int = 4, mlp_ratio: float = 2.0, positions: str = "rope",
                      backend: str = "auto") -> TransformerBlock:
    """Causal multi-head attention + MLP (see ``TransformerBlock``)."""
    return TransformerBlock(d_model, num_heads=num_heads, mlp_ratio=mlp_ratio, positions=positions, backend=backend)
