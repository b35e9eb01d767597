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

RWKV-7's generalized rule (``dplr_delta_rule``) decays every key channel on its own: its chunk form needs
the decays ``exp(c_i - c_j)`` per channel (``c`` the cumulative log decay inside the chunk); see that function.
Shapes, dtypes and ``qk_l2norm`` as ``reference.py``; arithmetic in float64 for float64 inputs, else float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqkernels.delta.members import members
from seqkernels.delta.reference import l2norm

CHUNK = 64
#: the DPLR chunks: of ``DPLR_CHUNK`` steps where a decay bound lets the decays factor (at most
#: ``DPLR_MAX_EXPONENT`` in ``exp(-c)`` within a chunk), else of ``DPLR_PAIRWISE_CHUNK`` with pairwise decays
DPLR_CHUNK, DPLR_PAIRWISE_CHUNK, DPLR_MAX_EXPONENT = 64, 16, 40.0


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


def _decayed_products(x, x_log, ys, c, mask, factor: bool) -> list[torch.Tensor]:
    """``P[i, j] = sum_ch x_i[ch] y_j[ch] exp(x_log_i[ch] - c_j[ch])`` where ``mask`` (``(C, C)``), else 0,
    for each ``y`` of ``ys``; ``x, x_log, y, c (..., C, K)``. ``factor``: as ``(x exp(x_log)) (y exp(-c))^T``
    (matrix products; ``exp(-c)`` must stay finite), else with the ``(..., C, C, K)`` pairwise decays (any
    decay)."""
    if factor:
        x, growth = x * x_log.exp(), (-c).exp()
        return [(x @ (y * growth).transpose(-1, -2)).masked_fill(~mask, 0) for y in ys]
    decays = (x_log[..., :, None, :] - c[..., None, :, :]).masked_fill(~mask[..., None], float("-inf")).exp()
    return [torch.einsum("...ic,...ijc,...jc->...ij", x, decays, y) for y in ys]


def factored_chunk(lower_bound: float | None) -> int:
    """The longest DPLR chunk whose decays factor under ``lower_bound <= w`` (``exp(-c)`` at most
    ``exp(DPLR_MAX_EXPONENT)``, at most ``DPLR_CHUNK`` steps); 0 without a negative bound (pairwise decays)."""
    return min(DPLR_CHUNK, int(DPLR_MAX_EXPONENT / -lower_bound)) if lower_bound and lower_bound < 0 else 0


