"""seqkernels.scan: the loop reference against an independent closed form, and the torch scans
(diagonal, 2x2-block, dense; forward and reverse; values and gradients) against the reference."""

import pytest
import torch

from seqkernels.scan import (
    SCAN_BACKENDS,
    linear_scan,
    linear_scan_block2,
    linear_scan_block2_reference,
    linear_scan_dense,
    linear_scan_dense_reference,
    linear_scan_reference,
)

LENGTHS = [1, 2, 7, 33, 100, 257]


def _explicit(C: torch.Tensor, x: torch.Tensor, reverse: bool) -> torch.Tensor:
    """y_t = sum_s (prod of C between s and t) x_s, by an O(L^2) double loop over dense matrices.

    C (L, n, n), x (L, n). Forward: y_t = sum_{s<=t} C_t C_{t-1} ... C_{s+1} x_s; reverse mirrors it.
    """
    L, n = x.shape
    y = torch.zeros_like(x)
    for t in range(L):
        P = torch.eye(n, dtype=x.dtype)
        order = range(t, -1, -1) if not reverse else range(t, L)
        for s in order:
            y[t] += P @ x[s]
            P = P @ C[s]
    return y


@pytest.mark.parametrize("reverse", [False, True])
def test_reference_matches_explicit_sum(reverse):
    g = torch.Generator().manual_seed(0)
    B, L, D = 2, 9, 3
    c, x = (
        torch.rand(B, L, D, generator=g, dtype=torch.float64) * 1.5,
        torch.randn(B, L, D, generator=g, dtype=torch.float64),
    )
    C2, x2 = (
        torch.randn(B, L, 2, 2, D, generator=g, dtype=torch.float64),
        torch.randn(B, L, 2, D, generator=g, dtype=torch.float64),
    )
    Cd, xd = (
        torch.randn(B, L, D, D, generator=g, dtype=torch.float64),
        torch.randn(B, L, D, generator=g, dtype=torch.float64),
    )
    y, y2, yd = (
        linear_scan_reference(c, x, reverse),
        linear_scan_block2_reference(C2, x2, reverse),
        linear_scan_dense_reference(Cd, xd, reverse),
    )
    for b in range(B):
        for d in range(D):
            want = _explicit(torch.diag_embed(c[b, :, d : d + 1]), x[b, :, d : d + 1], reverse)
            torch.testing.assert_close(y[b, :, d : d + 1], want, rtol=1e-12, atol=1e-12)
            want2 = _explicit(C2[b, :, :, :, d], x2[b, :, :, d], reverse)
            torch.testing.assert_close(y2[b, :, :, d], want2, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(yd[b], _explicit(Cd[b], xd[b], reverse), rtol=1e-12, atol=1e-12)


def _inputs(kind, B, L, D, dtype, g):
    if kind == "diag":
        return torch.rand(B, L, D, generator=g, dtype=dtype) * 1.8 - 0.9, torch.randn(B, L, D, generator=g, dtype=dtype)
    if kind == "block2":
        return torch.randn(B, L, 2, 2, D, generator=g, dtype=dtype) * 0.5, torch.randn(
            B, L, 2, D, generator=g, dtype=dtype
        )
    return torch.randn(B, L, D, D, generator=g, dtype=dtype) * (0.5 / D**0.5), torch.randn(
        B, L, D, generator=g, dtype=dtype
    )


FUNCS = {"diag": linear_scan, "block2": linear_scan_block2, "dense": linear_scan_dense}


@pytest.mark.parametrize("kind", ["diag", "block2", "dense"])
@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_torch_scan_matches_reference_with_gradients(kind, L, reverse, dtype, tol):
    g = torch.Generator().manual_seed(L)
    c, x = _inputs(kind, 3, L, 5, dtype, g)
    f = FUNCS[kind]
    outs, grads = [], []
    gy = None
    for backend in ("reference", "torch"):
        cc, xx = c.clone().requires_grad_(), x.clone().requires_grad_()
        y = f(cc, xx, reverse=reverse, backend=backend)
        gy = torch.randn_like(y) if gy is None else gy
        gc, gx = torch.autograd.grad((y * gy).sum(), (cc, xx), allow_unused=True)
        grads.append((torch.zeros_like(cc) if gc is None else gc, gx))  # c is unused at L = 1
        outs.append(y.detach())
    torch.testing.assert_close(outs[1], outs[0], rtol=tol, atol=tol)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_scan_errors():
    c, x = torch.rand(2, 4, 3), torch.rand(2, 4, 3)
    with pytest.raises(ValueError, match="unknown scan backend 'nope'; valid: auto, reference, torch"):
        linear_scan(c, x, backend="nope")
    with pytest.raises(ValueError, match=r"c has shape \(2, 5, 3\)"):
        linear_scan(torch.rand(2, 5, 3), x)
    with pytest.raises(ValueError, match="expected c"):
        linear_scan_block2(torch.rand(2, 4, 3), torch.rand(2, 4, 2, 3))
    with pytest.raises(ValueError, match="expected C"):
        linear_scan_dense(torch.rand(2, 4, 3, 2), x)
    assert {"reference", "torch"} <= set(SCAN_BACKENDS)


def test_empty_sequence():
    for backend in ("reference", "torch"):
        assert linear_scan(torch.rand(2, 0, 3), torch.rand(2, 0, 3), backend=backend).shape == (2, 0, 3)
