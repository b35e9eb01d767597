"""Delta-rule mixers: ``deltanet``, ``signed_deltanet``, ``deltaproduct``, ``gated_deltanet``.

One module (``DeltaRuleMixer``), the layers of flash-linear-attention (``fla.layers.DeltaNet``,
``GatedDeltaNet``, ``GatedDeltaProduct``) at their defaults, with the head sizes of this suite
(``d_model`` split into ``num_heads`` heads of ``D = d_model / num_heads`` for keys and values;
fla's GatedDeltaNet/GatedDeltaProduct default to head_dim 256 and values twice as wide). Per token
``x (d_model)``, per head ``h`` with state ``S (D x D)`` (starting at zero), ``n`` Householder steps:

    q = W_q x,  k_j = W_k,j x,  v_j = W_v,j x               (bias-free; j = 1..n; optional short conv)
    q, k_j, v_j <- silu(.)                                    (fla's default qk_activation and v activation)
    q, k_j <- q / ||q||, k_j / ||k_j||                         (qk_norm "l2", fla's in-kernel l2norm;
                                                               "sum": divided by their L1 norm instead)
    beta_j = c * sigmoid(W_b,j x)                              (c = 1: beta in [0, 1]; signed: c = 2, [0, 2])
    alpha = exp(g),  g = -exp(A_log) * softplus(W_a x + dt_bias)   (forget gate only; else alpha = 1)
    S_t = alpha_t S_{t-1};  then for j = 1..n:  S_t <- S_t (I - beta_j k_j k_j^T) + beta_j v_j k_j^T
    o_t = S_t q_t / sqrt(D)                                    (fla's default scale)
    y = W_o [RMSNorm_h(o_t)  (* silu(W_g x) with output_gate)]   (per-head RMSNorm, eps 1e-5, learned scale)

With unit keys, ``I - beta k k^T`` has eigenvalues ``1`` (D - 1 times) and ``1 - beta``: in [0, 1]
for beta in [0, 1], in [-1, 1] for beta in [0, 2] (Grazzi et al. 2025), which lets one layer track
parity; a product of n such factors can also rotate (Siems et al. 2025).

Kept from fla: the projections (q, k, v, beta, gate a with A_log/dt_bias initialized as fla, output
gate g), SiLU on q/k/v, the in-kernel L2 norm, the per-head RMSNorm and the output projection.
Changed: the short convolutions are off by default (``short_conv=True`` adds fla's causal depthwise
conv, kernel 4, no bias, SiLU, on q, k and v: the suite's "full" block already convolves); head
sizes (above); linear layers keep PyTorch's default initialization (fla's models re-initialize
them at the model level); no caches, masks or variable lengths.

Backends (``seqkernels.delta``): ``"reference"`` (per-token loop, any device/dtype), ``"chunk"`` (the
chunkwise form in PyTorch, any device/dtype), ``"triton"`` (our fused recurrent kernel, CUDA, the input
dtype with float32 arithmetic), ``"triton_chunk"`` (our chunkwise kernels, CUDA, the input dtype with
float32 arithmetic), ``"fla"`` (fla's chunked kernels, CUDA, computed in
bfloat16), ``"fla_recurrent"`` (fla's fused recurrent kernel in the input dtype, CUDA; not with the
forget gate), ``"auto"`` (``seqkernels.delta.resolve_backend``: ``"triton_chunk"`` or ``"fla"`` on CUDA
by head width and length, else ``"chunk"``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixers.conv import causal_depthwise_conv
from mixers.registry import register_mixer
from mixers.validate import boolean, check_backend, positive_int
from seqkernels.delta import backends as kernel_backends
from seqkernels.delta import delta_product, delta_rule, gated_delta_rule
from seqkernels.delta.reference import l2norm

QK_NORMS = ("l2", "sum")


def _short_conv(channels: int, kernel: int = 4) -> nn.Conv1d:
    return nn.Conv1d(channels, channels, kernel, groups=channels, padding=kernel - 1, bias=False)


def fla_dt_bias(n: int, dt_min: float = 1e-3, dt_max: float = 0.1, floor: float = 1e-4) -> torch.Tensor:
    """Inverse softplus of step sizes log-uniform in ``[dt_min, dt_max]`` (fla's GatedDeltaNet init)."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


class DeltaRuleMixer(nn.Module):
    """(Gated) DeltaNet / DeltaProduct, ``(B, L, d_model) -> (B, L, d_model)``; equations: module docstring.

    ``num_heads`` (4, must divide ``d_model``), ``householders`` n (1), ``signed`` (beta in [0, 2]
    instead of [0, 1]), ``forget_gate`` (the per-token, per-head decay of Gated DeltaNet), ``output_gate``
    (``RMSNorm(o) * silu(W_g x)``), ``short_conv`` (kernel-4 causal conv + SiLU on q, k, v), ``qk_norm``
    (``"l2"`` or ``"sum"``; unnormalized keys would make ``I - beta k k^T`` unbounded, so there is no
    ``"none"``), ``backend``. Every backend can be captured in a CUDA graph (fla's kernels once warmed
    up: autotuning runs on the eager warm-up steps).
    """

    # ("auto", "reference", "chunk", "triton", "triton_chunk", "fla", "fla_recurrent")
    BACKENDS = kernel_backends("delta_rule")

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        householders: int = 1,
        signed: bool = False,
        forget_gate: bool = False,
        output_gate: bool = False,
        short_conv: bool = False,
        qk_norm: str = "l2",
        backend: str = "auto",
        name: str = "deltanet",
    ):
        super().__init__()
        d_model, num_heads = positive_int("d_model", d_model), positive_int("num_heads", num_heads)
        n = positive_int("householders", householders)
        if d_model % num_heads:
            raise ValueError(f"{name}: d_model={d_model} must be divisible by num_heads={num_heads}")
        for option, value in (
            ("signed", signed),
            ("forget_gate", forget_gate),
            ("output_gate", output_gate),
            ("short_conv", short_conv),
        ):
            boolean(f"{name}: {option}", value)
        if qk_norm not in QK_NORMS:
            raise ValueError(f"{name}: qk_norm must be one of {', '.join(QK_NORMS)}, got {qk_norm!r}")
        check_backend(name, backend, self.BACKENDS)
        if backend == "fla_recurrent" and forget_gate:
            raise ValueError(
                f"{name}: backend 'fla_recurrent' has no forget gate (fla's fused recurrent gated "
                "kernels have no backward); valid with forget_gate: auto, reference, fla"
            )
        self.num_heads, self.head_dim, self.householders = num_heads, d_model // num_heads, n
        self.signed, self.forget_gate, self.output_gate, self.short_conv = signed, forget_gate, output_gate, short_conv
        self.qk_norm, self.backend, self.name = qk_norm, backend, name
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n * d_model, bias=False)
        self.v_proj = nn.Linear(d_model, n * d_model, bias=False)
        self.b_proj = nn.Linear(d_model, n * num_heads, bias=False)
        if short_conv:
            self.q_conv, self.k_conv, self.v_conv = (_short_conv(c) for c in (d_model, n * d_model, n * d_model))
        if forget_gate:
            self.a_proj = nn.Linear(d_model, num_heads, bias=False)
            self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(0, 16)))
            self.dt_bias = nn.Parameter(fla_dt_bias(num_heads))
        if output_gate:
            self.g_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, householders={self.householders}, signed={self.signed}, "
            f"forget_gate={self.forget_gate}, output_gate={self.output_gate}, short_conv={self.short_conv}, "
            f"qk_norm={self.qk_norm!r}, backend={self.backend!r}"
        )

    def projections(self, x: torch.Tensor):
        """The recurrence's inputs for ``x (B, L, d_model)``: ``q (B, L, H, D)``, ``k, v (B, L, n, H, D)``
        (keys before the L2 norm, which the kernels apply), ``beta (B, L, n, H)``, and the log decay
        ``g (B, L, H)`` (``None`` without the forget gate)."""
        B, L, d = x.shape
        H, D, n = self.num_heads, self.head_dim, self.householders
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.short_conv:
            q, k, v = (causal_depthwise_conv(c, t) for c, t in ((self.q_conv, q), (self.k_conv, k), (self.v_conv, v)))
        q, k, v = F.silu(q).view(B, L, H, D), F.silu(k).view(B, L, n, H, D), F.silu(v).view(B, L, n, H, D)
        if self.qk_norm == "sum":
            q, k = F.normalize(q, p=1, dim=-1, eps=1e-6), F.normalize(k, p=1, dim=-1, eps=1e-6)
        beta = torch.sigmoid(self.b_proj(x)).view(B, L, n, H) * (2.0 if self.signed else 1.0)
        g = None
        if self.forget_gate:  # log decay per token and head, <= 0, in float32 as fla
            g = -torch.exp(self.A_log.float()) * F.softplus(self.a_proj(x).float() + self.dt_bias)
        return q, k, v, beta, g

    def transitions(self, x: torch.Tensor) -> torch.Tensor:
        """The state transitions ``A_t (B, L, H, D, D)`` of ``x (B, L, d_model)``: the recurrence is
        ``S_t = S_{t-1} A_t + (writes)`` with ``A_t = alpha_t (I - beta_1 k_1 k_1^T) ... (I - beta_n k_n k_n^T)``
        (unit keys; ``alpha_t = exp(g_t)`` with the forget gate, else 1). In ``x``'s dtype."""
        _, k, _, beta, g = self.projections(x)
        if self.qk_norm == "l2":
            k = l2norm(k)
        eye = torch.eye(self.head_dim, dtype=x.dtype, device=x.device)
        A = eye.expand(*k.shape[:2], self.num_heads, -1, -1)
        for j in range(self.householders):
            kj = k[:, :, j]
            A = A - beta[:, :, j, :, None, None] * (A @ kj[..., :, None]) * kj[..., None, :]
        return A if g is None else A * torch.exp(g).to(x.dtype)[..., None, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, d = x.shape
        H, D, n = self.num_heads, self.head_dim, self.householders
        q, k, v, beta, g = self.projections(x)
        l2 = self.qk_norm == "l2"
        if n == 1 and g is None:
            o = delta_rule(q, k[:, :, 0], v[:, :, 0], beta[:, :, 0], qk_l2norm=l2, backend=self.backend)
        elif n == 1:
            o = gated_delta_rule(q, k[:, :, 0], v[:, :, 0], g, beta[:, :, 0], qk_l2norm=l2, backend=self.backend)
        else:
            o = delta_product(q, k, v, beta, g, qk_l2norm=l2, backend=self.backend)
        o = self.o_norm(o)  # (B, L, H, D), over each head's D channels
        if self.output_gate:
            o = o * F.silu(self.g_proj(x)).view(B, L, H, D)
        return self.o_proj(o.reshape(B, L, d))


@register_mixer("deltanet")
def deltanet(
    d_model: int,
    num_heads: int = 4,
    short_conv: bool = False,
    qk_norm: str = "l2",
    output_gate: bool = False,
    backend: str = "auto",
) -> DeltaRuleMixer:
    """DeltaNet (Schlag et al. 2021, Yang et al. 2024): beta in [0, 1], transitions with eigenvalues in [0, 1]."""
    return DeltaRuleMixer(d_model, num_heads, 1, False, False, output_gate, short_conv, qk_norm, backend, "deltanet")


@register_mixer("signed_deltanet")
def signed_deltanet(
    d_model: int,
    num_heads: int = 4,
    short_conv: bool = False,
    qk_norm: str = "l2",
    output_gate: bool = False,
    backend: str = "auto",
) -> DeltaRuleMixer:
    """DeltaNet with beta in [0, 2]: eigenvalues in [-1, 1] (Grazzi et al. 2025, fla's allow_neg_eigval)."""
    return DeltaRuleMixer(
        d_model, num_heads, 1, True, False, output_gate, short_conv, qk_norm, backend, "signed_deltanet"
    )


@register_mixer("deltaproduct")
def deltaproduct(
    d_model: int,
    num_heads: int = 4,
    householders: int = 2,
    signed: bool = True,
    forget_gate: bool = False,
    short_conv: bool = False,
    qk_norm: str = "l2",
    output_gate: bool = True,
    backend: str = "auto",
) -> DeltaRuleMixer:
    """DeltaProduct (Siems et al. 2025): ``householders`` delta steps per token (fla's GatedDeltaProduct;
    its defaults there: signed, output gate on; ``forget_gate=True`` is Gated DeltaProduct)."""
    return DeltaRuleMixer(
        d_model, num_heads, householders, signed, forget_gate, output_gate, short_conv, qk_norm, backend, "deltaproduct"
    )


@register_mixer("gated_deltanet")
def gated_deltanet(
    d_model: int,
    num_heads: int = 4,
    signed: bool = False,
    short_conv: bool = False,
    qk_norm: str = "l2",
    output_gate: bool = True,
    backend: str = "auto",
) -> DeltaRuleMixer:
    """Gated DeltaNet (Yang et al. 2025): a decay ``exp(g_t)`` per token and head before the delta step
    (fla's GatedDeltaNet; output gate on as there)."""
    return DeltaRuleMixer(
        d_model, num_heads, 1, signed, True, output_gate, short_conv, qk_norm, backend, "gated_deltanet"
    )
