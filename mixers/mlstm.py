"""mLSTM mixers with exponential (``mlstm_exp``) or sigmoid (``mlstm_sig``) input gate (paper 002).

Per head (``d_model`` split into ``num_heads`` heads of ``DV = d_model / num_heads``; queries and
keys have ``DQK = qk_dim or DV``):

    q, k, v = W_q x, W_k x, W_v x                       (one fused projection, no bias)
    i~, f~ = softcap(W_if x + b_if)                      (scalar gates per head, eq. 6-7)
    h~ = mlstm(q, k, v, i~, f~)                           (the cell, ``seqkernels.mlstm``)
    y = W_out (sigmoid(W_o x + b_o) * NORM(h~))           (output gate, per-head norm, eq. 5)

Initialization (paper 002 §4.2, §5.1): input-gate bias ``igate_bias`` (-10), forget-gate biases
evenly spaced over ``fgate_bias`` ((3, 6)) across heads, gate pre-activations soft-capped at
``gate_softcap`` (15, App. E.2; ``None`` disables). ``NORM`` is a multi-head RMS norm (``norm="rms"``)
or LayerNorm (``"layer"``) over each head's ``DV`` channels with ``norm_eps`` (1e-6) and a learnable
scale. The mixer adds no residual. Parameters at ``d_model=64, num_heads=4``: 20,808.
"""

from __future__ import annotations

import torch
from torch import nn

from mixers.registry import register_mixer
from mixers.validate import check_backend, positive_int
from seqkernels.mlstm import BACKENDS, mlstm


class MultiHeadNorm(nn.Module):
    """RMS norm or LayerNorm over the last dim of ``(..., NH, DV)``, with a scale per channel."""

    def __init__(self, num_heads: int, head_dim: int, kind: str = "rms", eps: float = 1e-6):
        super().__init__()
        if kind not in ("rms", "layer"):
            raise ValueError(f"norm must be 'rms' or 'layer', got {kind!r}")
        self.kind, self.eps = kind, float(eps)
        self.weight = nn.Parameter(torch.ones(num_heads, head_dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h32 = h.float()
        if self.kind == "layer":
            h32 = h32 - h32.mean(-1, keepdim=True)
        h32 = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + self.eps)
        return h32.to(h.dtype) * self.weight


class MLSTMMixer(nn.Module):
    """Multi-head mLSTM layer ``(B, L, d_model) -> (B, L, d_model)``; see the module docstring."""

    BACKENDS = BACKENDS

    def __init__(
        self,
        d_model: int,
        input_gate: str = "exp",
        num_heads: int = 4,
        backend: str = "auto",
        chunk_size: int = 64,
        qk_dim: int | None = None,
        norm: str = "rms",
        norm_eps: float = 1e-6,
        eps: float = 1e-6,
        igate_bias: float = -10.0,
        fgate_bias: tuple[float, float] = (3.0, 6.0),
        gate_softcap: float | None = 15.0,
    ):
        super().__init__()
        d_model, num_heads = positive_int("d_model", d_model), positive_int("num_heads", num_heads)
        self.chunk_size = positive_int("chunk_size", chunk_size)
        if d_model % num_heads:
            raise ValueError(f"mlstm: d_model={d_model} must be divisible by num_heads={num_heads}")
        check_backend("mlstm", backend, BACKENDS)
        if input_gate not in ("exp", "sig"):
            raise ValueError(f"mlstm: input_gate must be 'exp' or 'sig', got {input_gate!r}")
        if gate_softcap is not None and not gate_softcap > 0:
            raise ValueError(f"mlstm: gate_softcap must be positive or None, got {gate_softcap!r}")
        self.input_gate, self.backend, self.eps, self.gate_softcap = input_gate, backend, float(eps), gate_softcap
        self.num_heads, self.dv = num_heads, d_model // num_heads
        self.dqk = positive_int("qk_dim", qk_dim) if qk_dim is not None else self.dv
        self.qkv = nn.Linear(d_model, num_heads * (2 * self.dqk + self.dv), bias=False)
        self.gates = nn.Linear(d_model, 2 * num_heads)  # [input gates | forget gates]
        self.ogate = nn.Linear(d_model, d_model)
        self.norm = MultiHeadNorm(num_heads, self.dv, norm, norm_eps)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        lo, hi = fgate_bias
        with torch.no_grad():
            self.gates.bias[:num_heads].fill_(float(igate_bias))
            self.gates.bias[num_heads:].copy_(torch.linspace(float(lo), float(hi), num_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"mlstm: expected input (B, L, d_model), got shape {tuple(x.shape)}")
        B, L, _ = x.shape
        NH, DQK, DV = self.num_heads, self.dqk, self.dv
        q, k, v = self.qkv(x).split([NH * DQK, NH * DQK, NH * DV], dim=-1)
        heads = lambda t, d: t.reshape(B, L, NH, d).transpose(1, 2).contiguous()  # noqa: E731
        gates = self.gates(x)
        if self.gate_softcap is not None:
            gates = self.gate_softcap * torch.tanh(gates / self.gate_softcap)
        i_pre, f_pre = (g.transpose(1, 2).contiguous() for g in gates.split(NH, dim=-1))
        h = mlstm(
            heads(q, DQK),
            heads(k, DQK),
            heads(v, DV),
            i_pre,
            f_pre,
            input_gate=self.input_gate,
            backend=self.backend,
            chunk_size=self.chunk_size,
            eps=self.eps,
        )  # (B, NH, L, DV)
        h = self.norm(h.transpose(1, 2)).reshape(B, L, NH * DV)
        return self.out_proj(torch.sigmoid(self.ogate(x)) * h)


@register_mixer("mlstm_exp")
def mlstm_exp(d_model: int, **config) -> MLSTMMixer:
    """mLSTM with exponential input gate (mLSTMexp, paper 002 eq. 1-8)."""
    if "input_gate" in config:
        raise TypeError("mlstm_exp: input_gate is fixed to 'exp' (use mlstm_sig for the sigmoid gate)")
    return MLSTMMixer(d_model, input_gate="exp", **config)


@register_mixer("mlstm_sig")
def mlstm_sig(d_model: int, **config) -> MLSTMMixer:
    """mLSTM with sigmoid input gate and no normalizer (mLSTMsig, paper 002 eq. 22-24)."""
    if "input_gate" in config:
        raise TypeError("mlstm_sig: input_gate is fixed to 'sig' (use mlstm_exp for the exponential gate)")
    return MLSTMMixer(d_model, input_gate="sig", **config)
