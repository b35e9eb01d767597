"""Mamba-3 (SISO): a scalar-decay SSM with data-dependent rotations and a trapezoidal discretization.

Lahoti, Gu et al., "Mamba-3: Improved Sequence Modeling using State Space Principles" (ICLR 2026); the
equations of ``mamba_ssm``'s Mamba-3 SISO step. ``d_model`` channels split into ``num_heads`` heads of
``P = d_model / num_heads`` (any ``P``: 16 at the suite's d 64, 4 heads); per head a state
``h (P, N)``, ``N = d_state``. One linear map (no bias) gives ``x, B, C`` (``B, C`` of size ``N``
shared by the heads), and per head ``dt, a, trap``, plus ``R`` rotation angles ``theta``::

    dt_t = softplus(. + dt_bias),   A_t = min(-softplus(a_t), -A_floor),   alpha_t = exp(dt_t A_t)
    lam_t = sigmoid(trap_t),        gamma_t = lam_t dt_t,   beta_t = (1 - lam_t) dt_t alpha_t
    B_t <- RMSNorm(B_t) + B_bias_h,  C_t <- RMSNorm(C_t) + C_bias_h          (per head biases, init 1)
    phi_t = sum_{s <= t} pi tanh(theta_s) dt_s                                 (R angles per head)
    B~_t, C~_t = B_t, C_t with state pairs (2r, 2r+1), r < R, rotated by phi_t[r]   (RoPE: the
                 complex SSM with rotation eigenvalues, moved onto B and C)
    k_t = x_t B~_t^T  (P, N)
    h_t = alpha_t h_{t-1} + gamma_t k_t + beta_t k_{t-1}                     (trapezoid; k_{-1} = 0)
    y_t = h_t C~_t + D_h x_t

``R = floor(N rope_fraction / 2)`` pairs rotate (``rope_fraction`` 0.5 as Mamba-3's default; 1.0 all).
The mixer only: no gate ``z`` and no output projection (the model's full block adds a gate and a
projection around it), like ``mamba2``. Initialization as Mamba-3: ``dt`` log-uniform in
``[dt_min, dt_max]`` through ``dt_bias``, ``D = 1``, ``B_bias = C_bias = 1``.

Backends: ``"reference"`` -- the step recurrence above, a loop over time (float64-capable);
``"torch"`` / ``"triton"`` -- after the rotation the recurrence is diagonal with one decay per head:
``seqkernels.scan.linear_scan`` over the ``H P N`` state lanes, inputs ``gamma_t k_t + beta_t k_{t-1}``;
``"auto"``: ``linear_scan``'s choice (Triton for CUDA float tensors); ``"ssd"`` -- Mamba-2's chunked
SSD (``seqkernels.ssd``, its own ``"auto"``: Triton on CUDA, the chunked PyTorch form elsewhere), no
``(P, N)`` state per token in memory: the trapezoid's two terms run as ``2 H`` heads of one SSD call, head
``h`` on ``(x_t, B~_t)`` with weight ``gamma_t`` and head ``H + h`` on ``(x_{t-1}, B~_{t-1})`` with
weight ``beta_t``, both reading ``C~_t`` and decaying by ``alpha_t = exp(-s_t)``, ``s_t = dt_t
max(softplus(a_t), A_floor)`` (SSD's ``dt`` is ``s_t`` with ``A = -1``; its inputs are divided by
``s_t``, at least ``dt_t A_floor``), and their outputs add. No host reads (CUDA-graph capturable).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixers.mamba import _dt_bias
from mixers.registry import register_mixer
from mixers.validate import check_backend, positive_int
from seqkernels.scan import SCAN_BACKENDS, linear_scan
from seqkernels.ssd import ssd


def rotate_pairs(v: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """``v (..., N)`` with its first ``R`` pairs ``(2r, 2r+1)`` rotated by ``phi (..., R)`` radians."""
    R = phi.shape[-1]
    pairs, rest = v[..., : 2 * R].unflatten(-1, (R, 2)), v[..., 2 * R :]
    v0, v1 = pairs.unbind(-1)
    cos, sin = torch.cos(phi), torch.sin(phi)
    rotated = torch.stack([v0 * cos - v1 * sin, v0 * sin + v1 * cos], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1)


class Mamba3(nn.Module):
    """Mamba-3 SISO mixer; see the module docstring. ``backend``: one of ``BACKENDS``."""

    BACKENDS = ("auto", "reference", *(b for b in SCAN_BACKENDS if b != "reference"), "ssd")

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        d_state: int = 16,
        rope_fraction: float = 0.5,
        A_floor: float = 1e-4,
        backend: str = "auto",
        chunk_size: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
    ):
        super().__init__()
        d_model, num_heads = positive_int("d_model", d_model), positive_int("num_heads", num_heads)
        self.d_state = positive_int("d_state", d_state)
        chunk_size = positive_int("chunk_size", chunk_size)
        if d_model % num_heads:
            raise ValueError(f"mamba3: d_model={d_model} must be divisible by num_heads={num_heads}")
        if not 0 < rope_fraction <= 1:
            raise ValueError(f"mamba3: rope_fraction must be in (0, 1], got {rope_fraction!r}")
        self.angles = int(self.d_state * rope_fraction) // 2
        if self.angles < 1:
            raise ValueError(
                f"mamba3: d_state * rope_fraction = {self.d_state * rope_fraction} leaves no pair to rotate"
            )
        if not A_floor > 0:
            raise ValueError(f"mamba3: A_floor must be > 0, got {A_floor!r}")
        check_backend("mamba3", backend, self.BACKENDS)
        self.num_heads, self.A_floor, self.backend, self.chunk_size = num_heads, float(A_floor), backend, chunk_size
        H, N = num_heads, self.d_state
        self.split = [d_model, N, N, H, H, H, self.angles]  # x, B, C, dt, a, trap, theta
        self.in_proj = nn.Linear(d_model, sum(self.split), bias=False)
        self.dt_bias = nn.Parameter(_dt_bias(H, dt_min, dt_max))
        self.B_norm, self.C_norm = nn.RMSNorm(N), nn.RMSNorm(N)
        self.B_bias, self.C_bias = nn.Parameter(torch.ones(H, N)), nn.Parameter(torch.ones(H, N))
        self.D = nn.Parameter(torch.ones(H))

    def coefficients(self, u: torch.Tensor):
        """Per token: ``x (B, L, H, P)``, ``B~, C~ (B, L, H, N)``, ``alpha, gamma, beta (B, L, H)``."""
        return self._coefficients(u)[:6]

    def _coefficients(self, u: torch.Tensor):
        batch, L, d = u.shape
        x, B, C, dt, a, trap, theta = torch.split(self.in_proj(u), self.split, dim=-1)
        dt = F.softplus(dt + self.dt_bias)
        rate = dt * torch.clamp(F.softplus(a), min=self.A_floor)  # -log alpha > 0
        alpha = torch.exp(-rate)
        lam = torch.sigmoid(trap)
        gamma, beta = lam * dt, (1 - lam) * dt * alpha
        phi = torch.cumsum(math.pi * torch.tanh(theta)[:, :, None, :] * dt[..., None], dim=1)  # (B, L, H, R)
        B = rotate_pairs(self.B_norm(B)[:, :, None] + self.B_bias, phi)
        C = rotate_pairs(self.C_norm(C)[:, :, None] + self.C_bias, phi)
        return x.reshape(batch, L, self.num_heads, -1), B, C, alpha, gamma, beta, rate

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        batch, L, d = u.shape
        x, B, C, alpha, gamma, beta, rate = self._coefficients(u)
        if self.backend == "ssd":
            return self._ssd(x, B, C, gamma, beta, rate).reshape(batch, L, d)
        k = x[..., None] * B[..., None, :]  # (B, L, H, P, N)
        if self.backend == "reference":
            h, k_prev, ys = torch.zeros_like(k[:, 0]), torch.zeros_like(k[:, 0]), []
            for t in range(L):
                a, g, b = (c[:, t, :, None, None] for c in (alpha, gamma, beta))
                h = a * h + g * k[:, t] + b * k_prev
                k_prev = k[:, t]
                ys.append(torch.einsum("bhpn,bhn->bhp", h, C[:, t]))
            y = torch.stack(ys, dim=1) if ys else torch.zeros_like(x)
        else:
            k_prev = torch.cat([torch.zeros_like(k[:, :1]), k[:, :-1]], dim=1)
            inputs = gamma[..., None, None] * k + beta[..., None, None] * k_prev
            coeff = alpha[..., None, None].expand_as(inputs)
            h = linear_scan(coeff.reshape(batch, L, -1), inputs.reshape(batch, L, -1), backend=self.backend)
            y = torch.einsum("blhpn,blhn->blhp", h.reshape(k.shape), C)
        return (y + self.D[:, None] * x).reshape(batch, L, d)

    def _ssd(self, x, B, C, gamma, beta, rate) -> torch.Tensor:
        """The trapezoid as ``2 H`` SSD heads (module docstring); ``(B, L, H, P)``."""
        shift = lambda t: torch.cat([torch.zeros_like(t[:, :1]), t[:, :-1]], dim=1)  # noqa: E731
        H = self.num_heads
        xs = torch.cat([x * (gamma / rate)[..., None], shift(x) * (beta / rate)[..., None]], dim=2)
        y = ssd(
            xs,
            torch.cat([rate, rate], dim=2),
            -torch.ones(2 * H, dtype=x.dtype, device=x.device),
            torch.cat([B, shift(B)], dim=2),
            torch.cat([C, C], dim=2),
            chunk_size=self.chunk_size,
        )
        return y[:, :, :H] + y[:, :, H:] + self.D[:, None] * x


@register_mixer("mamba3")
def mamba3(d_model: int, **config) -> Mamba3:
    """Mamba-3 SISO mixer (4 heads, d_state 16 by default)."""
    return Mamba3(d_model, **config)
