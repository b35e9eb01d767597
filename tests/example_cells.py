"""Recurrent cells written with only ``recurrence_step``, shared by the cell and probe tests.

Honest cells of each Jacobian structure (``DiagCell``, ``Block2Cell``, ``DenseCell``) and cells that
break a rule: a wrong declaration (``DenseDeclaredDiag``, ``Block2DeclaredDiag``), a coupling that starts
at zero so the declaration holds only at build time (``ZeroCouplingDiag``, ``ZeroPairingDiag``,
``ClosedFormIgnoresC``), steps that mix positions (``RunningMeanOverTime``, ``CumsumOverDim2``), an
expanding recurrence (``ChaoticCell``) and a non-finite one (``NonFiniteCell``). Importable as
``example_cells`` (``tests/`` is on ``sys.path`` through its ``conftest.py``).
"""

import math

import torch
from torch import nn

from mixers.cells import RNNCell


class DiagCell(RNNCell):
    jacobian = "diag"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.w = nn.Parameter(torch.rand(d_state) * 1.6 - 0.8)
        self.W = nn.Parameter(torch.randn(d_in, d_state) / d_in**0.5)

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + x @ self.W)


class Block2Cell(RNNCell):
    """A damped nonlinear rotation of the pairs (p_i, q_i): 2x2 blocks of diagonals."""

    jacobian = "block2"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.theta = nn.Parameter(torch.rand(d_state // 2) * math.pi)
        self.W = nn.Parameter(torch.randn(d_in, d_state) / d_in**0.5)

    def recurrence_step(self, h, x):
        half = h.shape[-1] // 2
        p, q, v = h[..., :half], h[..., half:], x @ self.W
        c, s = torch.cos(self.theta), torch.sin(self.theta)
        return torch.cat(
            [torch.tanh(0.8 * (c * p - s * q) + v[..., :half]), torch.tanh(0.8 * (s * p + c * q) + v[..., half:])], -1
        )


class DenseCell(RNNCell):
    jacobian = "dense"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.R = nn.Parameter(torch.randn(d_state, d_state) * 0.7 / d_state**0.5)
        self.W = nn.Parameter(torch.randn(d_in, d_state) / d_in**0.5)

    def recurrence_step(self, h, x):
        return torch.tanh(h @ self.R + x @ self.W)


class DenseDeclaredDiag(DenseCell):
    jacobian = "diag"


class Block2DeclaredDiag(Block2Cell):
    jacobian = "diag"


class ZeroCouplingDiag(DiagCell):
    """Declares a diagonal Jacobian; mixes the state channels through R, which starts at zero."""

    def __init__(self, d_in, d_state):
        super().__init__(d_in, d_state)
        self.R = nn.Parameter(torch.zeros(d_state, d_state))

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + h @ self.R + x @ self.W)


class ZeroPairingDiag(DiagCell):
    """Declares a diagonal Jacobian; couples state half i with half 1 - i through c, which starts at zero."""

    def __init__(self, d_in, d_state):
        super().__init__(d_in, d_state)
        self.c = nn.Parameter(torch.zeros(d_state))

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + self.c * h.roll(h.shape[-1] // 2, -1) + x @ self.W)


class ClosedFormIgnoresC(DiagCell):
    """h' = tanh(w h + c h^2 + W x) with c starting at zero and a jacobian_fn that leaves c out."""

    def __init__(self, d_in, d_state):
        super().__init__(d_in, d_state)
        self.c = nn.Parameter(torch.zeros(d_state))

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + self.c * h * h + x @ self.W)

    def jacobian_fn(self, h, u):
        return (1 - self.recurrence_step(h, u) ** 2) * self.w


class WeaklyCoupledDiag(DiagCell):
    """Declared diagonal, with every state coupled to every other by 2e-7 (below the 1e-6 relative
    tolerance entry by entry; the 16 couplings of a row add up above it). No ``jacobian_fn``."""

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + x @ self.W + 2e-7 * h.sum(-1, keepdim=True))


class RunningMeanOverTime(DiagCell):
    """Breaks the position-wise rule: given all positions (B, L, d), adds the running mean over time."""

    def recurrence_step(self, h, x):
        v = x @ self.W
        if v.dim() >= 3:
            v = v.cumsum(-2) / torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]
        return torch.tanh(self.w * h + v)


class CumsumOverDim2(DiagCell):
    """Breaks the position-wise rule: a cumulative sum over the second-to-last dim (time, or batch)."""

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + (x @ self.W).cumsum(-2))


class ChaoticCell(RNNCell):
    """Expanding (|df/dh| up to 4): three Newton iterations are far from the solution."""

    jacobian = "diag"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.W = nn.Parameter(torch.randn(d_in, d_state))

    def recurrence_step(self, h, x):
        return torch.sin(4.0 * h) + x @ self.W


class NonFiniteCell(DiagCell):
    """log(0): -inf states."""

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + x @ self.W) + torch.log(h * 0)


class DenseFlashGRU(RNNCell):
    """FlashGRU's equations (``mixers.cells.flash``) with full ``(Ds, Ds)`` state matrices in place of the
    diagonals ``a_z, a_r, a_c``: the control for what the element-wise recurrence cannot learn."""

    jacobian = "dense"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.B = nn.Parameter(torch.empty(3, d_in, d_state))
        self.b = nn.Parameter(torch.zeros(3, d_state))
        self.A = nn.Parameter(torch.randn(3, d_state, d_state) / d_state**0.5)
        with torch.no_grad():
            for g in range(3):
                nn.init.kaiming_uniform_(self.B[g].T, nonlinearity="linear")

    def input_projection(self, x):
        return torch.einsum("...i,gis->...gs", x, self.B) + self.b

    def state_update(self, h, u):
        z = torch.sigmoid(h @ self.A[0] + u[..., 0, :])
        r = torch.sigmoid(h @ self.A[1] + u[..., 1, :])
        c = torch.tanh((h * r) @ self.A[2] + u[..., 2, :])
        return (1 - z) * h + z * c
