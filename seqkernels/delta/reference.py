"""The delta-rule family as per-token loops: the definitions every fast path is tested against.

Shapes (batch-first, heads split, as ``fla.ops``): ``q, k (B, L, H, K)``, ``v (B, L, H, V)``,
``beta, g (B, L, H)``; the Householder product takes ``k (B, L, n, H, K)``, ``v (B, L, n, H, V)``,
``beta (B, L, n, H)`` (``n`` steps per token). The state of a head is ``S (V, K)`` and starts at
zero; outputs are ``o (B, L, H, V)`` in the dtype of ``q``.

    delta rule           S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
    gated delta rule     S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
    Householder product  S_t = exp(g_t) S_{t-1} prod_j (I - beta_tj k_tj k_tj^T) + (the n write terms),
                         i.e. n delta-rule steps per token, the decay once before the first
    generalized (DPLR)   S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T     (w: (B, L, H, K))
    output               o_t = scale * S_t q_t          (scale: K^-1/2 by default, 1 for DPLR as RWKV-7)

The loops write a delta step as ``S += beta (v - S k) k^T``, which is the equation above. With
``qk_l2norm=True`` q and k are first divided by ``sqrt(sum(x^2) + 1e-6)`` (fla's in-kernel l2norm).
Arithmetic is in float64 for float64 inputs, else float32.
"""

from __future__ import annotations

import torch

L2_EPS = 1e-6  # fla.modules.l2norm's eps (inside the square root)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2, -1) + 1e-6)``: fla's ``l2norm_fwd``."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _delta_step(S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``S (I - beta k k^T) + beta v k^T`` for ``S (B, H, V, K)``, ``k (B, H, K)``, ``v (B, H, V)``, ``beta (B, H)``."""
    error = v - torch.einsum("bhvk,bhk->bhv", S, k)  # what the memory gets wrong about v at key k
    return S + beta[..., None, None] * error[..., :, None] * k[..., None, :]


def gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """``n = k.shape[2]`` delta steps per token, the decay ``exp(g_t)`` (or none) once before them;
    the output is read after the last step. Shapes: module docstring."""
    B, L, n, H, K = k.shape
    V, out_dtype, dtype = v.shape[-1], q.dtype, _compute_dtype(q)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    scale = K**-0.5 if scale is None else scale
    S = q.new_zeros(B, H, V, K)
    outputs = []
    for t in range(L):
        if g is not None:
            S = S * torch.exp(g[:, t].to(dtype))[..., None, None]
        for j in range(n):
            S = _delta_step(S, k[:, t, j], v[:, t, j], beta[:, t, j])
        outputs.append(scale * torch.einsum("bhvk,bhk->bhv", S, q[:, t]))
    return torch.stack(outputs, dim=1).to(out_dtype)


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """The delta rule ``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = scale S_t q_t``."""
    return gated_delta_product(
        q, k[:, :, None], v[:, :, None], beta[:, :, None], None, scale=scale, qk_l2norm=qk_l2norm
    )


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """``S_t = exp(g_t) S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` (``g <= 0``: log decay per head)."""
    return gated_delta_product(q, k[:, :, None], v[:, :, None], beta[:, :, None], g, scale=scale, qk_l2norm=qk_l2norm)


def delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """DeltaProduct (Siems et al. 2025): ``n`` delta steps per token, optional decay; see ``gated_delta_product``."""
    return gated_delta_product(q, k, v, beta, g, scale=scale, qk_l2norm=qk_l2norm)


def dplr_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    *,
    scale: float = 1.0,
) -> torch.Tensor:
    """The generalized delta rule of RWKV-7 (fla's ``dplr``): per head, with ``w`` the log decay per key channel,

        S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T,       o_t = scale * S_t q_t

    RWKV-7 passes ``a = -kk``, ``b = kk * a_lr`` (its removal key and in-context learning rate).
    Shapes: ``q, k, a, b, w (B, L, H, K)``, ``v (B, L, H, V)``."""
    B, L, H, K = q.shape
    V, out_dtype, dtype = v.shape[-1], q.dtype, _compute_dtype(q)
    q, k, v, a, b, w = (x.to(dtype) for x in (q, k, v, a, b, w))
    S = q.new_zeros(B, H, V, K)
    outputs = []
    for t in range(L):
        Sa = torch.einsum("bhvk,bhk->bhv", S, a[:, t])
        S = (
            S * torch.exp(w[:, t])[..., None, :]
            + Sa[..., :, None] * b[:, t, :, None, :]
            + v[:, t, :, :, None] * k[:, t, :, None, :]
        )
        outputs.append(scale * torch.einsum("bhvk,bhk->bhv", S, q[:, t]))
    return torch.stack(outputs, dim=1).to(out_dtype)
