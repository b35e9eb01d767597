"""RWKV-7's DPLR rule chunkwise with the inter-chunk state recurrence in Triton (``backend="triton_chunk"`` of
``dplr_delta_rule``): ``pytorch.dplr_delta_rule``'s chunk form, batched over chunks in PyTorch (its
decayed products, one unit lower-triangular solve per chunk, the outputs), with the sequential hand-over of
the state between chunks (``pytorch.dplr_scan``) in ``dplr_scan_kernels.py``: forward and backward kernels
as the custom ops ``expressivity::dplr_scan_fwd`` / ``dplr_scan_bwd`` with ``register_autograd``, launch
parameters ``ScanTiles``. The rest of the gradient is PyTorch's autograd. Inputs float32, bfloat16 or
float16 (float64 runs in float32), float32 arithmetic, the output in ``q``'s dtype; no host reads (a CUDA
graph captures it).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from seqkernels._triton import cdiv, empty, next_pow2
from seqkernels.delta import pytorch
from seqkernels.delta.dplr_scan_kernels import dplr_scan_bwd_kernel, dplr_scan_fwd_kernel
from seqkernels.delta.members import KERNEL_DTYPES, kernel_dtype

SCAN_PRECISIONS = ("ieee", "tf32", "tf32x3")


@dataclasses.dataclass(frozen=True)
class ScanTiles:
    """Launch parameters of the scan kernels; ``None`` takes the default.

    ``block_v``: value columns of the state per program, a power of two (default every column up to 64 where
    a chunk's ``(C, K)`` tile holds fewer than 64 x 128 entries, else 16: a wider block there needs more than
    an H100's 227 KiB of shared memory with ``"tf32x3"`` products); ``warps`` (default 4; at most 4 for
    blocks of 16 with tensor-core products: the backward kernel faults there at 8 warps on an H100 with
    Triton 3.6, ``"ieee"`` does not); ``precision``: every product's ``input_precision``, one of
    ``SCAN_PRECISIONS`` (default ``"tf32x3"``, float32-accurate).
    """

    block_v: int | None = None
    warps: int | None = None
    precision: str | None = None

    def resolve(self, C: int, K: int, V: int) -> tuple[int, int, int, str]:
        """``(BK, BV, warps, precision)`` for chunks of ``C`` steps, keys ``K`` and values ``V`` wide."""
        BK, VP = max(16, next_pow2(K)), max(16, next_pow2(V))
        BV = self.block_v or min(VP, 64 if max(16, next_pow2(C)) * BK < 64 * 128 else 16)
        if BV < 16 or BV > VP or BV & (BV - 1):
            raise ValueError(f"dplr triton_chunk: block_v must be a power of two in [16, {VP}], got {BV}")
        warps = self.warps or 4
        if warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"dplr triton_chunk: warps must be 1, 2, 4, 8 or 16, got {warps!r}")
        precision = self.precision or "tf32x3"
        if precision not in SCAN_PRECISIONS:
            raise ValueError(f"dplr triton_chunk: precision must be one of {SCAN_PRECISIONS}, got {precision!r}")
        if BV == 16 and warps > 4 and precision != "ieee":
            raise ValueError(
                f"dplr triton_chunk: block_v 16 takes at most 4 warps with {precision} products, got {warps}"
            )
        return BK, BV, warps, precision


def _meta(W: torch.Tensor, V: int, tiles: ScanTiles | None) -> tuple[int, dict]:
    """``(NV, launch keywords)`` for chunk tensors like ``W (BH, NC, C, K)`` and values ``V`` wide."""
    C, K = W.shape[-2:]
    BK, BV, warps, precision = (tiles or ScanTiles()).resolve(C, K, V)
    meta = {"C": C, "K": K, "V": V, "BC": max(16, next_pow2(C)), "BK": BK, "BV": BV, "PREC": precision}
    return cdiv(V, BV), {**meta, "num_warps": warps}


def _scan_fwd(Uv, W, Be, KVe, D, tiles: ScanTiles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, M_in)`` of ``Uv (BH, NC, C, V)``, ``W, Be (BH, NC, C, K)``, ``KVe (BH, NC, K, V)``, ``D (BH, NC, K)``."""
    BH, NC, C, V = Uv.shape
    K = W.shape[-1]
    NV, meta = _meta(W, V, tiles)
    U = empty((BH, NC, C, V), Uv.device, torch.float32)
    M_in = empty((BH, NC, K, V), Uv.device, torch.float32)
    dplr_scan_fwd_kernel[(NV, BH)](Uv, W, Be, KVe, D, U, M_in, NC, **meta)
    return U, M_in


def _scan_bwd(dU, dM_in, W, Be, D, U, M_in, tiles: ScanTiles | None = None):
    """``(dUv, dW, dBe, dKVe, dD)``, float32, from the output gradients and the saved tensors (``_scan_fwd``'s
    shapes)."""
    BH, NC, C, V = U.shape
    K = W.shape[-1]
    NV, meta = _meta(W, V, tiles)
    dev, f32 = U.device, torch.float32
    dUv, dKVe = empty((BH, NC, C, V), dev, f32), empty((BH, NC, K, V), dev, f32)
    dW, dBe = (empty((NV, BH, NC, C, K), dev, f32) for _ in range(2))
    dD = empty((NV, BH, NC, K), dev, f32)
    dplr_scan_bwd_kernel[(NV, BH)](dU, dM_in, W, Be, D, U, M_in, dUv, dW, dBe, dKVe, dD, NC, BH, **meta)
    dW, dBe, dD = (x.sum(0) if NV > 1 else x[0] for x in (dW, dBe, dD))
    return dUv, dW, dBe, dKVe, dD


