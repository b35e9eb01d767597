"""seqkernels.pd_scan: the reference loop equals the recurrence with explicit dense (N, N) matrices ``P_t D_t``
(complex numbers as torch complex, real as float64), and the log-step parallel scan equals the reference
(output and the gradients of ``d`` and ``x``) at awkward lengths; bad inputs raise one-line errors."""

import pytest
import torch

from seqkernels.pd_scan import pd_scan, pd_scan_reference, pd_scan_torch


def _inputs(batch, L, N, C, seed):
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, N, (batch, L, N), generator=g)
    d = 0.9 * torch.randn(batch, L, N, C, generator=g, dtype=torch.float64)
    x = torch.randn(batch, L, N, C, generator=g, dtype=torch.float64)
    return index, d, x


def _dense_loop(index, d, x):
    """``h_t = A_t h_{t-1} + x_t`` with ``A_t[index_t[n], n] = d_t[n]`` built entry by entry."""
    complex_ = x.shape[-1] == 2
    as_numbers = (lambda t: torch.view_as_complex(t.contiguous())) if complex_ else (lambda t: t[..., 0])
    dn, xn = as_numbers(d), as_numbers(x)
    batch, L, N = index.shape
    out = torch.zeros_like(xn)
    for b in range(batch):
        h = torch.zeros(N, dtype=xn.dtype)
        for t in range(L):
            A = torch.zeros(N, N, dtype=xn.dtype)
            for n in range(N):
                A[index[b, t, n], n] = dn[b, t, n]
            h = A @ h + xn[b, t]
            out[b, t] = h
    return torch.view_as_real(out) if complex_ else out[..., None]


@pytest.mark.parametrize("C", [1, 2])
@pytest.mark.parametrize("batch,L,N", [(2, 1, 3), (1, 13, 5), (2, 30, 4)])
def test_reference_equals_dense_matrix_loop(batch, L, N, C):
    index, d, x = _inputs(batch, L, N, C, seed=L)
    torch.testing.assert_close(pd_scan_reference(index, d, x), _dense_loop(index, d, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("C", [1, 2])
@pytest.mark.parametrize("L", [1, 2, 13, 67])
def test_torch_scan_equals_reference_with_gradients(L, C):
    index, d, x = _inputs(3, L, 6, C, seed=100 + L)
    weights = torch.randn(3, L, 6, C, dtype=torch.float64, generator=torch.Generator().manual_seed(L))
    results = []
    for fn in (pd_scan_reference, pd_scan_torch):
        dd, xx = d.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y = fn(index, dd, xx)
        grads = torch.autograd.grad((y * weights).sum(), [dd, xx], allow_unused=True)  # L = 1: d unused
        results.append((y, *(torch.zeros_like(d) if g is None else g for g in grads)))
    for a, b, what in zip(*results, ("y", "grad d", "grad x")):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11, msg=lambda m, what=what: f"{what}: {m}")


def test_permutations_compose_as_the_group_does():
    """With unit diagonals and one-hot input at the start, the state is the start lane carried through the
    composed permutations: lane ``sigma_t ... sigma_1 (0)``."""
    g = torch.Generator().manual_seed(0)
    L, N = 40, 5
    perms = torch.stack([torch.randperm(N, generator=g) for _ in range(L)])[None]
    x = torch.zeros(1, L, N, 1, dtype=torch.float64)
    x[0, 0, perms[0, 0, 0], 0] = 1.0  # the first step's image of e_0
    y = pd_scan(perms, torch.ones_like(x), x, backend="torch")
    lane = perms[0, 0, 0].item()
    for t in range(1, L):
        lane = perms[0, t, lane].item()
        assert y[0, t, lane, 0] == 1.0 and y[0, t].abs().sum() == 1.0


def test_bad_inputs():
    index, d, x = _inputs(1, 4, 3, 2, seed=0)
    with pytest.raises(TypeError, match="index must be int64"):
        pd_scan(index.int(), d, x)
    with pytest.raises(ValueError, match=r"C 1 \(real\) or 2 \(complex\)"):
        pd_scan(index, d[..., :1].expand(-1, -1, -1, 3), x[..., :1].expand(-1, -1, -1, 3))
    with pytest.raises(TypeError, match="one dtype"):
        pd_scan(index, d.float(), x)
    with pytest.raises(ValueError, match="unknown pd_scan backend 'triton'"):
        pd_scan(index, d, x, backend="triton")
