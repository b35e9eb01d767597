"""The delta-rule family on the fused recurrent Triton kernel (``recurrent_kernels.py``), forward and backward.

``dplr_recurrent``: the kernel's recurrence as the custom ops ``expressivity::delta_recurrent_fwd`` /
``delta_recurrent_bwd`` with ``register_autograd`` (and the same launches as an eager ``autograd.Function``);
launch parameters: ``RecurrentTiles``.

Each function has the signature of its ``reference.py`` twin and maps its member onto the kernel's
recurrence ``S_s = S_{s-1} diag(exp(w_s)) + (S_{s-1} a_s) b_s^T + v_s k_s^T`` (a delta step
``S (I - beta k k^T) + beta v k^T`` is ``a = k, b = -beta k, v <- beta v``; a scalar decay ``exp(g)``
multiplies ``b`` and becomes ``w = g`` on every key channel). These maps are elementwise torch code,
so autograd carries the kernel's gradients back to ``beta`` and ``g``. The maps and ``qk_l2norm``
(``l2norm.py``'s kernels) are computed in float32 (float64 inputs run in float32 too); the output is in
the dtype of ``q``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from seqkernels._triton import cdiv, empty, next_pow2
from seqkernels.delta.l2norm import l2norm
from seqkernels.delta.members import KERNEL_DTYPES, grads_in_input_dtypes, kernel_dtype, members
from seqkernels.delta.recurrent_kernels import delta_recurrent_bwd_kernel, delta_recurrent_fwd_kernel


@dataclasses.dataclass(frozen=True)
class RecurrentTiles:
    """Launch parameters of the fused recurrent kernels; ``None`` takes the default for the problem.

    ``block_v``: value rows of the state per program (a power of two; default: every row up to 64
    rows of width <= 64, else 32); ``warps`` (default: one per 256 state elements, 1 to 8);
    ``chunk``: steps between the forward's stored states, the backward's recompute length (32);
    ``stages``: software-pipelining depth of the step loops' loads (``tl.range``'s ``num_stages``; 1: none;
    default 4, the fastest timed)."""

    block_v: int | None = None
    warps: int | None = None
    chunk: int | None = None
    stages: int | None = None

    def resolve(self, K: int, V: int) -> tuple[int, int, int, int, int]:
        """``(BK, BV, warps, chunk, stages)`` for keys of width ``K`` and values of width ``V``."""
        BK = max(16, next_pow2(K))
        BV = self.block_v or min(max(16, next_pow2(V)), 64 if BK <= 64 else 32)
        warps = self.warps or max(1, min(8, BV * BK // 256))
        return BK, BV, warps, self.chunk or 32, self.stages or 4


def _launch(q, v, w, nstep: int, tiles: RecurrentTiles | None) -> tuple[int, int, int, dict]:
    """``(BV, NV, chunk, constexprs)`` of both kernels' launches for these inputs and tiles."""
    K, V = q.shape[-1], v.shape[-1]
    BK, BV, warps, chunk, stages = (tiles or RecurrentTiles()).resolve(K, V)
    meta = {
        "K": K,
        "V": V,
        "BK": BK,
        "BV": BV,
        "NSTEP": nstep,
        "CHUNK": chunk,
        "STAGES": stages,
        "HAS_W": w is not None,
    }
    return BV, cdiv(V, BV), chunk, {**meta, "num_warps": warps}


def _forward(q, k, v, a, b, w, scale: float, nstep: int, save: bool, tiles: RecurrentTiles | None = None):
    """``(o, ckpt)``: the output ``(B, T, H, V)`` in ``q``'s dtype and the stored states (float32)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    _, NV, chunk, meta = _launch(q, v, w, nstep, tiles)
    o = empty((B, T, H, V), q.device, q.dtype)
    ckpt = empty((B * H, cdiv(T * nstep, chunk), V, K) if save else (1,), q.device, torch.float32)
    w_arg = k if w is None else w  # any pointer: HAS_W=False never reads it
    delta_recurrent_fwd_kernel[(NV, B * H)](q, k, v, a, b, w_arg, o, ckpt, T, H, float(scale), SAVE=save, **meta)
    return o, ckpt


def _backward(do, q, k, v, a, b, w, ckpt, scale: float, nstep: int, tiles: RecurrentTiles | None = None):
    """``(dq, dk, dv, da, db, dw)`` in float32 (``dw`` empty without ``w``)."""
    B, T, H, K = q.shape
    V, Ts = v.shape[-1], k.shape[1]
    BV, NV, chunk, meta = _launch(q, v, w, nstep, tiles)
    dev, f32 = q.device, torch.float32
    scratch = torch.empty((NV * B * H, chunk, BV, meta["BK"]), device=dev, dtype=f32)
    dq = empty((NV, B, T, H, K), dev, f32)
    dk, da, db = (empty((NV, B, Ts, H, K), dev, f32) for _ in range(3))
    dw = empty((NV, B, Ts, H, K), dev, f32) if w is not None else dk
    dv = empty((B, Ts, H, V), dev, f32)
    w_arg = k if w is None else w
    delta_recurrent_bwd_kernel[(NV, B * H)](
        q, k, v, a, b, w_arg, ckpt, do, scratch, dq, dk, dv, da, db, dw, B, T, H, float(scale), **meta
    )
    dq, dk, da, db = (x.sum(0) if NV > 1 else x[0] for x in (dq, dk, da, db))
    dw = (dw.sum(0) if NV > 1 else dw[0]) if w is not None else q.new_empty(0, dtype=f32)
    return dq, dk, dv, da, db, dw


@torch.library.custom_op("expressivity::delta_recurrent_fwd", mutates_args=())
def delta_recurrent_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor | None,
    scale: float,
    nstep: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, ckpt)`` with the default tiles (``_forward``)."""
    return _forward(q, k, v, a, b, w, scale, nstep, save=True)


