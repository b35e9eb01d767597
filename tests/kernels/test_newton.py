"""seqkernels.newton: the reduction against a dense linear solve, autograd Jacobians against jacrev,
the Newton solve and its one-scan backward against autograd through the sequential loop, and the
divergence paths (fallback / NewtonDivergenceError with the residual history)."""

import math

import pytest
import torch
from torch.func import jacrev, vmap

from seqkernels.newton import (
    NewtonDivergenceError,
    autograd_jacobian,
    check_residual,
    newton_apply,
    sequential_apply,
    solve_bidiagonal,
    transpose_jacobian,
)
from seqkernels.newton.pytorch import _next_step

F64 = torch.float64


def _dense_from(jac, structure, S):
    """Structured (..., ...) -> dense (..., S, S)."""
    if structure == "diag":
        return torch.diag_embed(jac)
    if structure == "block2":
        rows = [torch.cat([torch.diag_embed(jac[..., i, j, :]) for j in range(2)], dim=-1) for i in range(2)]
        return torch.cat(rows, dim=-2)
    return jac


def _random_jac(structure, lead, S, g):
    shape = {"diag": (*lead, S), "block2": (*lead, 2, 2, S // 2), "dense": (*lead, S, S)}[structure]
    return torch.randn(shape, generator=g, dtype=F64) * 0.6


@pytest.mark.parametrize("structure", ["diag", "block2", "dense"])
@pytest.mark.parametrize("L", [1, 2, 7, 19])
def test_reduction_solves_the_bidiagonal_system(structure, L):
    """solve_bidiagonal == a dense solve of the (L S) x (L S) system (I - subdiag(J)) y = r, and its
    reverse with transposed, next-step Jacobians == the solve with the transposed matrix (eq. 6)."""
    g = torch.Generator().manual_seed(L)
    S = 4
    jac = _random_jac(structure, (2, L), S, g)
    r = torch.randn(2, L, S, generator=g, dtype=F64)
    Jd = _dense_from(jac, structure, S)  # (2, L, S, S)
    M = torch.eye(L * S, dtype=F64).repeat(2, 1, 1)
    for t in range(1, L):
        M[:, t * S : (t + 1) * S, (t - 1) * S : t * S] = -Jd[:, t]
    want = torch.linalg.solve(M, r.reshape(2, L * S)).reshape(2, L, S)
    torch.testing.assert_close(solve_bidiagonal(jac, r, structure), want, rtol=1e-10, atol=1e-10)
    want_T = torch.linalg.solve(M.transpose(-1, -2), r.reshape(2, L * S)).reshape(2, L, S)
    got_T = solve_bidiagonal(transpose_jacobian(_next_step(jac, 1), structure), r, structure, reverse=True)
    torch.testing.assert_close(got_T, want_T, rtol=1e-10, atol=1e-10)


def _cells():
    """Steps (h_prev, u, W, a) for each structure: u (..., S)."""

    def diag(h, u, W, a):
        return torch.tanh(a * h + u @ W)

    def block2(h, u, W, a):
        half = h.shape[-1] // 2
        h0, h1 = h[..., :half], h[..., half:]
        v = u @ W
        return torch.cat(
            [torch.tanh(a[:half] * h1 + v[..., :half]) * 0.9, torch.sigmoid(a[half:] * h0 * h1 + v[..., half:])], -1
        )

    def dense(h, u, W, a):
        return torch.tanh(h @ (W * 0.3) + a * u)

    return {"diag": diag, "block2": block2, "dense": dense}


def test_autograd_jacobian_matches_jacrev():
    g = torch.Generator().manual_seed(1)
    S = 6
    W, a = torch.randn(S, S, generator=g, dtype=F64), torch.randn(S, generator=g, dtype=F64)
    h, u = torch.randn(3, 5, S, generator=g, dtype=F64), torch.randn(3, 5, S, generator=g, dtype=F64)
    for structure, step in _cells().items():
        got = autograd_jacobian(lambda hh: step(hh, u, W, a), h, structure)
        full = vmap(vmap(jacrev(lambda hh, uu: step(hh, uu, W, a))))(h, u)
        torch.testing.assert_close(_dense_from(got, structure, S), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("structure", ["diag", "block2", "dense"])
@pytest.mark.parametrize("L", [1, 2, 7, 100])
def test_newton_matches_sequential_with_gradients(structure, L):
    """Two leading dims, time at dim 2; forward and the gradients of u and of both parameters."""
    g = torch.Generator().manual_seed(L)
    S = 6
    step = _cells()[structure]
    W = (torch.randn(S, S, generator=g, dtype=F64) * 0.4).requires_grad_()
    a = (torch.randn(S, generator=g, dtype=F64) * 0.5).requires_grad_()
    u = torch.randn(2, 3, L, S, generator=g, dtype=F64, requires_grad=True)
    h, stats = newton_apply(step, u, (W, a), state_size=S, structure=structure, time_dim=2, iters=60, tol=1e-14)
    hs = sequential_apply(step, u, (W, a), state_size=S, time_dim=2)
    assert not stats.fell_back and stats.final_residual <= 1e-13
    torch.testing.assert_close(h, hs, rtol=1e-10, atol=1e-10)
    gh = torch.randn(h.shape, generator=g, dtype=F64)
    got = torch.autograd.grad((h * gh).sum(), (u, W, a))
    want = torch.autograd.grad((hs * gh).sum(), (u, W, a))
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-9)


def test_closed_form_jac_and_tol_early_exit():
    S = 5
    a = torch.full((S,), 0.5, dtype=F64)
    step = lambda h, u, a: torch.tanh(a * h + u)  # noqa: E731
    jac = lambda h, u, a: a * (1 - torch.tanh(a * h + u) ** 2)  # noqa: E731
    u = torch.randn(2, 50, S, dtype=F64)
    h, stats = newton_apply(step, u, (a,), state_size=S, structure="diag", jac=jac, iters=50, tol=1e-12)
    assert stats.iterations < 50 and stats.final_residual <= 1e-12
    torch.testing.assert_close(h, sequential_apply(step, u, (a,), state_size=S), rtol=1e-11, atol=1e-11)


def test_full_damping_is_picard_and_converges_in_L_iterations():
    S, L = 3, 12
    step = lambda h, u: torch.tanh(2.0 * h + u)  # noqa: E731
    u = torch.randn(1, L, S, dtype=F64)
    h, stats = newton_apply(step, u, state_size=S, structure="diag", iters=L, damping=1.0, check=False)
    torch.testing.assert_close(h, sequential_apply(step, u, (), state_size=S), rtol=0, atol=1e-14)
    assert stats.residuals[1] > 1e-3  # not Newton: the first iteration did not converge


def _chaotic(h, u):
    """Expanding (|df/dh| up to 4): Newton with few iterations is far from the solution."""
    return torch.sin(4.0 * h) + u


def test_divergence_falls_back_to_sequential():
    u = torch.randn(2, 64, 4, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    h, stats = newton_apply(_chaotic, u, state_size=4, structure="diag", iters=2)
    assert stats.fell_back and len(stats.residuals) == 3 and not stats.final_residual <= 1e-4
    hs = sequential_apply(_chaotic, u, (), state_size=4)
    torch.testing.assert_close(h, hs, rtol=0, atol=0)
    (gu,) = torch.autograd.grad(h.sum(), u)  # the fallback is differentiable
    assert torch.isfinite(gu).all()


def test_divergence_raises_with_history():
    u = torch.randn(2, 64, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(NewtonDivergenceError, match="residual per iteration") as info:
        newton_apply(_chaotic, u, state_size=4, structure="diag", iters=2, on_divergence="raise")
    assert len(info.value.residuals) == 3 and info.value.residuals[-1] > 1e-4
    h, stats = newton_apply(_chaotic, u, state_size=4, structure="diag", iters=2, check=False)
    assert not stats.fell_back  # unchecked: returned as is


def test_non_finite_residual_is_rejected():
    assert not check_residual(math.nan, 1.0, 1e-4)
    assert not check_residual(1e-6, math.inf, 1e-4)
    assert check_residual(1e-5, 1.0, 1e-4) and check_residual(1e-3, 100.0, 1e-4)
    step = lambda h, u: torch.exp(u - 5.0 * h)  # noqa: E731 -- bounded sequentially; Newton overflows
    u = torch.rand(1, 30, 2, dtype=F64, generator=torch.Generator().manual_seed(0))
    h, stats = newton_apply(step, u, state_size=2, structure="diag", iters=3)
    assert stats.fell_back and not math.isfinite(stats.final_residual)
    hs = sequential_apply(step, u, (), state_size=2)
    assert torch.isfinite(hs).all()
    torch.testing.assert_close(h, hs, rtol=0, atol=0)


def test_bad_arguments():
    step, u = (lambda h, u: h + u), torch.zeros(1, 3, 2)
    for kwargs, match in [
        ({"structure": "tridiag"}, "unknown Jacobian structure 'tridiag'"),
        ({"structure": "diag", "damping": 2.0}, "damping must be None or in"),
        ({"structure": "diag", "iters": -1}, "iters must be"),
        ({"structure": "diag", "on_divergence": "ignore"}, "on_divergence must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            newton_apply(step, u, state_size=2, **kwargs)
    with pytest.raises(ValueError, match="block2 Jacobian has shape"):
        solve_bidiagonal(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2), "block2")
    with pytest.raises(ValueError, match="dense Jacobians have no 'triton' scan"):
        solve_bidiagonal(torch.zeros(1, 3, 2, 2), torch.zeros(1, 3, 2), "dense", backend="triton")
