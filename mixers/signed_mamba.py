"""Mamba (S6) whose state transition may be negative: the eigenvalue range [eig_min, 1].

Grazzi, Siems et al., "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues" (ICLR
2025): a diagonal linear recurrence with transitions in [0, 1] cannot solve parity at any length;
mapping Mamba's transition ``exp(dt A)`` (in (0, 1)) to ``2 exp(dt A) - 1`` (in (-1, 1)) lets it.
Per channel ``d`` and state ``n``, with ``A = -exp(A_log) < 0`` and ``dt_t = softplus(.) > 0``::

    a_t = eig_min + (1 - eig_min) * exp(dt_t A)        # eig_min = -1: the paper's 2 exp(dt A) - 1
    h_t = a_t * h_{t-1} + dt_t * x_t * B_t             # seqkernels.scan.linear_scan over d x n lanes
    y_t = sum_n C_t[n] h_t[n] + D x_t

``x, B, C, dt`` come from one linear map of the input (the mixer alone: no convolution or gate).
``signed_mamba`` has ``eig_min = -1``, ``unsigned_mamba`` ``eig_min = 0`` (the same module with
Mamba's own range, as a matched control).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mixers.mamba import _dt_bias
from mixers.registry import register_mixer
from mixers.validate import check_backend, positive_int
from seqkernels.scan import SCAN_BACKENDS, linear_scan


class SignedMamba(nn.Module):
    """S6 with transitions in ``[eig_min, 1]``; ``(B, L, d_model) -> (B, L, d_model)``.

    ``backend``: ``"reference"`` (the loop above), a ``seqkernels.scan`` backend (``"torch"``,
    ``"triton"``), or ``"auto"`` (``linear_scan``'s choice for the input's device).
    """

    BACKENDS = ("auto", "reference", *(b for b in SCAN_BACKENDS if b != "reference"))

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        eig_min: float = -1.0,
        backend: str = "auto",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
    ):
        super().__init__()
        d_model, d_state = positive_int("d_model", d_model), positive_int("d_state", d_state)
        if not -1.0 <= eig_min <= 0.0:
            raise ValueError(f"signed_mamba: eig_min must be in [-1, 0], got {eig_min!r}")
        check_backend("signed_mamba", backend, self.BACKENDS)
        self.d_state, self.eig_min, self.backend = d_state, float(eig_min), backend
        self.split = [d_model, d_state, d_state, d_model]  # x, B, C, dt
        self.in_proj = nn.Linear(d_model, sum(self.split), bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_model, 1))
        self.dt_bias = nn.Parameter(_dt_bias(d_model, dt_min, dt_max))
        self.D = nn.Parameter(torch.ones(d_model))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        batch, L, d = u.shape
        x, B, C, dt = torch.split(self.in_proj(u), self.split, dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # (batch, L, d)
        decay = torch.exp(dt[..., None] * -torch.exp(self.A_log))  # (batch, L, d, n), in (0, 1)
        a = self.eig_min + (1 - self.eig_min) * decay  # in (eig_min, 1)
        inputs = (dt * x)[..., None] * B[:, :, None, :]  # (batch, L, d, n)
        if self.backend == "reference":
            h, states = torch.zeros_like(inputs[:, 0]), []
            for t in range(L):
                h = a[:, t] * h + inputs[:, t]
                states.append(h)
            h = torch.stack(states, dim=1)
        else:
            lanes = (batch, L, d * self.d_state)
            h = linear_scan(a.reshape(lanes), inputs.reshape(lanes), backend=self.backend).reshape(a.shape)
        return torch.einsum("bldn,bln->bld", h, C) + self.D * x


@register_mixer("signed_mamba")
def signed_mamba(d_model: int, num_heads: int | None = None, **config) -> SignedMamba:
    """S6 with transitions in [-1, 1] (Grazzi et al. 2025). ``num_heads`` is accepted and unused."""
    return SignedMamba(d_model, **{"eig_min": -1.0, **config})


@register_mixer("unsigned_mamba")
def unsigned_mamba(d_model: int, num_heads: int | None = None, **config) -> SignedMamba:
    """The same module with transitions in [0, 1] (Mamba's range). ``num_heads`` is accepted and unused."""
    return SignedMamba(d_model, **{"eig_min": 0.0, **config})
