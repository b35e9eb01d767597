"""The delta-rule family chunkwise in plain PyTorch (the WY / UT form of Yang et al. 2024): any device,
autograd for the gradients, capturable in a CUDA graph.

A Householder product runs as ``n`` delta steps per token on the flattened sequence of ``L * n`` steps
(the decay on a token's first step, the output read after its last). With the state ``M = S^T (K, V)``,
``a_t = exp(g_t)`` and, inside a chunk of ``C`` steps, ``gamma_i = prod_{j <= i} a_j`` and the state
``M_0`` the chunk starts from, the recurrence ``M_i = a_i M_{i-1} + beta_i k_i (v_i - a_i M_{i-1}^T k_i)^T``
unrolls to ``M_i = gamma_i M_0 + sum_{j <= i} (gamma_i / gamma_j) k_j u_j^T`` with the pseudo-values

    (I + diag(beta) A) U = diag(beta) V - diag(beta gamma) K M_0,   A_ij = (gamma_i / gamma_j) k_i . k_j  (j < i)

a unit lower-triangular system, solved once per chunk for ``[V | gamma K]`` (``U = U_v - W M_0``). Then

    O     = diag(gamma) Q M_0 + (Q K^T o Gamma)_{j <= i} U            Gamma_ij = gamma_i / gamma_j
    M_C   = gamma_C M_0 + (K o gamma_C / gamma)^T U

Only the ``M_0`` hand-over between chunks is sequential (``ceil(L n / C)`` small matmuls).
Shapes, dtypes and ``qk_l2norm`` as ``reference.py``; arithmetic in float64 for float64 inputs, else float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqkernels.delta.members import members
from seqkernels.delta.reference import l2norm

CHUNK = 64


def gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """``n = k.shape[2]`` delta steps per token, the decay ``exp(g_t)`` (or none) before them, chunkwise.
    ``q (B, L, H, K)``, ``k (B, L, n, H, K)``, ``v (B, L, n, H, V)``, ``beta (B, L, n, H)``, ``g (B, L, H)``
    -> ``o (B, L, H, V)`` in the dtype of ``q``."""
    B, L, n, H, K = k.shape
    V, out_dtype = v.shape[-1], q.dtype
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    scale = K**-0.5 if scale is None else scale
    # flatten the n steps of each token: (B, N, H, .) with N = L n; q and g on a token's last / first step
    N = L * n
    k, v, beta = k.reshape(B, N, H, K), v.reshape(B, N, H, V), beta.reshape(B, N, H)
    zeros = q.new_zeros(B, L, n - 1, H)
    gs = (
        torch.zeros(B, N, H, dtype=dtype, device=q.device)
        if g is None
        else torch.cat([g.to(dtype)[:, :, None], zeros], 2).reshape(B, N, H)
    )
    qs = torch.cat([zeros[..., None].expand(B, L, n - 1, H, K), q[:, :, None]], 2).reshape(B, N, H, K)
    # chunks: (B, H, NC, C, .), padded with identity steps (k = v = beta = g = 0)
    C = min(chunk, N)
    pad = -N % C
    NC = (N + pad) // C

    def chunked(x: torch.Tensor) -> torch.Tensor:  # (B, N, H, *rest) -> (B, H, NC, C, *rest)
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, 0, 0, pad))
        return x.reshape(B, NC, C, H, *x.shape[3:]).movedim(3, 1)

    q_c, k_c, v_c = chunked(qs), chunked(k), chunked(v)
    beta_c, G = chunked(beta[..., None])[..., 0], chunked(gs[..., None])[..., 0].cumsum(-1)  # (B, H, NC, C)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    Gamma = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # gamma_i / gamma_j
    A = (k_c @ k_c.transpose(-1, -2) * Gamma).tril(-1)
    system = torch.eye(C, dtype=dtype, device=q.device) + beta_c[..., None] * A
    rhs = beta_c[..., None] * torch.cat([v_c, G.exp()[..., None] * k_c], -1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    U_v, W = solved[..., :V], solved[..., V:]
    QK = q_c @ k_c.transpose(-1, -2) * Gamma  # zero above the diagonal (Gamma is)
    decay_out = G.exp()[..., None]  # gamma_i, (B, H, NC, C, 1)
    decay_end = (G[..., -1:] - G).exp()[..., None]  # gamma_C / gamma_j
    M = q.new_zeros(B, H, K, V)
    outputs = []
    for c in range(NC):
        U = U_v[:, :, c] - W[:, :, c] @ M
        outputs.append(decay_out[:, :, c] * (q_c[:, :, c] @ M) + QK[:, :, c] @ U)
        M = G[:, :, c, -1, None, None].exp() * M + (k_c[:, :, c] * decay_end[:, :, c]).transpose(-1, -2) @ U
    o = torch.stack(outputs, 2).reshape(B, H, NC * C, V)[:, :, :N].movedim(1, 2)  # (B, N, H, V)
    return (scale * o.reshape(B, L, n, H, V)[:, :, -1]).to(out_dtype)


delta_rule, gated_delta_rule, delta_product = members(gated_delta_product)
