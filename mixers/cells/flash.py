"""FlashGRU and FlashLSTM (paper 000 §3): GRU / LSTM-CIFG cells with diagonal state matrices.

Per head (``d_in`` input channels, ``d_state`` = ``Ds`` state channels), with ``u = x @ B + b``
computed once for all positions (``input_projection``):

FlashGRU (eq. 7a + 9), ``jacobian = "diag"``, parameters ``B (3, d_in, Ds)``, ``b (3, Ds)``,
``a (3, Ds)`` for the gates (z, r, c)::

    z = sigmoid(a_z * h + u_z)        r = sigmoid(a_r * h + u_r)
    c = tanh(a_c * (h * r) + u_c)     h' = (1 - z) * h + z * c

FlashLSTM (eq. 7b + 9), ``jacobian = "block2"``, state ``[c, h]`` (size ``2 Ds``), output ``h``;
parameters ``B (3, d_in, Ds)``, ``b (3, Ds)``, ``a (3, Ds)`` for the gates (f, z, o), peepholes
``p (2, Ds)`` = (c_f, c_o)::

    f = sigmoid(a_f * h + u_f + c_f * c_prev)    z = tanh(a_z * h + u_z)
    c = f * c_prev + (1 - f) * z                 o = sigmoid(a_o * h + u_o + c_o * c)
    h = o * tanh(c)

Closed-form Jacobians: eq. 8 with diagonal ``A``, ``C``. In a mixer the heads' parameters are
``mixer.stacked_parameters()``: ``B (H, 3, d_in, Ds)``, ``b (H, 3, Ds)``, ``a (H, 3, Ds)`` and, for
FlashLSTM, ``p (H, 2, Ds)``.

Initialization (App. C.1, as apple/ml-pararnn's ``pararnn/utils/init.py`` computes it): ``B``
Kaiming-uniform per gate, bound ``sqrt(3 / d_in)`` (``kaiming_uniform_`` with gain 1; fan-in the
head's ``d_in``); ``a`` and ``p`` Xavier-normal as the diagonals of the whole cell's state matrix,
std ``1 / sqrt(total_state)`` with ``total_state`` the state width of all heads together (64 in
paper 000's synthetic models: std 0.125), truncated to ``[-0.9, 0.9]``; biases 0. Clipping:
``clip_norm`` (default 0.9, the synthetic-task value; ``None`` for parity, where the paper found it
harmful) bounds the norm of ``diag(a_*)`` and ``diag(c_*)`` -- for a diagonal matrix the largest
``|entry|`` -- by projecting the entries into ``[-clip_norm, clip_norm]`` at initialization and
before every forward (``project_parameters_``), so the bound holds throughout training (projected
gradient descent).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mixers.cells.base import RNNCell
from mixers.cells.mixer import cell_mixer
from mixers.registry import register_mixer
from mixers.validate import is_int
from seqkernels.newton.cells import flashgru_jacobian, flashgru_step, flashlstm_jacobian, flashlstm_step

#: the Xavier-normal diagonals are drawn from a normal truncated to [-DIAG_TRUNCATION, DIAG_TRUNCATION]
DIAG_TRUNCATION = 0.9


class _FlashCell(RNNCell):
    """Shared parameters and initialization of FlashGRU / FlashLSTM (gates: 3, diagonals ``a``).

    ``total_state``: the state width of the whole multi-head cell (default ``d_state``: one head),
    the fan of the diagonals' Xavier-normal init; the mixer factories pass ``num_heads * d_state``.
    """

    n_peepholes = 0

    def __init__(self, d_in: int, d_state: int, clip_norm: float | None = 0.9, total_state: int | None = None):
        super().__init__()
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be None or > 0, got {clip_norm!r}")
        total_state = d_state if total_state is None else total_state
        if not is_int(total_state) or total_state < d_state:
            raise ValueError(f"total_state must be an int >= d_state={d_state}, got {total_state!r}")
        self.d_in, self.d_state, self.clip_norm, self.total_state = d_in, d_state, clip_norm, total_state
        self.B = nn.Parameter(torch.empty(3, d_in, d_state))
        self.b = nn.Parameter(torch.empty(3, d_state))
        self.a = nn.Parameter(torch.empty(3, d_state))
        if self.n_peepholes:
            self.p = nn.Parameter(torch.empty(self.n_peepholes, d_state))
        self.reset_parameters()

    def _diagonals(self) -> list[torch.Tensor]:
        return [self.a] + ([self.p] if self.n_peepholes else [])

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for g in range(3):  # (Ds, d_in) view: fan-in d_in; gain 1: bound sqrt(3 / d_in)
                nn.init.kaiming_uniform_(self.B[g].T, nonlinearity="linear")
            self.b.zero_()
            for d in self._diagonals():  # Xavier-normal of the (total_state x total_state) diag: std 1/sqrt(n)
                nn.init.trunc_normal_(d, 0.0, 1.0 / math.sqrt(self.total_state), -DIAG_TRUNCATION, DIAG_TRUNCATION)
        self.project_parameters_()

    def project_parameters_(self) -> None:
        if self.clip_norm is not None:
            with torch.no_grad():
                for d in self._diagonals():
                    d.clamp_(-self.clip_norm, self.clip_norm)

    def input_projection(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., d_in)`` -> ``u = x @ B + b`` ``(..., 3, Ds)``."""
        return torch.einsum("...i,gis->...gs", x, self.B) + self.b

    @classmethod
    def heads_input_projection(cls, params: dict, x: torch.Tensor) -> torch.Tensor:
        """Every head's ``input_projection`` at once: ``x (B, L, H * d_in)`` -> ``u (H, B, L, 3, Ds)``,
        one GEMM with the block-diagonal matrix of the heads' ``B`` (``H`` blocks ``(d_in, 3 Ds)``).
        Per head (a GEMM batched over heads) the weight gradient is ``H`` products of ``d_in x 3 Ds``
        over all ``B * L`` rows, which cuBLAS runs on a few CTAs; one ``(H d_in, H 3 Ds)`` product
        spreads over the GPU (its zero blocks cost little at these widths)."""
        Bw, b = params["B"], params["b"]  # (H, 3, d_in, Ds), (H, 3, Ds)
        H, G, d_in, Ds = Bw.shape
        W = torch.block_diag(*Bw.permute(0, 2, 1, 3).reshape(H, d_in, G * Ds).unbind(0))
        u = (x.reshape(-1, H * d_in) @ W).view(*x.shape[:-1], H, G, Ds)
        return u.permute(2, 0, 1, 3, 4) + b[:, None, None]


