"""Newton-parallel application of nonlinear recurrences (paper 000).

Family entry points (backends ``seqkernels/README.md``): ``flashgru(u, a, iters=3, tol=None,
backend="auto")`` -> ``h (H, B, L, Ds)`` and ``flashlstm(u, a, p, iters=3, tol=None, backend="auto")``
-> ``[c, h] (H, B, L, 2 Ds)``, with ``u (H, B, L, 3, Ds)`` the gates' input pre-activations, ``a (H, 3,
Ds)`` the diagonal state weights, ``p (H, 2, Ds)`` the peepholes:

- ``"reference"``: the loop (``reference.py``);
- ``"torch"``: ``newton_apply`` with the closed-form Jacobian and the torch log-step reduction;
- ``"triton"``: all Newton iterations in one Triton kernel per direction (``gru_kernels.py``,
  ``lstm_kernels.py``; float32);
- ``"triton-sequential"``: the loop's exact states by the same kernels with one-step chunks (one
  iteration from the exact previous state is ``f`` itself); ``iters``, ``tol`` unused; float32;
- ``"auto"``: ``triton`` on CUDA float32 inputs, else ``torch``.

``iters`` Newton iterations (at most, with ``tol``: stop once the max residual is ``<= tol``); the
results are differentiable in ``u, a, p``. The general machinery:

- ``newton_apply(step, u, params, state_size=, structure=, ...)``: the differentiable Newton solve
  of any pure step, with residual checking and sequential fallback / ``NewtonDivergenceError``;
- ``sequential_apply(step, u, params, state_size=)``: the loop (ground truth, ``reference.py``);
- ``solve_bidiagonal(jac, rhs, structure, reverse=False, backend=)``: the reduction of one Newton
  step for ``diag`` / ``block2`` / ``dense`` Jacobians (``reduction.py``; ``backend``: the scan's);
- ``autograd_jacobian(step, h_prev, structure)``: structured Jacobians by JVPs;
- ``flashgru_step`` / ``flashgru_jacobian`` / ``flashlstm_step`` / ``flashlstm_jacobian``: paper
  000's cells as pure functions (``cells.py``).

Step functions are pure: ``step(h_prev, u, *params) -> h``, position-wise over leading dims.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from seqkernels._dispatch import resolve
from seqkernels.newton.cells import flashgru_jacobian, flashgru_step, flashlstm_jacobian, flashlstm_step
from seqkernels.newton.jacobian import autograd_jacobian
from seqkernels.newton.pytorch import (
    NewtonDivergenceError,
    NewtonFunction,
    NewtonStats,
    check_residual,
    newton_apply,
    residual,
    shift_states,
)
from seqkernels.newton.reduction import STRUCTURES, jacobian_shape, solve_bidiagonal, transpose_jacobian
from seqkernels.newton.reference import flashgru_reference, flashlstm_reference, sequential_apply


def flashgru_torch(u: torch.Tensor, a: torch.Tensor, iters: int = 3, tol: float | None = None) -> torch.Tensor:
    """FlashGRU states by ``newton_apply`` (closed-form Jacobian, torch reduction, no residual check)."""
    return newton_apply(
        flashgru_step,
        u,
        (a[:, None, None],),
        state_size=u.shape[-1],
        structure="diag",
        jac=flashgru_jacobian,
        time_dim=2,
        iters=iters,
        tol=tol,
        backend="torch",
        check=False,
    )[0]


def flashlstm_torch(
    u: torch.Tensor, a: torch.Tensor, p: torch.Tensor, iters: int = 3, tol: float | None = None
) -> torch.Tensor:
    """FlashLSTM states ``[c, h]`` by ``newton_apply`` (2x2-block Jacobian, torch reduction, no check)."""
    return newton_apply(
        flashlstm_step,
        u,
        (a[:, None, None], p[:, None, None]),
        state_size=2 * u.shape[-1],
        structure="block2",
        jac=flashlstm_jacobian,
        time_dim=2,
        iters=iters,
        tol=tol,
        backend="torch",
        check=False,
    )[0]


FLASHGRU_BACKENDS: dict[str, Callable] = {"reference": flashgru_reference, "torch": flashgru_torch}
FLASHLSTM_BACKENDS: dict[str, Callable] = {"reference": flashlstm_reference, "torch": flashlstm_torch}

try:  # Triton is optional (e.g. macOS)
    from seqkernels.newton.gru_kernels import flashgru_fused, flashgru_sequential
    from seqkernels.newton.lstm_kernels import flashlstm_fused, flashlstm_sequential

    def flashgru_triton(u: torch.Tensor, a: torch.Tensor, iters: int = 3, tol: float | None = None) -> torch.Tensor:
        """FlashGRU states by the fused Triton Newton kernel (any strides)."""
        return flashgru_fused(u.contiguous(), a.contiguous(), iters, tol)[0]

    def flashlstm_triton(
        u: torch.Tensor, a: torch.Tensor, p: torch.Tensor, iters: int = 3, tol: float | None = None
    ) -> torch.Tensor:
        """FlashLSTM states ``[c, h]`` by the fused Triton Newton kernel (any strides)."""
        return flashlstm_fused(u.contiguous(), a.contiguous(), p.contiguous(), iters, tol)[0]

    def flashgru_triton_sequential(
        u: torch.Tensor, a: torch.Tensor, iters: int = 3, tol: float | None = None
    ) -> torch.Tensor:
        """FlashGRU states of the loop (exact; ``iters``, ``tol`` unused) in one Triton launch per direction."""
        return flashgru_sequential(u.contiguous(), a.contiguous())

    def flashlstm_triton_sequential(
        u: torch.Tensor, a: torch.Tensor, p: torch.Tensor, iters: int = 3, tol: float | None = None
    ) -> torch.Tensor:
        """FlashLSTM states ``[c, h]`` of the loop (exact; ``iters``, ``tol`` unused) in one Triton launch."""
        return flashlstm_sequential(u.contiguous(), a.contiguous(), p.contiguous())

    FLASHGRU_BACKENDS["triton"] = flashgru_triton
    FLASHLSTM_BACKENDS["triton"] = flashlstm_triton
    FLASHGRU_BACKENDS["triton-sequential"] = flashgru_triton_sequential
    FLASHLSTM_BACKENDS["triton-sequential"] = flashlstm_triton_sequential
except ImportError:  # pragma: no cover
    pass


def flashgru(
    u: torch.Tensor, a: torch.Tensor, iters: int = 3, tol: float | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """FlashGRU states ``(H, B, L, Ds)``; see the module docstring."""
    name = resolve("flashgru", backend, FLASHGRU_BACKENDS, u, u.dtype == torch.float32)
    return FLASHGRU_BACKENDS[name](u, a, iters, tol)


def flashlstm(
    u: torch.Tensor,
    a: torch.Tensor,
    p: torch.Tensor,
    iters: int = 3,
    tol: float | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """FlashLSTM states ``[c, h] (H, B, L, 2 Ds)``; see the module docstring."""
    name = resolve("flashlstm", backend, FLASHLSTM_BACKENDS, u, u.dtype == torch.float32)
    return FLASHLSTM_BACKENDS[name](u, a, p, iters, tol)


__all__ = [
    "FLASHGRU_BACKENDS",
    "FLASHLSTM_BACKENDS",
    "STRUCTURES",
    "NewtonDivergenceError",
    "NewtonFunction",
    "NewtonStats",
    "autograd_jacobian",
    "check_residual",
    "flashgru",
    "flashgru_jacobian",
    "flashgru_reference",
    "flashgru_step",
    "flashgru_torch",
    "flashlstm",
    "flashlstm_jacobian",
    "flashlstm_reference",
    "flashlstm_step",
    "flashlstm_torch",
    "jacobian_shape",
    "newton_apply",
    "residual",
    "sequential_apply",
    "shift_states",
    "solve_bidiagonal",
    "transpose_jacobian",
]
