"""``seqkernels/delta/l2norm.py``'s kernels (the Triton paths' ``qk_l2norm``) against the float64 formula
written out here: the output and the input gradient at awkward row widths and counts, in every input
dtype and output dtype, with outputs poisoned with NaN, zero rows, non-contiguous inputs and the custom
ops under ``opcheck``. On the CPU in the interpreter; on a GPU (``-m gpu``) compiled, at the delta kernels' shapes."""

import pytest
import torch

from seqkernels._triton import poisoned, triton_available
from seqkernels.delta import l2norm as l2

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1"
)


def _float64_l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x_i / sqrt(sum_j x_j^2 + 1e-6)`` in float64, row by row."""
    x = x.double()
    return x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()


def _check(shape, dtype, seed, device=DEVICE, tol=1e-5, out=torch.float32):
    """``l2norm(x, out)`` and its gradient against the float64 formula: ``y`` within ``out``'s rounding, the
    gradient (of the unrounded ``y``, ``dy`` in ``out``) within ``x``'s."""
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype).to(device).requires_grad_()
    dy = torch.randn(*shape, generator=gen, dtype=torch.float64).to(out).to(device)
    with poisoned():
        y = l2.l2norm(x, out)
        (dx,) = torch.autograd.grad(y, x, dy)
    assert y.dtype == out and dx.dtype == dtype and y.shape == x.shape
    x64 = x.detach().double().requires_grad_()
    y64 = _float64_l2norm(x64)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    ytol = max(tol, torch.finfo(out).eps)
    torch.testing.assert_close(y.double(), y64, rtol=ytol, atol=ytol)
    # the gradient in x's dtype (its rounding is the tolerance), relative to the size of its terms rstd * dy
    # (a row of one element has dx = rstd dy (1 - y^2), a cancellation)
    dtol = max(tol, 2 * torch.finfo(dtype).eps) if dtype != torch.float64 else tol
    scale = (dy / (x64.detach().pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()).abs().max().item()
    torch.testing.assert_close(dx.double(), dx64, rtol=dtol, atol=dtol * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (2, 37, 3, 16), (1, 13, 2, 2, 24), (300, 67)])
def test_l2norm_equals_the_float64_formula(shape, dtype):
    _check(shape, dtype, seed=sum(shape))


@pytest.mark.parametrize(
    "dtype,out", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16), (torch.float16, torch.float16)]
)
def test_l2norm_into_16_bits_equals_the_float64_formula(dtype, out):
    """``y`` stored in 16 bits (``qk_l2norm`` at bfloat16 products); the gradient still that of the exact
    ``y``, recomputed from ``x``."""
    _check((3, 41, 2, 24), dtype, seed=11, out=out)


def test_l2norm_refuses_other_output_dtypes():
    with pytest.raises(TypeError, match="output dtype must be float32, bfloat16 or float16, got torch.float64"):
        l2.l2norm(torch.zeros(2, 4, device=DEVICE), torch.float64)


def test_l2norm_of_a_zero_row_is_zero_with_a_finite_gradient():
    x = torch.zeros(4, 16, device=DEVICE, requires_grad=True)
    y = l2.l2norm(x)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.equal(y, torch.zeros_like(y))
    torch.testing.assert_close(dx, torch.full_like(dx, 1e3), rtol=1e-5, atol=0)  # 1 / sqrt(eps)


def test_l2norm_reads_non_contiguous_inputs():
    x = torch.randn(24, 9, 5, device=DEVICE).transpose(0, 2)  # (5, 9, 24), strides of a transpose
    torch.testing.assert_close(l2.l2norm(x).double(), _float64_l2norm(x), rtol=1e-5, atol=1e-5)


def test_l2norm_refuses_rows_wider_than_it_takes():
    with pytest.raises(ValueError, match="rows up to 1024 wide"):
        l2.l2norm(torch.zeros(2, l2.MAX_WIDTH + 1, device=DEVICE))


def test_l2norm_custom_ops_pass_opcheck():
    x = torch.randn(3, 7, 20, device=DEVICE, requires_grad=True)
    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(l2.l2norm_fwd, (x, dtype))
        y, rstd = l2.l2norm_fwd(x.detach(), dtype)
        torch.library.opcheck(l2.l2norm_bwd, (x.detach().bfloat16(), rstd, torch.randn_like(y)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 2048, 16, 64), (256, 128, 2, 4, 16), (3, 1000, 5, 128)])
def test_gpu_l2norm_at_the_delta_kernels_shapes(shape, dtype):
    _check(shape, dtype, seed=len(shape), device="cuda")
    _check(shape, dtype, seed=len(shape), device="cuda", out=torch.bfloat16)
