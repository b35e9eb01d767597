"""PD-SSM and its diagonal special case: complex linear RNNs with input-dependent transitions.

``pd_ssm`` -- Terzić et al., "Structured Sparse Transition Matrices to Enable State Tracking in
State-Space Models" (NeurIPS 2025). Per token ``t`` a state ``h_t`` of ``N = d_state`` complex lanes::

    A_t = P_t D_t                                  # the transition: column one-hot times diagonal
    D_t = diag(sigmoid(MLP_r(u_t)) * exp(2 pi i sigmoid(MLP_phi(u_t))))      # |D| in (0, 1)
    M_t = sum_k softmax(S u_t)_k A_dict[k]         # (N, N) logits from a dictionary of K matrices
    P_t[m, n] = [m = argmax_m' M_t[m', n]]         # one 1 per column (forward)
    h_t = A_t h_{t-1} + W_B u_t,   h_{-1} = e_0    # W_B complex (N, d); the authors' one-hot start
    y_t = W_out [Re h_t, Im h_t] + b_out + D_skip * u_t

``MLP_*``: ``Linear(d, mlp_expand N) -> GELU -> Linear(., N)``. Training makes the selection
differentiable as the authors' code does: a straight-through estimator, forward with the hard
``P_t``, backward through ``softmax(M_t)`` taken over each column (``P = hard + soft - sg(soft)``).
Shapes: ``u (B, L, d_model) -> y (B, L, d_model)``.

Backends: ``"reference"`` -- the recurrence with the dense ``(N, N)`` matrices ``A_t`` (straight-through
``P``), a loop over time, float64-capable, ``O(N^2)`` per step; ``"torch"`` / ``"auto"`` -- the
parallel scan over the P·D form (``seqkernels.pd_scan``, ``O(N)`` per combine, ``log2 L`` rounds). With
autograd on, the fast path runs the scan twice: a first pass without gradients gives ``h_{t-1}`` for
the straight-through term ``(soft - sg(soft)) D_t sg(h_{t-1})``, which is zero in value and carries
the gradient of the soft selection into the second (differentiated) pass. Both forms are
CUDA-graph capturable (no host reads).

``complex_diag`` -- the same model with ``P_t = I`` (the paper's "ℂ Diag." row): a diagonal linear RNN
with complex eigenvalues of input-dependent magnitude and angle, ``h_t = D_t h_{t-1} + W_B u_t``,
``h_{-1} = 0``; each complex lane is a 2x2 rotation-scale block, so the fast path is
``seqkernels.scan.linear_scan_block2`` (Triton on CUDA); ``"reference"`` is a loop over complex numbers.

Options: ``d_state`` (N, default 32), ``mlp_expand`` (default 2), ``dictionary_size`` (K, pd_ssm
only, default 8), ``backend``; ``num_heads`` is accepted for a uniform sweep config and unused.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixers.registry import register_mixer
from mixers.validate import check_backend, positive_int
from seqkernels.pd_scan import PD_SCAN_BACKENDS, multiply, pd_scan
from seqkernels.scan import SCAN_BACKENDS, linear_scan_block2


def _mlp(d_model: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, out))


class ComplexDiag(nn.Module):
    """Diagonal complex linear RNN (``complex_diag``); see the module docstring. Also the base of
    ``PDSSM``: the diagonal generators, the complex input map and the readout."""

    BACKENDS = ("auto", "reference", *(b for b in SCAN_BACKENDS if b != "reference"))
    name = "complex_diag"

    def __init__(self, d_model: int, d_state: int = 32, mlp_expand: int = 2, backend: str = "auto"):
        super().__init__()
        d_model, self.d_state = positive_int("d_model", d_model), positive_int("d_state", d_state)
        hidden = positive_int("mlp_expand", mlp_expand) * self.d_state
        check_backend(self.name, backend, self.BACKENDS)
        self.backend = backend
        self.magnitude = _mlp(d_model, hidden, self.d_state)  # |D| = sigmoid(.)
        self.phase = _mlp(d_model, hidden, self.d_state)  # arg D = 2 pi sigmoid(.)
        self.in_proj = nn.Linear(d_model, 2 * self.d_state, bias=False)  # W_B: (re, im) per lane
        nn.init.normal_(self.in_proj.weight, std=1 / math.sqrt(2 * self.d_state))
        self.out_proj = nn.Linear(2 * self.d_state, d_model)  # reads [Re h, Im h]
        self.skip = nn.Parameter(torch.randn(d_model) / math.sqrt(d_model))

    def diagonal(self, u: torch.Tensor) -> torch.Tensor:
        """``D_t`` as (re, im) pairs: ``(B, L, N, 2)``."""
        r = torch.sigmoid(self.magnitude(u))
        angle = 2 * math.pi * torch.sigmoid(self.phase(u))
        return torch.stack([r * torch.cos(angle), r * torch.sin(angle)], dim=-1)

    def inputs(self, u: torch.Tensor) -> torch.Tensor:
        """``W_B u_t`` as (re, im) pairs: ``(B, L, N, 2)``."""
        return self.in_proj(u).unflatten(-1, (self.d_state, 2))

    def readout(self, h: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return self.out_proj(h.flatten(-2)) + self.skip * u

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        d, x = self.diagonal(u), self.inputs(u)
        if self.backend == "reference":
            dc, xc = torch.view_as_complex(d.contiguous()), torch.view_as_complex(x.contiguous())
            h, states = torch.zeros_like(xc[:, 0]), []
            for t in range(u.shape[1]):
                h = dc[:, t] * h + xc[:, t]
                states.append(h)
            h = torch.view_as_real(torch.stack(states, dim=1)) if states else x
        else:  # each lane a 2x2 block [[a, -b], [b, a]] acting on (re, im)
            a, b = d.unbind(-1)
            C = torch.stack([torch.stack([a, -b], dim=2), torch.stack([b, a], dim=2)], dim=2)  # (B, L, 2, 2, N)
            h = linear_scan_block2(C, x.transpose(-1, -2), backend=self.backend).transpose(-1, -2)
        return self.readout(h, u)


class PDSSM(ComplexDiag):
    """PD-SSM (``pd_ssm``); see the module docstring."""

    BACKENDS = ("auto", *PD_SCAN_BACKENDS)
    name = "pd_ssm"

    def __init__(
        self, d_model: int, d_state: int = 32, dictionary_size: int = 8, mlp_expand: int = 2, backend: str = "auto"
    ):
        super().__init__(d_model, d_state, mlp_expand, backend)
        K, N = positive_int("dictionary_size", dictionary_size), self.d_state
        self.selector = nn.Linear(d_model, K, bias=False)
        self.dictionary = nn.Parameter(torch.randn(K, N, N) / math.sqrt(N))

    def selection(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(index (B, L, N), soft (B, L, N, N))``: the row of each column's 1 in ``P_t`` and the
        column-wise softmax its gradient follows."""
        logits = torch.einsum("blk,kmn->blmn", torch.softmax(self.selector(u), dim=-1), self.dictionary)
        return logits.argmax(dim=-2), torch.softmax(logits, dim=-2)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        d, x = self.diagonal(u), self.inputs(u)
        index, soft = self.selection(u)
        N = self.d_state
        if self.backend == "reference":  # dense A_t = P_t D_t with straight-through P_t
            P = F.one_hot(index, N).transpose(-1, -2).to(soft.dtype) + soft - soft.detach()  # P[m, n]
            A = P[..., None] * d[:, :, None]  # (B, L, N, N, 2): A[m, n] = P[m, n] d[n]
            h = _e0(x[:, 0])
            states = []
            for t in range(u.shape[1]):
                Ar, Ai, hr, hi = A[:, t, ..., 0], A[:, t, ..., 1], h[..., 0:1], h[..., 1:2]
                h = torch.cat([Ar @ hr - Ai @ hi, Ar @ hi + Ai @ hr], dim=-1) + x[:, t]
                states.append(h)
            h = torch.stack(states, dim=1) if states else x
            return self.readout(h, u)
        # the start e_0 enters as the first step's image of it: column 0 of A_0, d_0[0] in row index_0[0]
        start = torch.zeros_like(x[:, 0]).scatter_add(1, index[:, 0, :1, None].expand(-1, 1, 2), d[:, 0, :1])
        x = torch.cat([x[:, :1] + start[:, None], x[:, 1:]], dim=1)
        if torch.is_grad_enabled() and u.shape[1]:
            with torch.no_grad():
                prev = pd_scan(index, d, x, backend=self.backend)
            prev = torch.cat([_e0(prev[:, :1]), prev[:, :-1]], dim=1)  # h_{t-1}, without gradient
            moved = multiply(d.detach(), prev)
            x = x + torch.einsum("blmn,blnc->blmc", soft - soft.detach(), moved)  # zero; soft P's gradient
        return self.readout(pd_scan(index, d, x, backend=self.backend), u)


def _e0(like: torch.Tensor) -> torch.Tensor:
    """The start state ``e_0`` (lane 0 real part 1) with ``like``'s shape ``(..., N, 2)``; built on the
    device without a host copy, so CUDA-graph capturable."""
    unit = torch.arange(like.shape[-2] * 2, device=like.device) == 0
    return unit.to(like.dtype).view(like.shape[-2], 2).expand_as(like).clone()


@register_mixer("pd_ssm")
def pd_ssm(d_model: int, num_heads: int | None = None, **config) -> PDSSM:
    """PD-SSM (Terzić et al. 2025): transitions P_t D_t. ``num_heads`` is accepted and unused."""
    return PDSSM(d_model, **config)


@register_mixer("complex_diag")
def complex_diag(d_model: int, num_heads: int | None = None, **config) -> ComplexDiag:
    """Diagonal complex linear RNN (PD-SSM with P = I, h_{-1} = 0). ``num_heads`` is accepted and unused."""
    return ComplexDiag(d_model, **config)
