"""``l2norm`` as one Triton kernel each way: ``y = x / sqrt(sum(x^2, -1) + eps)`` computed in float32
(``reference.l2norm``'s formula, ``eps = reference.L2_EPS``), the Triton paths' ``qk_l2norm``.

In torch the normalization and its autograd backward are about ten elementwise and reduction kernels per
tensor, and the float32 cast one more; here the forward reads ``x`` in its dtype and writes ``y`` (float32,
or a 16-bit dtype the caller asks for) and ``rstd = 1 / sqrt(sum(x^2) + eps)`` (float32, one per row), and
the backward reads ``x``, ``rstd`` and ``dy``, recomputes ``y = x rstd`` in float32 and writes ``dx = rstd
(dy - y sum(dy y))`` in ``x``'s dtype (the gradient of the float32 ``y``, whatever dtype it was stored
in; ``x`` in its dtype is also the smaller of the two to keep). The custom ops
``expressivity::l2norm_fwd`` / ``l2norm_bwd`` (``register_autograd``) run inside ``torch.compile`` and
CUDA graphs (no host reads). Rows of up to ``MAX_WIDTH`` elements; ``BR`` rows per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seqkernels._triton import cdiv, empty, next_pow2
from seqkernels.delta.reference import L2_EPS

#: the widest row one program normalizes (the delta kernels' head dims go up to 128)
MAX_WIDTH = 1024
#: rows per program: about 4,096 elements per program
ELEMENTS_PER_PROGRAM = 4096


@triton.jit
def _row_block(N, D, BR: tl.constexpr, BD: tl.constexpr):
    """``(rows, at, mask)`` of this program's ``BR`` rows of a row-major ``(N, D)`` tensor, ``BD >= D`` wide."""
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    return rows, rows[:, None] * D + cols[None, :], (rows[:, None] < N) & (cols[None, :] < D)


@triton.jit
def l2norm_fwd_kernel(x, y, rstd, N, D, eps, BR: tl.constexpr, BD: tl.constexpr):
    """Grid ``(cdiv(N, BR),)``: rows ``x (N, D)`` -> ``y (N, D)`` (in its own dtype) and ``rstd (N,)``
    float32."""
    rows, at, mask = _row_block(N, D, BR, BD)
    xx = tl.load(x + at, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xx * xx, 1) + eps)
    tl.store(y + at, (xx * r[:, None]).to(y.dtype.element_ty), mask=mask)
    tl.store(rstd + rows, r, mask=rows < N)


@triton.jit
def l2norm_bwd_kernel(x, rstd, dy, dx, N, D, BR: tl.constexpr, BD: tl.constexpr):
    """Grid ``(cdiv(N, BR),)``: ``dx = rstd (dy - y sum(dy y))``, ``y = x rstd`` (``dx`` in its own dtype)."""
    rows, at, mask = _row_block(N, D, BR, BD)
    r = tl.load(rstd + rows, mask=rows < N, other=0.0)
    yy = tl.load(x + at, mask=mask, other=0.0).to(tl.float32) * r[:, None]
    gg = tl.load(dy + at, mask=mask, other=0.0).to(tl.float32)
    out = (gg - yy * tl.sum(gg * yy, 1)[:, None]) * r[:, None]
    tl.store(dx + at, out.to(dx.dtype.element_ty), mask=mask)


def _tiles(D: int) -> tuple[int, int]:
    """``(BR, BD)``: rows per program and the padded row width."""
    BD = max(16, next_pow2(D))
    return max(1, ELEMENTS_PER_PROGRAM // BD), BD


@torch.library.custom_op("expressivity::l2norm_fwd", mutates_args=())
def l2norm_fwd(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)``: ``x (..., D)`` normalized over its last dim, in ``dtype``, and ``rstd (...)`` float32."""
    D = x.shape[-1]
    x2 = x.contiguous().view(-1, D)
    N = x2.shape[0]
    y = empty(x.shape, x.device, dtype)
    rstd = empty(x.shape[:-1], x.device, torch.float32)
    BR, BD = _tiles(D)
    if N:
        l2norm_fwd_kernel[(cdiv(N, BR),)](x2, y, rstd, N, D, L2_EPS, BR=BR, BD=BD, num_warps=4)
    return y, rstd


@l2norm_fwd.register_fake
def _(x, dtype):
    return x.new_empty(x.shape, dtype=dtype), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("expressivity::l2norm_bwd", mutates_args=())
def l2norm_bwd(x: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """``dx`` in ``x``'s dtype from the forward's input ``x``, ``rstd`` and the gradient ``dy`` of ``y``."""
    D = x.shape[-1]
    N = rstd.numel()
    dx = empty(x.shape, x.device, x.dtype)
    BR, BD = _tiles(D)
    if N:
        args = (x.contiguous(), rstd, dy.contiguous(), dx, N, D)
        l2norm_bwd_kernel[(cdiv(N, BR),)](*args, BR=BR, BD=BD, num_warps=4)
    return dx


@l2norm_bwd.register_fake
def _(x, rstd, dy):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    x, _ = inputs
    ctx.save_for_backward(x, output[1])


def _grad(ctx, dy, _drstd):
    x, rstd = ctx.saved_tensors
    return l2norm_bwd(x, rstd, dy), None


l2norm_fwd.register_autograd(_grad, setup_context=_setup_context)


def l2norm(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x / sqrt(sum(x^2, -1) + eps)`` computed in float32, returned in ``dtype`` (float32, bfloat16 or
    float16; ``x (..., D)``, ``D <= MAX_WIDTH``; float64 inputs compute in float32), differentiable; CUDA, or
    the CPU under ``TRITON_INTERPRET=1``."""
    if x.shape[-1] > MAX_WIDTH:
        raise ValueError(f"l2norm: rows up to {MAX_WIDTH} wide, got {x.shape[-1]}")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"l2norm: output dtype must be float32, bfloat16 or float16, got {dtype}")
    if x.dtype == torch.float64:
        x = x.float()
    return l2norm_fwd(x, dtype)[0]
