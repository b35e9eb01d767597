"""Newton's method for a nonlinear recurrence, solved all at once (paper 000 §2, Alg. 1a, App. A).

The recurrence ``h_t = f(h_{t-1}, u_t)`` (``h_{-1} = 0``) over ``t = 0 .. L-1`` is the system
``h_t - f(h_{t-1}, u_t) = 0`` (eq. 2). Starting from ``h^0_t = f(0, u_t)`` (eq. 10), each Newton
iteration linearizes it (eq. 3) and solves ``delta_t = J_t delta_{t-1} + r_t`` with
``r_t = f(h^k_{t-1}, u_t) - h^k_t`` and ``J_t = df/dh (h^k_{t-1}, u_t)`` by one parallel scan
(eq. 4-5), then ``h^{k+1} = h^k + delta``.

The backward pass (eq. 6) is linear: the adjoint ``lambda_t = g_t + J_{t+1}^T lambda_{t+1}`` is one
reverse scan with transposed Jacobians at the solution, then one autograd call of the all-at-once
step ``f(h_shifted, u)`` with ``lambda`` as output gradient gives the gradients of ``u`` and of the
parameters (``NewtonFunction``).

Conventions: the step is a pure function ``step(h_prev, u, *params) -> h`` acting position-wise
for any leading dims; states are ``(*lead, L, S)`` where ``lead = u.shape[:time_dim]`` and ``u``
is ``(*lead, L, *feat)``. Jacobians are structured as in ``seqkernels.newton.reduction``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch.autograd.function import once_differentiable

from seqkernels._validate import non_negative_int
from seqkernels.newton.jacobian import autograd_jacobian
from seqkernels.newton.reduction import check_structure, solve_bidiagonal, transpose_jacobian
from seqkernels.newton.reference import StepFn, sequential_apply

JacFn = Callable[..., torch.Tensor]  # jac(h_prev, u, *params) -> structured Jacobian

ON_DIVERGENCE = ("fallback", "raise")


class NewtonDivergenceError(RuntimeError):
    """Newton's residual is non-finite or above ``divergence_tol``; ``.residuals`` holds its history."""

    def __init__(self, message: str, residuals: Sequence[float]):
        super().__init__(message)
        self.residuals = list(residuals)


class NewtonStats:
    """What one Newton solve did.

    ``residuals[k]`` is ``max |f(h^k_{t-1}, u_t) - h^k_t|`` over every position, batch element and
    channel, for the initial guess (``k = 0``) and after each iteration ``k = 1 ..``. They may be
    given as a device tensor, read (one device sync) on first access of ``residuals``.
    ``fell_back``: the residual check failed and the sequential result was returned instead.
    ``retried``: the check failed and the solve was run again with more iterations (fused mode;
    ``residuals`` then holds the final residual of each attempt).
    """

    def __init__(
        self,
        residuals: Sequence[float] | torch.Tensor = (),
        mode: str = "parallel",
        fell_back: bool = False,
        retried: bool = False,
    ):
        self._residuals = residuals if isinstance(residuals, torch.Tensor) else list(residuals)
        self.mode, self.fell_back, self.retried = mode, fell_back, retried

    @property
    def residuals(self) -> list[float]:
        if isinstance(self._residuals, torch.Tensor):
            self._residuals = self._residuals.tolist()
        return self._residuals

    @residuals.setter
    def residuals(self, values: Sequence[float]) -> None:
        self._residuals = list(values)

    @property
    def iterations(self) -> int:
        return max(len(self.residuals) - 1, 0)

    @property
    def final_residual(self) -> float:
        return self.residuals[-1] if self.residuals else math.nan

    def __repr__(self) -> str:
        return (
            f"NewtonStats(residuals={self.residuals}, mode={self.mode!r}, fell_back={self.fell_back}, "
            f"retried={self.retried})"
        )


def shift_states(h: torch.Tensor, time_dim: int) -> torch.Tensor:
    """``h_{t-1}`` at every ``t`` (zeros at ``t = 0``) for states ``(*lead, L, S)``."""
    L = h.shape[time_dim]
    zero = torch.zeros_like(h.narrow(time_dim, 0, min(L, 1)))
    return torch.cat([zero, h.narrow(time_dim, 0, max(L - 1, 0))], dim=time_dim)


