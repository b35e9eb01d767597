"""The ``transformer`` mixer: a causal multi-head attention block with an MLP (a whole sequence block).

    y = x + Attn(x + P);   out = y + MLP(RMSNorm(y))      MLP: Linear(d, r d) -> GELU -> Linear(r d, d)

Attention uses PyTorch's SDPA eagerly and its written-out form under ``torch.compile``
(``causal_attention``). Positions (``positions=``): ``"rope"`` rotates q and k (relative
positions; P = 0); ``"sinusoidal"`` adds the fixed encoding P of Vaswani et al. (absolute);
``"learned"`` adds a trained table P of ``max_len`` rows (absolute; ``max_len * d`` parameters,
initialized N(0, 0.02); ``max_len`` is ignored by the other two). ``bias=True`` gives the q/k/v,
output and MLP linears biases. The model applies RMSNorm before and after the block.

With ``positions="learned", max_len=100, mlp_ratio=1, bias=True`` the single-layer model has paper
000's Table 6 Transformer counts within 0.4% (48.1k at V=128, 31.8k at V=2, 32.8k/32.2k at V=10/5;
docs/paper000-model.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixers.registry import register_mixer
from mixers.validate import check_backend, positive_int

POSITIONS = ("rope", "sinusoidal", "learned")
#: longest sequence whose attention ``causal_attention`` writes out under ``torch.compile``
WRITTEN_OUT_MAX_LEN = 256


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(Dh) + causal mask) v`` for ``q, k, v (B, H, L, Dh)`` -> ``(B, H, L, Dh)``.

    Eagerly PyTorch's SDPA. Under ``torch.compile``, up to ``WRITTEN_OUT_MAX_LEN`` positions, the same
    product written out (two batched matmuls around a softmax that Inductor fuses with the scale and
    the mask): at the Table 6 sizes (L = 100, float32) SDPA's memory-efficient kernels cost more GPU
    time than that (``docs/performance.md``). Longer sequences keep SDPA, which never holds the
    ``(B, H, L, L)`` scores."""
    length = q.shape[-2]
    if not torch.compiler.is_compiling() or length > WRITTEN_OUT_MAX_LEN:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


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
    """Causal MHA + MLP. ``d_model`` split into ``num_heads``; MLP hidden ``mlp_ratio * d_model``.

    ``forward(x (B, L, d)) -> (B, L, d)``; with ``positions="learned"``, ``L <= max_len``.
    """

    is_block = True
    has_positions = True
    #: ``mixers.stacking``: stacked trials run as ``trials * num_heads`` heads
    stackable, trials = True, 1
    BACKENDS = ("torch", "auto")

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        positions: str = "rope",
        max_len: int | None = None,
        bias: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if num_heads < 1 or d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"transformer: d_model={d_model} must split into num_heads={num_heads} even-sized heads")
        if positions not in POSITIONS:
            raise ValueError(f"transformer: positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
        if positions == "learned" and max_len is None:
            raise ValueError("transformer: positions='learned' needs max_len (the longest sequence), got None")
        if max_len is not None:
            positive_int("transformer: max_len", max_len)
        if not mlp_ratio > 0:
            raise ValueError(f"transformer: mlp_ratio must be > 0, got {mlp_ratio!r}")
        check_backend("transformer", backend, self.BACKENDS)
        hidden = int(round(mlp_ratio * d_model))
        self.num_heads, self.positions, self.max_len = num_heads, positions, max_len
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.norm = nn.RMSNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, hidden, bias=bias), nn.GELU(), nn.Linear(hidden, d_model, bias=bias)
        )
        if positions == "learned":
            self.position_table = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        bsz, length, d = x.shape
        S = self.trials
        if self.positions == "sinusoidal":
            x = x + sinusoidal_positions(length, d // S, x.device, x.dtype).repeat(1, S)
        elif self.positions == "learned":
            if length > self.max_len:
                raise ValueError(
                    f"transformer: sequence length {length} exceeds the learned positions' max_len={self.max_len}"
                )
            x = x + self.position_table[:length]
        qkv = self.qkv(x).view(bsz, length, S, 3, self.num_heads, -1)  # each trial's (q, k, v)
        q, k, v = qkv.permute(3, 0, 2, 4, 1, 5).flatten(2, 3)  # (B, S * H, L, Dh) each
        if self.positions == "rope":
            q, k = apply_rope(q), apply_rope(k)
        y = causal_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(bsz, length, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.attention(x)
        return y + self.mlp(self.norm(y))


@register_mixer("transformer")
def build_transformer(
    d_model: int,
    num_heads: int = 4,
    mlp_ratio: float = 2.0,
    positions: str = "rope",
    max_len: int | None = None,
    bias: bool = False,
    backend: str = "auto",
) -> TransformerBlock:
    """Causal multi-head attention + MLP (see ``TransformerBlock``)."""
    return TransformerBlock(
        d_model,
        num_heads=num_heads,
        mlp_ratio=mlp_ratio,
        positions=positions,
        max_len=max_len,
        bias=bias,
        backend=backend,
    )