@delta_recurrent_fwd.register_fake
def _(q, k, v, a, b, w, scale, nstep):
    B, T, H, K = q.shape
    V = v.shape[-1]
    chunk = RecurrentTiles().resolve(K, V)[3]
    return q.new_empty(B, T, H, V), q.new_empty(B * H, cdiv(T * nstep, chunk), V, K, dtype=torch.float32)


@torch.library.custom_op("expressivity::delta_recurrent_bwd", mutates_args=())
def delta_recurrent_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor | None,
    ckpt: torch.Tensor,
    scale: float,
    nstep: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input gradients in float32 with the default tiles (``_backward``)."""
    return _backward(do, q, k, v, a, b, w, ckpt, scale, nstep)


@delta_recurrent_bwd.register_fake
def _(do, q, k, v, a, b, w, ckpt, scale, nstep):
    f = torch.float32
    dw = w.new_empty(w.shape, dtype=f) if w is not None else q.new_empty(0, dtype=f)
    return (*(x.new_empty(x.shape, dtype=f) for x in (q, k, v, a, b)), dw)


def _setup_context(ctx, inputs, output):
    q, k, v, a, b, w, scale, nstep = inputs
    ctx.save_for_backward(q, k, v, a, b, w, output[1])
    ctx.opts = (scale, nstep)


def _grad(ctx, do, dckpt):
    q, k, v, a, b, w, ckpt = ctx.saved_tensors
    grads = delta_recurrent_bwd(do.contiguous(), q, k, v, a, b, w, ckpt, *ctx.opts)
    return (*grads_in_input_dtypes(grads, (q, k, v, a, b, w)), None, None)


delta_recurrent_fwd.register_autograd(_grad, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """Eager autograd over the same launches as the custom ops, with explicit tiles."""

    @staticmethod
    def forward(ctx, tiles, q, k, v, a, b, w, scale, nstep):
        o, ckpt = _forward(q, k, v, a, b, w, scale, nstep, save=True, tiles=tiles)
        ctx.save_for_backward(q, k, v, a, b, w, ckpt)
        ctx.opts, ctx.tiles = (scale, nstep), tiles
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, a, b, w, ckpt = ctx.saved_tensors
        grads = _backward(do.contiguous(), q, k, v, a, b, w, ckpt, *ctx.opts, ctx.tiles)
        return (None, *grads_in_input_dtypes(grads, (q, k, v, a, b, w)), None, None)


def dplr_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor | None,
    *,
    scale: float,
    nstep: int = 1,
    tiles: RecurrentTiles | None = None,
) -> torch.Tensor:
    """The recurrence of the module docstring. ``q (B, T, H, K)``; per step ``k, a, b, w (B, T n, H, K)``,
    ``v (B, T n, H, V)`` with ``n = nstep`` steps per token (``w``: log decay per key channel, or None)
    -> ``o (B, T, H, V)`` in ``q``'s dtype. Inputs are made contiguous; ``tiles``: ``RecurrentTiles``."""
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"delta triton: inputs must be one of {KERNEL_DTYPES}, got {q.dtype}")
    q, k, v, a, b = (x.contiguous() for x in (q, k, v, a, b))
    w = None if w is None else w.contiguous()
    args = (q, k, v, a, b, w, float(scale), int(nstep))
    if torch.compiler.is_compiling():
        return delta_recurrent_fwd(*args)[0]
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args[:6]):
        return _Eager.apply(tiles, *args)
    return _forward(*args, save=False, tiles=tiles)[0]


def gated_delta_product(q, k, v, beta, g=None, *, scale=None, qk_l2norm=False, tiles: RecurrentTiles | None = None):
    """``n = k.shape[2]`` delta steps per token, the decay ``exp(g_t)`` (or none) before them.
    ``q (B, L, H, K)``, ``k (B, L, n, H, K)``, ``v (B, L, n, H, V)``, ``beta (B, L, n, H)``, ``g (B, L, H)``."""
    B, L, n, H, K = k.shape
    out_dtype = q.dtype
    q, k, v = kernel_dtype(q, k, v)
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    beta = beta.float()[..., None]
    b = -beta * k
    w = None
    if g is not None:  # the log decay of each step: g on a token's first, 0 on the others
        gs = F.pad(g.float()[:, :, None, :, None], (0, 0, 0, 0, 0, n - 1))
        b = b * torch.exp(gs)
        w = gs.expand(B, L, n, H, K).reshape(B, L * n, H, K)
    kk, vv, bb = (x.reshape(B, L * n, H, -1) for x in (k, beta * v, b))
    scale = K**-0.5 if scale is None else scale
    return dplr_recurrent(q, kk, vv, kk, bb, w, scale=scale, nstep=n, tiles=tiles).to(out_dtype)


delta_rule, gated_delta_rule, delta_product = members(gated_delta_product)


def dplr_delta_rule(q, k, v, a, b, w, *, scale=1.0, tiles: RecurrentTiles | None = None):
    """``S_t = S_{t-1}(diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T``, ``o_t = scale S_t q_t``."""
    out_dtype = q.dtype
    q, k, v, a, b, w = kernel_dtype(q, k, v, a, b, w)
    return dplr_recurrent(q, k, v, a, b, w, scale=scale, nstep=1, tiles=tiles).to(out_dtype)