def dplr_scan(
    U_v: torch.Tensor,
    W: torch.Tensor,
    b_end: torch.Tensor,
    k_end: torch.Tensor,
    v: torch.Tensor,
    decay_end: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The DPLR chunk form's sequential part, chunk by chunk from ``M = 0``: ``U_i = U_v,i + W_i M_i`` and
    ``M_{i+1} = decay_end_i o M_i + b_end_i^T U_i + k_end_i^T v_i`` (``o`` scales rows by key channel).
    ``U_v, v (..., NC, C, V)``, ``W, b_end, k_end (..., NC, C, K)``, ``decay_end (..., NC, K)`` -> ``(U (..., NC,
    C, V), M (..., NC, K, V))``, ``M_i`` the state entering chunk ``i``."""
    M = U_v.new_zeros((*U_v.shape[:-3], W.shape[-1], U_v.shape[-1]))
    U, entering = [], []
    for i in range(U_v.shape[-3]):
        entering.append(M)
        U.append(U_v[..., i, :, :] + W[..., i, :, :] @ M)
        update = b_end[..., i, :, :].transpose(-1, -2) @ U[-1] + k_end[..., i, :, :].transpose(-1, -2) @ v[..., i, :, :]
        M = decay_end[..., i, :, None] * M + update
    return torch.stack(U, -3), torch.stack(entering, -3)


def dplr_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    *,
    scale: float = 1.0,
    lower_bound: float | None = None,
    chunk: int | None = None,
    scan=dplr_scan,
) -> torch.Tensor:
    """RWKV-7's ``S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T``, ``o_t = scale S_t q_t``, chunkwise.
    ``q, k, a, b, w (B, L, H, K)``, ``v (B, L, H, V)`` -> ``o (B, L, H, V)`` in the dtype of ``q``.

    With ``M = S^T (K, V)``, ``u_t = M_{t-1}^T a_t`` and, inside a chunk, ``c_i = sum_{j <= i} w_j`` (per key
    channel, ``c_0 = 0``), ``M_i = exp(c_i) o M_0 + sum_{j <= i} exp(c_i - c_j) o (b_j u_j^T + k_j v_j^T)``, so
    the chunk's ``u`` solve a unit lower-triangular system (``j < i``; ``o`` scales rows by channel):

        (I - A_b) U = (a o exp(c_{i-1})) M_0 + A_k V,    A_x[i, j] = sum_ch a_i x_j exp(c_{i-1} - c_j)
        O   = (q o exp(c)) M_0 + Q_b U + Q_k V,           Q_x[i, j] = sum_ch q_i x_j exp(c_i - c_j)  (j <= i)
        M_C = exp(c_C) o M_0 + (b o exp(c_C - c))^T U + (k o exp(c_C - c))^T V

    ``lower_bound`` (a promise ``lower_bound <= w``; RWKV-7: ``-exp(-0.5)``) lets ``A`` and ``Q`` factor into
    matrix products, in chunks of up to ``DPLR_CHUNK`` steps over which ``exp(-c)`` stays below
    ``exp(DPLR_MAX_EXPONENT)``; without it the decays are formed pairwise, ``(C, C, K)`` per chunk and head,
    in chunks of ``DPLR_PAIRWISE_CHUNK``, exact for any ``w <= 0``. ``chunk`` overrides the size. Only the
    ``M_0`` hand-over between chunks is sequential: ``scan`` (``dplr_scan``'s signature; our Triton kernel in
    ``triton_dplr.py``); everything else is batched over chunks. Padding steps are identities (``w = 0``, the
    rest 0).
    """
    B, L, H, K = q.shape
    V, out_dtype = v.shape[-1], q.dtype
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, a, b, w = (x.to(dtype) for x in (q, k, v, a, b, w))
    # the longest chunk over which exp(-c) stays below exp(DPLR_MAX_EXPONENT); 0: no bound, pairwise decays
    longest = factored_chunk(lower_bound)
    factor = longest >= 1
    C = min(chunk or (longest if factor else DPLR_PAIRWISE_CHUNK), L)
    pad = -L % C
    NC = (L + pad) // C

    def chunked(x: torch.Tensor) -> torch.Tensor:  # (B, L, H, D) -> (B, H, NC, C, D)
        return F.pad(x, (0, 0, 0, 0, 0, pad)).reshape(B, NC, C, H, x.shape[-1]).movedim(3, 1)

    q, k, v, a, b, w = (chunked(x) for x in (q, k, v, a, b, w))
    c = w.cumsum(-2)  # (B, H, NC, C, K)
    c_prev = c - w  # c_{i-1}
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    A_b, A_k = _decayed_products(a, c_prev, (b, k), c, lower.tril(-1), factor)
    Q_b, Q_k = _decayed_products(q, c, (b, k), c, lower, factor)
    system = torch.eye(C, dtype=dtype, device=q.device) - A_b
    solved = torch.linalg.solve_triangular(
        system, torch.cat([A_k @ v, a * c_prev.exp()], -1), upper=False, unitriangular=True
    )
    U_v, W = solved[..., :V], solved[..., V:]
    to_end = (c[..., -1:, :] - c).exp()  # exp(c_C - c_j)
    U, M = scan(U_v, W, b * to_end, k * to_end, v, c[..., -1, :].exp())
    o = (q * c.exp()) @ M + Q_b @ U + Q_k @ v  # (B, H, NC, C, V)
    o = o.reshape(B, H, NC * C, V)[:, :, :L].movedim(1, 2)  # (B, L, H, V)
    return (scale * o).to(out_dtype)
