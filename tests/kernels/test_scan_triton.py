"""The Triton scans (kernels.scan.triton_scan) against the float64 loop reference: forward and gradients.

CPU runs use the Triton interpreter (small shapes); outputs are poisoned with NaN before every run.
"""

import math
import os

import pytest
import torch


pytest.importorskip("triton")

from kernels.scan import linear_scan, linear_scan_block2  # noqa: E402
from kernels.scan import triton_scan as ts  # noqa: E402
from kernels.scan._interpret import use_vectorized_interpreter_scan  # noqa: E402
from kernels.scan.reference import linear_scan_block2_reference, linear_scan_reference  # noqa: E402

use_vectorized_interpreter_scan()
DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every output buffer of the kernels starts as NaN, so an unwritten element fails the test."""
    monkeypatch.setattr(ts, "_alloc", lambda like: torch.full_like(like, math.nan))


def small_tiles(monkeypatch, ch=16, bd=16):
    monkeypatch.setattr(ts, "config", lambda L, D, block2: (ch, bd, 4))


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all(), "non-finite (unwritten?) elements"
    return float((a - b).norm() / b.norm().clamp_min(1e-30)) if b.norm() > 0 else float(a.norm())


def inputs(shape_c, shape_x, gen, dtype=torch.float32):
    # coefficients in (-1.1, 1.1): products may grow a little, as Newton Jacobians do
    c = (torch.rand(shape_c, generator=gen, dtype=torch.float64) * 2.2 - 1.1)
    x = torch.randn(shape_x, generator=gen, dtype=torch.float64)
    return c.to(DEV, dtype), x.to(DEV, dtype)


def check(fn, ref, c, x, reverse, tol=1e-5):
    c = c.clone().requires_grad_()
    x = x.clone().requires_grad_()
    y = fn(c, x, reverse)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    c64 = c.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y64 = ref(c64, x64, reverse)
    (y64 * g.double()).sum().backward()
    assert rel(y, y64) < tol
    assert rel(x.grad, x64.grad) < tol
    assert rel(c.grad, c64.grad) < tol


@pytest.mark.parametrize("L", [1, 17, 129, 1000])
@pytest.mark.parametrize("reverse", [False, True])
def test_diag_matches_reference(L, reverse):
    gen = torch.Generator().manual_seed(L + 7 * reverse)
    c, x = inputs((2, L, 70), (2, L, 70), gen)  # 70 channels: one full and one partial lane tile
    check(ts.linear_scan_triton, linear_scan_reference, c, x, reverse)


@pytest.mark.parametrize("L", [1, 17, 129, 1000])
@pytest.mark.parametrize("reverse", [False, True])
def test_block2_matches_reference(L, reverse):
    gen = torch.Generator().manual_seed(100 + L + 7 * reverse)
    c, x = inputs((1, L, 2, 2, 5), (1, L, 2, 5), gen)
    c = c * 0.7  # keep 2x2 products bounded over 1000 steps
    check(ts.linear_scan_block2_triton, linear_scan_block2_reference, c, x, reverse)


@pytest.mark.parametrize("reverse", [False, True])
def test_many_chunks_and_lane_tiles(monkeypatch, reverse):
    """Small tiles: long look-back chains across 13 chunks, 3 batch rows, partial lane tiles."""
    small_tiles(monkeypatch)
    gen = torch.Generator().manual_seed(3 + reverse)
    c, x = inputs((3, 197, 37), (3, 197, 37), gen)
    check(ts.linear_scan_triton, linear_scan_reference, c, x, reverse)
    c, x = inputs((2, 61, 2, 2, 19), (2, 61, 2, 19), gen)
    check(ts.linear_scan_block2_triton, linear_scan_block2_reference, c * 0.7, x, reverse)


def test_bfloat16_storage():
    gen = torch.Generator().manual_seed(5)
    c, x = inputs((2, 150, 16), (2, 150, 16), gen)
    c = c * 0.9
    y = ts.linear_scan_triton(c.bfloat16(), x.bfloat16())
    assert y.dtype == torch.bfloat16
    ref = linear_scan_reference(c.bfloat16().double(), x.bfloat16().double())
    assert rel(y, ref) < 1e-2


def test_linear_scan_triton_backend_dispatch():
    gen = torch.Generator().manual_seed(6)
    c, x = inputs((1, 40, 8), (1, 40, 8), gen)
    assert rel(linear_scan(c, x, backend="triton"), linear_scan_reference(c.double(), x.double())) < 1e-5
    # through the backend dict, strided inputs are fine (the custom op itself wants contiguous ones)
    ct, xt = c.transpose(0, 2).contiguous().transpose(0, 2), x.transpose(0, 2).contiguous().transpose(0, 2)
    assert not ct.is_contiguous()
    assert rel(linear_scan(ct, xt, backend="triton"), linear_scan_reference(c.double(), x.double())) < 1e-5
    C, x2 = inputs((1, 40, 2, 2, 8), (1, 40, 2, 8), gen)
    got = linear_scan_block2(C * 0.7, x2, reverse=True, backend="triton")
    assert rel(got, linear_scan_block2_reference((C * 0.7).double(), x2.double(), reverse=True)) < 1e-5


def test_auto_picks_triton_only_on_cuda():
    from kernels.scan import _auto

    x = torch.zeros(1, 4, 2)
    assert _auto(x, x) == "torch"  # never the (slow) interpreter on the CPU
    if torch.cuda.is_available():
        xc = x.cuda()
        import kernels.scan

        assert _auto(xc, xc) == ("triton" if kernels.scan.AUTO_TRITON else "torch")
        if not kernels.scan.AUTO_TRITON:
            return
        assert _auto(xc.double(), xc.double()) == "torch"
        assert _auto(xc.transpose(1, 2), xc.transpose(1, 2)) == "triton"


@pytest.mark.parametrize("block2", [False, True])
def test_opcheck(block2):
    gen = torch.Generator().manual_seed(8)
    if block2:
        c, x = inputs((2, 20, 2, 2, 3), (2, 20, 2, 3), gen)
        op, bwd = torch.ops.expressivity.linear_scan_block2, torch.ops.expressivity.linear_scan_block2_bwd
    else:
        c, x = inputs((2, 20, 3), (2, 20, 3), gen)
        op, bwd = torch.ops.expressivity.linear_scan, torch.ops.expressivity.linear_scan_bwd
    c = (c * 0.7).requires_grad_()
    x = x.requires_grad_()
    for reverse in (False, True):
        torch.library.opcheck(op, (c, x, reverse))
        y = op(c.detach(), x.detach(), reverse)
        torch.library.opcheck(bwd, (c.detach(), y, torch.randn_like(y), reverse))


def test_bad_inputs_give_clear_errors(monkeypatch):
    x = torch.randn(2, 5, 3, device=DEV)
    with pytest.raises(TypeError, match="dtype"):
        ts.linear_scan_triton(x.double(), x.double())
    with pytest.raises(TypeError, match="dtype"):
        ts.linear_scan_triton(x.half(), x)
    with pytest.raises(ValueError, match="shape"):
        ts.linear_scan_triton(x[:, :4], x)
    with pytest.raises(ValueError, match="expected"):
        ts.linear_scan_triton(x[0], x[0])
    with pytest.raises(ValueError, match="contiguous"):
        ts.linear_scan_triton(x.transpose(0, 1), x.transpose(0, 1))
    with pytest.raises(ValueError, match="expected"):
        ts.linear_scan_block2_triton(torch.randn(2, 5, 2, 3, 3, device=DEV), torch.randn(2, 5, 2, 3, device=DEV))
    with pytest.raises(TypeError, match="tensors"):
        ts.linear_scan_triton(x.tolist(), x)
    monkeypatch.setattr(ts, "triton_available", lambda t: False)
    with pytest.raises(ValueError, match="CUDA"):
        ts.linear_scan_triton(x, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [(2, 4099, 300), (1, 65537, 64)])
def test_gpu_large(shape):
    gen = torch.Generator().manual_seed(9)
    c, x = inputs(shape, shape, gen)
    c = c.clamp(-1, 1)
    for reverse in (False, True):
        check(ts.linear_scan_triton, linear_scan_reference, c, x, reverse, tol=1e-4)
