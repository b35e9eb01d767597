"""Newton-parallel application of nonlinear recurrences (paper 000).

- ``newton_apply(step, u, params, state_size=, structure=, ...)``: the differentiable Newton solve
  with residual checking and sequential fallback / ``NewtonDivergenceError``;
- ``sequential_apply(step, u, params, state_size=)``: the loop (ground truth);
- ``solve_bidiagonal(jac, rhs, structure, reverse=False, backend=)``: the reduction of one Newton
  step for ``diag`` / ``block2`` / ``dense`` Jacobians (``kernels.newton.reduction``);
- ``autograd_jacobian(step, h_prev, structure)``: structured Jacobians by JVPs;
- ``flashgru_step`` / ``flashgru_jacobian`` / ``flashlstm_step`` / ``flashlstm_jacobian``: paper
  000's cells as pure functions (``kernels.newton.cells``).

Step functions are pure: ``step(h_prev, u, *params) -> h``, position-wise over leading dims.
"""

from kernels.newton.driver import (
    NewtonDivergenceError,
    NewtonFunction,
    NewtonStats,
    check_residual,
    newton_apply,
    residual,
    sequential_apply,
    shift_states,
)
from kernels.newton.cells import flashgru_jacobian, flashgru_step, flashlstm_jacobian, flashlstm_step
from kernels.newton.jacobian import autograd_jacobian
from kernels.newton.reduction import STRUCTURES, jacobian_shape, solve_bidiagonal, transpose_jacobian

__all__ = [
    "STRUCTURES",
    "NewtonDivergenceError",
    "NewtonFunction",
    "NewtonStats",
    "autograd_jacobian",
    "check_residual",
    "flashgru_jacobian",
    "flashgru_step",
    "flashlstm_jacobian",
    "flashlstm_step",
    "jacobian_shape",
    "newton_apply",
    "residual",
    "sequential_apply",
    "shift_states",
    "solve_bidiagonal",
    "transpose_jacobian",
]