@torch.library.custom_op("expressivity::dplr_scan_fwd", mutates_args=())
def dplr_scan_fwd(
    Uv: torch.Tensor, W: torch.Tensor, Be: torch.Tensor, KVe: torch.Tensor, D: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, M_in)`` with the default tiles (``_scan_fwd``)."""
    return _scan_fwd(Uv, W, Be, KVe, D)


@dplr_scan_fwd.register_fake
def _(Uv, W, Be, KVe, D):
    return torch.empty_like(Uv), torch.empty_like(KVe)


@torch.library.custom_op("expressivity::dplr_scan_bwd", mutates_args=())
def dplr_scan_bwd(
    dU: torch.Tensor,
    dM_in: torch.Tensor,
    W: torch.Tensor,
    Be: torch.Tensor,
    D: torch.Tensor,
    U: torch.Tensor,
    M_in: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dUv, dW, dBe, dKVe, dD)`` with the default tiles (``_scan_bwd``)."""
    return _scan_bwd(dU, dM_in, W, Be, D, U, M_in)


@dplr_scan_bwd.register_fake
def _(dU, dM_in, W, Be, D, U, M_in):
    return torch.empty_like(dU), torch.empty_like(W), torch.empty_like(Be), torch.empty_like(M_in), torch.empty_like(D)


def _output_grads(dU, dM_in, U, M_in) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``U`` and ``M_in`` as the backward kernel reads them: contiguous, zeros where absent."""
    dU = torch.zeros_like(U) if dU is None else dU.contiguous()
    return dU, torch.zeros_like(M_in) if dM_in is None else dM_in.contiguous()


def _setup_context(ctx, inputs, output):
    Uv, W, Be, KVe, D = inputs
    ctx.save_for_backward(W, Be, D, *output)


def _grad(ctx, dU, dM_in):
    W, Be, D, U, M_in = ctx.saved_tensors
    return dplr_scan_bwd(*_output_grads(dU, dM_in, U, M_in), W, Be, D, U, M_in)


dplr_scan_fwd.register_autograd(_grad, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """Eager autograd over the same launches as the custom ops, with explicit tiles."""

    @staticmethod
    def forward(ctx, tiles, Uv, W, Be, KVe, D):
        U, M_in = _scan_fwd(Uv, W, Be, KVe, D, tiles)
        ctx.save_for_backward(W, Be, D, U, M_in)
        ctx.tiles = tiles
        return U, M_in

    @staticmethod
    def backward(ctx, dU, dM_in):
        W, Be, D, U, M_in = ctx.saved_tensors
        return (None, *_scan_bwd(*_output_grads(dU, dM_in, U, M_in), W, Be, D, U, M_in, ctx.tiles))


def dplr_scan(U_v, W, b_end, KV_end, decay_end, *, tiles: ScanTiles | None = None):
    """``pytorch.dplr_scan`` on the Triton kernels: ``U_v (..., NC, C, V)``, ``W, b_end (..., NC, C, K)``,
    ``KV_end (..., NC, K, V)``, ``decay_end (..., NC, K)`` (float32) -> ``(U, M)`` of the same leading shape."""
    lead, (NC, C, V), K = U_v.shape[:-3], U_v.shape[-3:], W.shape[-1]
    flat = [x.reshape(-1, *x.shape[len(lead) :]).float().contiguous() for x in (U_v, W, b_end, KV_end, decay_end)]
    if torch.compiler.is_compiling() or tiles is None:
        U, M = dplr_scan_fwd(*flat)
    else:
        U, M = _Eager.apply(tiles, *flat)
    return U.reshape(*lead, NC, C, V), M.reshape(*lead, NC, K, V)


def dplr_delta_rule(
    q, k, v, a, b, w, *, scale: float = 1.0, lower_bound: float | None = None, chunk: int | None = None, tiles=None
):
    """``S_t = S_{t-1}(diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T``, ``o_t = scale S_t q_t``: ``pytorch.
    dplr_delta_rule`` (shapes, ``lower_bound``, ``chunk``) with the scan on our kernels (``tiles``:
    ``ScanTiles``)."""
    if q.dtype not in KERNEL_DTYPES and q.dtype != torch.float64:
        raise TypeError(f"dplr triton_chunk: inputs must be one of {KERNEL_DTYPES} or float64, got {q.dtype}")
    out_dtype = q.dtype
    q, k, v, a, b, w = kernel_dtype(q, k, v, a, b, w)
    scan = functools.partial(dplr_scan, tiles=tiles)
    o = pytorch.dplr_delta_rule(q, k, v, a, b, w, scale=scale, lower_bound=lower_bound, chunk=chunk, scan=scan)
    return o.to(out_dtype)