class FlashGRUCell(_FlashCell):
    """FlashGRU for one head; see the module docstring (equations: ``seqkernels.newton.cells``)."""

    jacobian = "diag"

    def state_update(self, h: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return flashgru_step(h, u, self.a)

    def jacobian_fn(self, h: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Eq. 8 (diagonal), ``(..., Ds)``."""
        return flashgru_jacobian(h, u, self.a)

    @classmethod
    def fused_apply(
        cls, params: dict, u: torch.Tensor, *, iters: int, tol: float | None, skip: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``mode="fused"``: all Newton iterations in one Triton kernel (``seqkernels.newton.gru_kernels``)."""
        from seqkernels.newton.gru_kernels import flashgru_fused

        return flashgru_fused(u.contiguous(), params["a"].contiguous(), iters, tol, skip=skip)[0]

    @classmethod
    def fused_sequential(cls, params: dict, u: torch.Tensor) -> torch.Tensor:
        """``mode="sequential"`` on CUDA: the loop's states in one Triton launch (``flashgru_sequential``)."""
        from seqkernels.newton.gru_kernels import flashgru_sequential

        return flashgru_sequential(u.contiguous(), params["a"].contiguous())


class FlashLSTMCell(_FlashCell):
    """FlashLSTM (CIFG with peepholes) for one head; state ``[c, h]``; see the module docstring."""

    jacobian = "block2"
    n_peepholes = 2

    def __init__(self, d_in: int, d_state: int, clip_norm: float | None = 0.9, total_state: int | None = None):
        super().__init__(d_in, d_state, clip_norm, total_state)
        self.state_size = 2 * d_state

    def state_update(self, state: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return flashlstm_step(state, u, self.a, self.p)

    def jacobian_fn(self, state: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Eq. 8 with diagonal blocks: ``(..., 2, 2, Ds)`` = ``[[J_cc, J_ch], [J_hc, J_hh]]``."""
        return flashlstm_jacobian(state, u, self.a, self.p)

    def output(self, state: torch.Tensor) -> torch.Tensor:
        return state[..., self.d_state :]

    @classmethod
    def fused_apply(
        cls, params: dict, u: torch.Tensor, *, iters: int, tol: float | None, skip: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``mode="fused"``: all Newton iterations in one Triton kernel (``seqkernels.newton.lstm_kernels``)."""
        from seqkernels.newton.lstm_kernels import flashlstm_fused

        return flashlstm_fused(
            u.contiguous(), params["a"].contiguous(), params["p"].contiguous(), iters, tol, skip=skip
        )[0]

    @classmethod
    def fused_sequential(cls, params: dict, u: torch.Tensor) -> torch.Tensor:
        """``mode="sequential"`` on CUDA: the loop's states in one Triton launch (``flashlstm_sequential``)."""
        from seqkernels.newton.lstm_kernels import flashlstm_sequential

        return flashlstm_sequential(u.contiguous(), params["a"].contiguous(), params["p"].contiguous())


def _with_total_state(d_model: int, config: dict) -> dict:
    """``config`` plus the whole mixer's state width as the cells' ``total_state`` (the init's fan)."""
    return {"total_state": config.get("d_state") or d_model, **config}


@register_mixer("flashgru")
def flashgru(d_model: int, **config) -> nn.Module:
    """FlashGRU mixer: ``cell_mixer(FlashGRUCell, d_model, **config)`` (``clip_norm`` goes to the cell)."""
    return cell_mixer(FlashGRUCell, d_model, **_with_total_state(d_model, config))


@register_mixer("flashlstm")
def flashlstm(d_model: int, **config) -> nn.Module:
    """FlashLSTM mixer: ``cell_mixer(FlashLSTMCell, d_model, **config)``; outputs ``h`` of ``[c, h]``."""
    return cell_mixer(FlashLSTMCell, d_model, **_with_total_state(d_model, config))
