"""The delta-rule family on the fused recurrent Triton kernel (``recurrent_kernels.dplr_recurrent``).

Each function has the signature of its ``reference.py`` twin and maps its member onto the kernel's
recurrence ``S_s = S_{s-1} diag(exp(w_s)) + (S_{s-1} a_s) b_s^T + v_s k_s^T`` (a delta step
``S (I - beta k k^T) + beta v k^T`` is ``a = k, b = -beta k, v <- beta v``; a scalar decay ``exp(g)``
multiplies ``b`` and becomes ``w = g`` on every key channel). These maps are elementwise torch code,
so autograd carries the kernel's gradients back to ``beta`` and ``g``. The maps and ``qk_l2norm`` are
computed in float32 (float64 inputs run in float32 too); the output is in the dtype of ``q``.
"""

from __future__ import annotations

import torch

from kernels.delta.recurrent_kernels import RecurrentTiles, dplr_recurrent
from kernels.delta.reference import l2norm


def _f32(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(x if x.dtype in (torch.bfloat16, torch.float16) else x.float() for x in xs)


def gated_delta_product(q, k, v, beta, g=None, *, scale=None, qk_l2norm=False, tiles: RecurrentTiles | None = None):
    """``n = k.shape[2]`` delta steps per token, the decay ``exp(g_t)`` (or none) before them.
    ``q (B, L, H, K)``, ``k (B, L, n, H, K)``, ``v (B, L, n, H, V)``, ``beta (B, L, n, H)``, ``g (B, L, H)``."""
    B, L, n, H, K = k.shape
    out_dtype = q.dtype
    q, k, v = _f32(q, k, v)
    if qk_l2norm:
        q, k = l2norm(q.float()), l2norm(k.float())
    beta = beta.float()[..., None]
    b = -beta * k
    if g is not None:
        first = torch.ones(1, 1, n, 1, 1, device=q.device, dtype=torch.bool)
        first[:, :, 1:] = False
        decay = torch.exp(g.float())[:, :, None, :, None]
        b = torch.where(first, b * decay, b)
        w = torch.where(first, g.float()[:, :, None, :, None], 0.0).expand(B, L, n, H, K)
        w = w.reshape(B, L * n, H, K)
    else:
        w = None
    steps = (x.reshape(B, L * n, H, -1) for x in (k, beta * v, k, b))
    kk, vv, aa, bb = steps
    scale = K**-0.5 if scale is None else scale
    return dplr_recurrent(q, kk, vv, aa, bb, w, scale=scale, nstep=n, tiles=tiles).to(out_dtype)


def delta_rule(q, k, v, beta, *, scale=None, qk_l2norm=False, tiles: RecurrentTiles | None = None):
    """``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = scale S_t q_t``."""
    return gated_delta_product(
        q, k[:, :, None], v[:, :, None], beta[:, :, None], None, scale=scale, qk_l2norm=qk_l2norm, tiles=tiles
    )


def gated_delta_rule(q, k, v, g, beta, *, scale=None, qk_l2norm=False, tiles: RecurrentTiles | None = None):
    """``S_t = exp(g_t) S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``."""
    return gated_delta_product(
        q, k[:, :, None], v[:, :, None], beta[:, :, None], g, scale=scale, qk_l2norm=qk_l2norm, tiles=tiles
    )


def delta_product(q, k, v, beta, g=None, *, scale=None, qk_l2norm=False, tiles: RecurrentTiles | None = None):
    """DeltaProduct: ``n`` delta steps per token, optional decay (``gated_delta_product``)."""
    return gated_delta_product(q, k, v, beta, g, scale=scale, qk_l2norm=qk_l2norm, tiles=tiles)


def dplr_delta_rule(q, k, v, a, b, w, *, scale=1.0, tiles: RecurrentTiles | None = None):
    """``S_t = S_{t-1}(diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T``, ``o_t = scale S_t q_t``."""
    out_dtype = q.dtype
    q, k, v, a, b, w = _f32(q, k, v, a, b, w)
    return dplr_recurrent(q, k, v, a, b, w, scale=scale, nstep=1, tiles=tiles).to(out_dtype)