def _next_step(jac: torch.Tensor, time_dim: int) -> torch.Tensor:
    """``J_{t+1}`` at every ``t`` (zeros at ``t = L - 1``)."""
    L = jac.shape[time_dim]
    zero = torch.zeros_like(jac.narrow(time_dim, 0, min(L, 1)))
    return torch.cat([jac.narrow(time_dim, 1, max(L - 1, 0)), zero], dim=time_dim)


def _state_shape(u: torch.Tensor, time_dim: int, state_size: int) -> tuple[int, ...]:
    return (*u.shape[: time_dim + 1], state_size)


def residual(
    step: StepFn, h: torch.Tensor, u: torch.Tensor, params: Sequence[torch.Tensor], time_dim: int
) -> torch.Tensor:
    """``f(h_{t-1}, u_t) - h_t`` at every position (the all-at-once residual of eq. 2)."""
    return step(shift_states(h, time_dim), u, *params) - h


@dataclasses.dataclass
class _Solver:
    """The configuration of one solve (shared by the forward and the backward of ``NewtonFunction``)."""

    step: StepFn
    jac: JacFn | None
    structure: str
    state_size: int
    time_dim: int = 1
    iters: int = 3
    tol: float | None = None
    damping: float | None = None
    backend: str = "auto"
    residuals: list = dataclasses.field(default_factory=list)  # filled by the forward (tensors)

    def jacobian(self, h_prev: torch.Tensor, u: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.jac is not None:
            return self.jac(h_prev, u, *params)
        return autograd_jacobian(lambda h: self.step(h, u, *params), h_prev, self.structure)

    def iterate(self, u: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
        """Newton iterations (no autograd); records the residual history in ``self.residuals``."""
        zeros = u.new_zeros(_state_shape(u, self.time_dim, self.state_size))
        h = self.step(zeros, u, *params)  # eq. 10: h^0_t = f(0, u_t)
        self.residuals = []
        for k in range(self.iters + 1):
            h_prev = shift_states(h, self.time_dim)
            r = self.step(h_prev, u, *params) - h
            self.residuals.append(r.abs().amax() if r.numel() else r.new_zeros(()))
            if k == self.iters or (self.tol is not None and float(self.residuals[-1]) <= self.tol):
                break
            J = self.jacobian(h_prev, u, params)
            if self.damping:
                J = J * (1.0 - self.damping)
            h = h + solve_bidiagonal(J, r, self.structure, backend=self.backend)
        return h

    def adjoint(
        self, h: torch.Tensor, u: torch.Tensor, params: Sequence[torch.Tensor], grad_h: torch.Tensor
    ) -> torch.Tensor:
        """``lambda_t = grad_h_t + J_{t+1}^T lambda_{t+1}`` (eq. 6) by one reverse scan."""
        J = self.jacobian(shift_states(h, self.time_dim), u, params)
        J_next_T = transpose_jacobian(_next_step(J, self.time_dim), self.structure)
        return solve_bidiagonal(J_next_T, grad_h, self.structure, reverse=True, backend=self.backend)


class NewtonFunction(torch.autograd.Function):
    """``h = NewtonFunction.apply(solver, u, *params)``: Newton forward, one-scan adjoint backward."""

    @staticmethod
    def forward(ctx, solver: _Solver, u: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        h = solver.iterate(u, params)
        ctx.solver = solver
        ctx.save_for_backward(h, u, *params)
        return h

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h: torch.Tensor):
        h, u, *params = ctx.saved_tensors
        solver: _Solver = ctx.solver
        need = ctx.needs_input_grad[1:]
        if not any(need):
            return (None, None, *[None] * len(params))
        lam = solver.adjoint(h, u, params, grad_h)
        h_prev = shift_states(h, solver.time_dim)
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_(n) for t, n in zip((u, *params), need)]
            out = solver.step(h_prev, *inputs)
            wanted = [t for t, n in zip(inputs, need) if n]
            grads = iter(torch.autograd.grad(out, wanted, lam, allow_unused=True))
        result = [next(grads) if n else None for n in need]
        result = [torch.zeros_like(t) if n and g is None else g for t, n, g in zip((u, *params), need, result)]
        return (None, *result)


def check_residual(final: float, h_max: float, divergence_tol: float) -> bool:
    """Is a final max residual acceptable? Finite and ``<= divergence_tol * max(1, max |h|)``."""
    return math.isfinite(final) and math.isfinite(h_max) and final <= divergence_tol * max(1.0, h_max)


def newton_apply(
    step: StepFn,
    u: torch.Tensor,
    params: Sequence[torch.Tensor] = (),
    *,
    state_size: int,
    structure: str,
    jac: JacFn | None = None,
    time_dim: int = 1,
    iters: int = 3,
    tol: float | None = None,
    damping: float | None = None,
    backend: str = "auto",
    check: bool = True,
    divergence_tol: float = 1e-4,
    on_divergence: str = "fallback",
) -> tuple[torch.Tensor, NewtonStats]:
    """Apply the recurrence ``h_t = step(h_{t-1}, u_t)`` by Newton's method; differentiable.

    Args:
        step: ``step(h_prev, u, *params) -> h``, position-wise for any leading dims.
        u: inputs ``(*lead, L, *feat)`` with time at ``time_dim``.
        params: tensors the step depends on (they receive gradients).
        state_size: ``S``; the states are ``(*lead, L, S)``.
        structure: ``"diag" | "block2" | "dense"`` (``seqkernels.newton.reduction``).
        jac: closed-form ``jac(h_prev, u, *params)`` in ``structure``; default: autograd (JVPs).
        iters: Newton iterations (at most, with ``tol``). ``tol``: stop early once the max residual
            is ``<= tol``. ``damping`` in ``[0, 1]``: scale the Jacobians by ``1 - damping``
            (``1`` = Picard / Jacobi iteration: slower, but converges in at most ``L`` iterations).
        backend: the ``seqkernels.scan`` backend of the reduction.
        check: verify the final residual (one device sync); if it is non-finite or above
            ``divergence_tol * max(1, max |h|)``, ``on_divergence="fallback"`` returns the
            sequential result (``stats.fell_back``) and ``"raise"`` raises ``NewtonDivergenceError``.
            With ``check=False`` and ``tol=None`` the solve reads nothing back to the host (CUDA
            graphs can capture it); ``tol`` stops early by a host read per iteration.

    Returns ``(h (*lead, L, S), NewtonStats)``.
    """
    check_structure(structure)
    non_negative_int("iters", iters)
    if tol is not None and not tol >= 0:
        raise ValueError(f"tol must be None or >= 0, got {tol!r}")
    if damping is not None and not 0.0 <= damping <= 1.0:
        raise ValueError(f"damping must be None or in [0, 1], got {damping!r}")
    if on_divergence not in ON_DIVERGENCE:
        raise ValueError(f"on_divergence must be one of {', '.join(ON_DIVERGENCE)}, got {on_divergence!r}")
    if not divergence_tol > 0:
        raise ValueError(f"divergence_tol must be > 0, got {divergence_tol!r}")
    solver = _Solver(step, jac, structure, state_size, time_dim, iters, tol, damping, backend)
    h = NewtonFunction.apply(solver, u, *params)
    if not check:  # no host read: the residuals stay on the device until someone reads them
        return h, NewtonStats(residuals=torch.stack(solver.residuals), mode="parallel")
    values = torch.stack([*solver.residuals, h.detach().abs().amax() if h.numel() else h.new_zeros(())]).tolist()
    stats = NewtonStats(residuals=values[:-1], mode="parallel")
    if not check_residual(stats.final_residual, values[-1], divergence_tol):
        message = (
            f"Newton did not converge: max residual {stats.final_residual:.3g} after {stats.iterations} "
            f"iterations (divergence_tol {divergence_tol:g}); residual per iteration: "
            + ", ".join(f"{r:.3g}" for r in stats.residuals)
        )
        if on_divergence == "raise":
            raise NewtonDivergenceError(message, stats.residuals)
        h = sequential_apply(step, u, params, state_size=state_size, time_dim=time_dim)
        stats.fell_back = True
    return h, stats
