"""The gated delta rule over steps, chunkwise (WY / UT form), as Triton kernels with the inter-chunk state
recurrence kept on chip (paper 004); ``triton_chunk.py`` launches them and maps the delta rule
(no decay) and DeltaProduct (``NSTEP`` steps per token, the decay on a token's first) onto them.

The recurrence runs over steps ``s``: ``S_s = exp(g_s) S_{s-1} (I - beta_s k_s k_s^T) + beta_s v_s k_s^T``,
read out at each token's last step, ``o_t = scale S_{s(t)} q_t`` (``s(t) = NSTEP t + NSTEP - 1``; a step
that is not a token's last has ``q = 0`` inside the kernels, and its output row is dropped). Per batch
element and head, with the state ``M = S^T (K, V)`` starting at zero, the steps cut into chunks of ``C``
(the last one padded with identity steps: ``k = v = q = beta = g = 0``) and, inside a chunk,
``G_i = sum_{j <= i} g_j``, ``gamma_i = exp(G_i)``, ``Gamma_ij = exp(G_i - G_j)`` (``j <= i``):

    A   = strictly_lower(diag(beta) (K K^T o Gamma))          T = (I + A)^-1      (C, C)
    W   = T diag(beta gamma) K   (C, K)                       U = T diag(beta) V  (C, V)
    U'  = U - W M_0                                           (pseudo-values given the chunk's start state)
    O   = scale (diag(gamma) Q M_0 + P U')                    P = lower(Q K^T o Gamma)
    M_C = gamma_C M_0 + Kt^T U'                               Kt = diag(gamma_C / gamma) K

Kernels (``C`` rows per chunk, key tiles of ``BK >= K`` and value tiles of ``BV`` / ``VP >= V`` columns,
powers of two; intermediates with padded rows and columns, in the dtype the caller allocates them in, ``T``
and ``dW`` float32):

- ``chunk_prep_kernel``, grid ``(NC, B H)``: one chunk's ``T`` (forward substitution, ``C - 1`` steps on
  the ``(C, C)`` tile), ``W`` and ``U``;
- ``chunk_fwd_kernel``, grid ``(NV, B H)``: one program per head and block of ``BV`` value columns walks
  the chunks in order with ``M_0`` in registers, writing each chunk's ``U'`` over its ``U`` (the later
  kernels read ``U'``): (``OUT``) ``O``, and (``SAVE``) every chunk's ``M_0`` for the backward; no state
  leaves the chip but the checkpoints. Without ``OUT`` (the design paper 004 replaces, kept to measure it)
  ``chunk_out_kernel``, grid ``(NC, B H)``, reads the stored states and ``U'`` back for ``O``;
- ``chunk_bwd_state_kernel``, grid ``(NV, B H)``: the chunks in reverse with ``dM`` (the gradient of the
  chunk's end state) in registers, ``dO' = scale dO``:

      dU' = P^T dO' + Kt dM                dP = lower(dO' U'^T),  dQK = dP o Gamma
      dQ  = diag(gamma) dO' M_0^T + dQK K  dK = dQK^T Q + diag(gamma_C / gamma) U' dM^T
      dW  = -dU' M_0^T                     dU = dU'
      dM_0 = gamma_C dM + (diag(gamma) Q)^T dO' - W^T dU'

  and the state's share of ``dG`` (the gradient of ``G``): ``rowsum(dO' o diag(gamma) Q M_0)``,
  ``rowsum(E) - colsum(E)`` for ``E = dP o P``, ``-rowsum(U' dM^T o Kt)``, and on the chunk's last row
  ``sum(U' dM^T o Kt) + gamma_C <dM, M_0>``. ``dQ, dK, dW, dG`` sum over value columns: with
  ``GRADS`` (the rest on chip) written per block (``NV`` leading slices, summed by the caller). The loop
  stores every chunk's ``dU'``. Without ``GRADS`` it only carries ``dM`` (``dU'`` and the ``dM_0`` update)
  and stores every chunk's ``dM``; ``chunk_bwd_grads_kernel``, grid ``(NC, B H)``, computes the rest per
  chunk from the stored ``M_0``, ``dM``, ``U'`` and ``dU'``, summing the value blocks' shares of ``dP =
  dO' U'^T``, ``dO' M_0^T``, ``U' dM^T``, ``dW`` and ``<dM, M_0>`` in registers before the products with
  ``Q`` and ``K``;
- ``chunk_bwd_prep_kernel``, grid ``(NC, B H)``: the chunk's ``T`` backward, with the block sums of
  ``dW`` and the full ``dU``: ``dXw = T^T dW``, ``dXu = T^T dU``, ``dA = -strictly_lower(T^T (dW Xw^T +
  dU Xu^T) T^T)`` (``Xw = diag(beta gamma) K``, ``Xu = diag(beta) V``), then

      dK += (D + D^T) K + diag(beta gamma) dXw     D = dA o Gamma o beta (rows)
      dV  = diag(beta) dXu
      dbeta = rowsum(dA o K K^T o Gamma) + rowsum(dXu o V) + rowsum(dXw o K) gamma
      dG += rowsum(dA o A) - colsum(dA o A) + rowsum(dXw o Xw)

  and ``dg``, the reverse cumulative sum of ``dG`` inside each chunk (the state's parts of ``dk`` and ``dG``,
  summed over value blocks by the caller, added in).

The kernels' ``T`` counts steps: ``k (B, T, H, K)``, ``v (B, T, H, V)``, ``g, beta (B, T, H)`` per step,
``q, dq (B, T / NSTEP, H, K)`` and ``o, do (B, T / NSTEP, H, V)`` per token. Inputs and intermediates are read
in their dtype, all arithmetic is float32; ``PREC`` is the ``input_precision`` of every ``tl.dot`` (``_mm``; ``"bf16"``
rounds the operands to bfloat16). No host reads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from seqkernels._triton import interpreting

#: under the CPU interpreter (``TRITON_INTERPRET=1``) a bfloat16 ``tl.dot`` returns garbage (Triton 3.9), so
#: there ``"bf16"`` products multiply the bfloat16-rounded operands in float32 (the same products)
INTERPRETED = tl.constexpr(interpreting())


@triton.jit
def _mm(a, b, PREC: tl.constexpr, acc=None):
    """``a @ b (+ acc)`` with float32 accumulation: ``PREC`` ``"bf16"`` rounds both operands to bfloat16 (one
    tensor-core pass), else it is ``tl.dot``'s ``input_precision`` on the float32 operands."""
    if PREC == "bf16":
        if INTERPRETED:
            a, b = a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32)
            return tl.dot(a, b, acc, input_precision="ieee")
        else:
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _tile(x, i_b, i_h, t0, T, H, width, C: tl.constexpr, BW: tl.constexpr, col0, NSTEP: tl.constexpr):
    """``(pointers, mask)`` of steps ``t0 .. t0 + C`` (of ``T``) and columns ``col0 .. col0 + BW`` (of
    ``width``) of one head of a ``(B, T / NSTEP, H, width)`` tensor of tokens: step ``t`` is row
    ``t / NSTEP`` when it is a token's last step, else masked (``NSTEP = 1``: a tensor of steps)."""
    t = t0 + tl.arange(0, C)
    col = col0 + tl.arange(0, BW)
    rows = (t < T) & (t % NSTEP == NSTEP - 1)
    ptr = x + ((i_b * (T // NSTEP) + t[:, None] // NSTEP) * H + i_h) * width + col[None, :]
    return ptr, rows[:, None] & (col[None, :] < width)


@triton.jit
def _rows(x, i_b, i_h, t0, T, H, width, C: tl.constexpr, BW: tl.constexpr, col0=0, NSTEP: tl.constexpr = 1):
    """The ``_tile`` of ``x`` as float32, zero where masked."""
    ptr, mask = _tile(x, i_b, i_h, t0, T, H, width, C, BW, col0, NSTEP)
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_rows(x, val, i_b, i_h, t0, T, H, width, C: tl.constexpr, BW: tl.constexpr, col0=0, NSTEP: tl.constexpr = 1):
    """Store a ``(C, BW)`` tile where ``_rows`` reads it (masked rows and columns dropped)."""
    ptr, mask = _tile(x, i_b, i_h, t0, T, H, width, C, BW, col0, NSTEP)
    tl.store(ptr, val.to(x.dtype.element_ty), mask=mask)


@triton.jit
def _steps(x, i_b, i_h, t0, T, H, C: tl.constexpr):
    """One chunk of a per-step ``(B, T, H)`` tensor as a float32 vector of ``C`` (zero past ``T``)."""
    t = t0 + tl.arange(0, C)
    return tl.load(x + (i_b * T + t) * H + i_h, mask=t < T, other=0.0).to(tl.float32)


@triton.jit
def _cum_decay(g, i_b, i_h, t0, T, H, C: tl.constexpr, HAS_G: tl.constexpr):
    """``G``: the cumulative log decay inside one chunk (zeros without ``g``), float32 ``(C,)``."""
    if HAS_G:
        G = tl.cumsum(_steps(g, i_b, i_h, t0, T, H, C), 0)
    else:
        G = tl.zeros([C], dtype=tl.float32)
    return G


@triton.jit
def _decays(G, C: tl.constexpr):
    """``(Gamma, G_last)``: ``exp(G_i - G_j)`` on and below the diagonal (zero above), and ``G_{C-1}``."""
    r = tl.arange(0, C)
    diff = tl.where(r[:, None] >= r[None, :], G[:, None] - G[None, :], float("-inf"))
    return tl.exp(diff), tl.sum(tl.where(r == C - 1, G, 0.0), 0)


@triton.jit
def _forward_substitution(rows, stride, N: tl.constexpr):
    """``(I + A)^-1`` of a strictly lower triangular ``(N, N)`` ``A`` whose row ``i`` is at ``rows + i *
    stride`` (float32), by forward substitution over rows, ``T_i = e_i - sum_{j < i} A_ij T_j``, on the
    transpose (``T^T``'s column ``i`` is ``e_i - T^T a_i``, a reduction along rows). Returns ``T``."""
    r = tl.arange(0, N)
    Tt = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in range(1, N):
        a_i = tl.load(rows + i * stride + r)  # row i of A, indexed by j (zero for j >= i)
        Tt = tl.where(r[None, :] == i, Tt - tl.sum(Tt * a_i[None, :], 1)[:, None], Tt)
    return tl.trans(Tt)


@triton.jit
def _unit_lower_inverse(A, scratch, C: tl.constexpr):
    """``(I + A)^-1`` for a strictly lower triangular ``(C, C)`` tile by ``_forward_substitution`` over
    its ``C`` rows, read back from ``scratch`` (``C x C`` float32, row-major), where ``A`` is stored
    first. Returns ``T``; ``scratch`` may be overwritten once this returns."""
    r = tl.arange(0, C)
    tl.store(scratch + r[:, None] * C + r[None, :], A)
    tl.debug_barrier()
    T = _forward_substitution(scratch, C, C)
    tl.debug_barrier()
    return T


@triton.jit
def _block(tile, i: tl.constexpr, j: tl.constexpr, C: tl.constexpr):
    """Pointers to block ``(i, j)`` (16 x 16) of a ``(C, C)`` row-major tile at ``tile``."""
    s = tl.arange(0, 16)
    return tile + (16 * i + s)[:, None] * C + 16 * j + s[None, :]


@triton.jit
def _unit_lower_inverse_stacked(A, scratch, C: tl.constexpr):
    """``(I + A)^-1`` for a strictly lower triangular ``(C, C)`` tile by blocks of 16 (``M = I + A``):
    the ``C / 16`` diagonal blocks ``T_bb = M_bb^-1`` by forward substitution, all together on one ``(C, 16)``
    tile (row ``16 b + p`` holds row ``p`` of ``T_bb^T``: 15 steps for any ``C``), then the off-diagonal
    blocks ``T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj`` (``i > j``) in registers from one read of ``A``'s and
    ``T_ii``'s blocks, IEEE float32 products. ``scratch`` (``C x C`` float32, row-major) holds ``A``, then
    ``T``; returns ``T``; ``scratch`` may be overwritten once this returns."""
    S: tl.constexpr = 16
    NB: tl.constexpr = C // S
    r = tl.arange(0, C)
    s = tl.arange(0, S)
    tl.store(scratch + r[:, None] * C + r[None, :], A)
    tl.debug_barrier()
    p = r % S
    base = r - p  # first row (and column) of the diagonal block that row r lies in
    D = tl.where(p[:, None] == s[None, :], 1.0, 0.0)
    for i in range(1, S):
        a_i = tl.load(scratch + (base + i)[:, None] * C + base[:, None] + s[None, :])  # row i of A_bb
        D = tl.where(s[None, :] == i, D - tl.sum(D * a_i, 1)[:, None], D)
    tl.debug_barrier()
    tl.store(scratch + (base[:, None] + s[None, :]) * C + (base + p)[:, None], D)  # T_bb[q, p] = D[16 b + p, q]
    tl.debug_barrier()
    if NB == 2:
        T11, T22 = tl.load(_block(scratch, 0, 0, C)), tl.load(_block(scratch, 1, 1, C))
        T21 = -_mm(T22, _mm(tl.load(_block(scratch, 1, 0, C)), T11, "ieee"), "ieee")
        tl.debug_barrier()
        tl.store(_block(scratch, 1, 0, C), T21)
    if NB == 4:
        T11, T22 = tl.load(_block(scratch, 0, 0, C)), tl.load(_block(scratch, 1, 1, C))
        T33, T44 = tl.load(_block(scratch, 2, 2, C)), tl.load(_block(scratch, 3, 3, C))
        A21 = tl.load(_block(scratch, 1, 0, C))
        A31 = tl.load(_block(scratch, 2, 0, C))
        A32 = tl.load(_block(scratch, 2, 1, C))
        A41 = tl.load(_block(scratch, 3, 0, C))
        A42 = tl.load(_block(scratch, 3, 1, C))
        A43 = tl.load(_block(scratch, 3, 2, C))
        T21 = -_mm(T22, _mm(A21, T11, "ieee"), "ieee")
        T32 = -_mm(T33, _mm(A32, T22, "ieee"), "ieee")
        T43 = -_mm(T44, _mm(A43, T33, "ieee"), "ieee")
        T31 = -_mm(T33, _mm(A31, T11, "ieee") + _mm(A32, T21, "ieee"), "ieee")
        T42 = -_mm(T44, _mm(A42, T22, "ieee") + _mm(A43, T32, "ieee"), "ieee")
        T41 = -_mm(T44, _mm(A41, T11, "ieee") + _mm(A42, T21, "ieee") + _mm(A43, T31, "ieee"), "ieee")
        tl.debug_barrier()
        tl.store(_block(scratch, 1, 0, C), T21)
        tl.store(_block(scratch, 2, 0, C), T31)
        tl.store(_block(scratch, 2, 1, C), T32)
        tl.store(_block(scratch, 3, 0, C), T41)
        tl.store(_block(scratch, 3, 1, C), T42)
        tl.store(_block(scratch, 3, 2, C), T43)
    tl.debug_barrier()
    return tl.load(scratch + r[:, None] * C + r[None, :])


@triton.jit
def _inner(bb, KK, Gam, C: tl.constexpr):
    """``A = strictly_lower(diag(beta) K K^T o Gamma)`` of one chunk from ``K K^T`` and ``Gamma``."""
    r = tl.arange(0, C)
    return tl.where(r[:, None] > r[None, :], bb[:, None] * KK * Gam, 0.0)


@triton.jit
def chunk_prep_kernel(
    k,
    v,
    g,
    beta,
    Wm,
    Um,
    Tm,
    T,
    H,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    VP: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    PREC: tl.constexpr,
    INVERSE: tl.constexpr,
):
    """Grid ``(NC, B H)``: ``T (B H, NC C, C)``, ``W (B H, NC C, BK)``, ``U (B H, NC C, VP)`` of one chunk
    (``T`` by ``_unit_lower_inverse_stacked`` or ``_unit_lower_inverse`` for ``INVERSE`` ``"stacked"`` or
    ``"rows"``)."""
    i_c = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    t0 = i_c * C
    kk = _rows(k, i_b, i_h, t0, T, H, K, C, BK)
    vv = _rows(v, i_b, i_h, t0, T, H, V, C, VP)
    G = _cum_decay(g, i_b, i_h, t0, T, H, C, HAS_G)
    bb = _steps(beta, i_b, i_h, t0, T, H, C)
    A = _inner(bb, _mm(kk, tl.trans(kk), PREC), _decays(G, C)[0], C)
    row = i_bh * tl.num_programs(0) * C + t0 + tl.arange(0, C)
    scratch = Tm + (i_bh * tl.num_programs(0) * C + t0) * C
    if INVERSE == "stacked":
        Ti = _unit_lower_inverse_stacked(A, scratch, C)
    else:
        Ti = _unit_lower_inverse(A, scratch, C)
    W = _mm(Ti, kk * (bb * tl.exp(G))[:, None], PREC)
    U = _mm(Ti, vv * bb[:, None], PREC)
    tl.store(Tm + row[:, None] * C + tl.arange(0, C)[None, :], Ti)
    tl.store(Wm + row[:, None] * BK + tl.arange(0, BK)[None, :], W.to(Wm.dtype.element_ty))
    tl.store(Um + row[:, None] * VP + tl.arange(0, VP)[None, :], U.to(Um.dtype.element_ty))


@triton.jit
def _chunk_out(qq, kk, G, Up, M, scale, C: tl.constexpr, PREC: tl.constexpr):
    """``O`` of one chunk from the state ``M`` entering it and its pseudo-values ``U'`` (module docstring)."""
    Gam, _ = _decays(G, C)
    P = _mm(qq, tl.trans(kk), PREC) * Gam
    out = tl.exp(G)[:, None] * _mm(qq, M, PREC)
    return _mm(P, Up, PREC, out) * scale


@triton.jit
def chunk_fwd_kernel(
    q,
    k,
    g,
    Wm,
    Um,
    o,
    ckpt,
    T,
    H,
    scale,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    VP: tl.constexpr,
    C: tl.constexpr,
    NSTEP: tl.constexpr,
    HAS_G: tl.constexpr,
    OUT: tl.constexpr,
    SAVE: tl.constexpr,
    PREC: tl.constexpr,
):
    """Grid ``(NV, B H)``: the chunks of one head in order, ``BV`` value columns of the state ``M (BK, BV)``
    in registers; each chunk's ``U'`` written over its ``U`` in ``Um``; (``OUT``) ``o (B, T / NSTEP, H, V)``;
    (``SAVE``) ``ckpt (B H, NC, BK, VP)`` the state entering each chunk."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NC = tl.cdiv(T, C)
    r = tl.arange(0, C)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    M = tl.zeros([BK, BV], dtype=tl.float32)
    for c in range(0, NC):
        t0 = c * C
        if SAVE:
            tl.store(ckpt + ((i_bh * NC + c) * BK + ok[:, None]) * VP + ov[None, :], M.to(ckpt.dtype.element_ty))
        row = i_bh * NC * C + t0 + r
        kk = _rows(k, i_b, i_h, t0, T, H, K, C, BK)
        G = _cum_decay(g, i_b, i_h, t0, T, H, C, HAS_G)
        W = tl.load(Wm + row[:, None] * BK + ok[None, :]).to(tl.float32)
        U = tl.load(Um + row[:, None] * VP + ov[None, :]).to(tl.float32)
        Up = U - _mm(W, M, PREC)
        tl.store(Um + row[:, None] * VP + ov[None, :], Up.to(Um.dtype.element_ty))
        if OUT:
            qq = _rows(q, i_b, i_h, t0, T, H, K, C, BK, 0, NSTEP)
            out = _chunk_out(qq, kk, G, Up, M, scale, C, PREC)
            _store_rows(o, out, i_b, i_h, t0, T, H, V, C, BV, i_v * BV, NSTEP)
        GL = tl.sum(tl.where(r == C - 1, G, 0.0), 0)
        Kt = kk * tl.exp(GL - G)[:, None]
        M = _mm(tl.trans(Kt), Up, PREC, M * tl.exp(GL))


@triton.jit
def chunk_out_kernel(
    q,
    k,
    g,
    Wm,
    Um,
    o,
    ckpt,
    T,
    H,
    scale,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    VP: tl.constexpr,
    C: tl.constexpr,
    NSTEP: tl.constexpr,
    HAS_G: tl.constexpr,
    PREC: tl.constexpr,
):
    """Grid ``(NC, B H)``: one chunk's output from its stored entering state and ``U'`` (the forward
    without the on-chip recurrence: ``chunk_fwd_kernel`` with ``OUT=False`` stores them), the value columns
    in blocks of ``BV`` (``Q``, ``K`` read and ``Q K^T`` formed once)."""
    i_c = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NC = tl.num_programs(0)
    t0 = i_c * C
    row = i_bh * NC * C + t0 + tl.arange(0, C)
    ok = tl.arange(0, BK)
    qq = _rows(q, i_b, i_h, t0, T, H, K, C, BK, 0, NSTEP)
    kk = _rows(k, i_b, i_h, t0, T, H, K, C, BK)
    G = _cum_decay(g, i_b, i_h, t0, T, H, C, HAS_G)
    at = ((i_bh * NC + i_c) * BK + ok[:, None]) * VP
    if VP == BV:  # one block of values
        M = tl.load(ckpt + at + tl.arange(0, BV)[None, :]).to(tl.float32)
        Up = tl.load(Um + row[:, None] * VP + tl.arange(0, BV)[None, :]).to(tl.float32)
        _store_rows(o, _chunk_out(qq, kk, G, Up, M, scale, C, PREC), i_b, i_h, t0, T, H, V, C, BV, 0, NSTEP)
    else:  # P = Q K^T o Gamma formed once for every block (fewer spills than per block: the compile report)
        Gam, _ = _decays(G, C)
        P = _mm(qq, tl.trans(kk), PREC) * Gam
        for i_v in range(0, VP // BV):
            ov = i_v * BV + tl.arange(0, BV)
            M = tl.load(ckpt + at + ov[None, :]).to(tl.float32)
            Up = tl.load(Um + row[:, None] * VP + ov[None, :]).to(tl.float32)
            out = _mm(P, Up, PREC, tl.exp(G)[:, None] * _mm(qq, M, PREC)) * scale
            _store_rows(o, out, i_b, i_h, t0, T, H, V, C, BV, i_v * BV, NSTEP)


@triton.jit
def _chunk_pk(qq, kk, G, C: tl.constexpr, PREC: tl.constexpr):
    """``(P, Gamma, Kt, G_last)`` of one chunk (module docstring)."""
    Gam, GL = _decays(G, C)
    P = _mm(qq, tl.trans(kk), PREC) * Gam
    return P, Gam, kk * tl.exp(GL - G)[:, None], GL


@triton.jit
def _block_grads(dO, Up, M0, dM, dUp, dP, dOM, dKt, ndW, PREC: tl.constexpr):
    """One block of value columns' share of a chunk's gradients added to the sums over the blocks before
    it (module docstring): ``(dP + dO' U'^T, dOM + dO' M_0^T, dKt + U' dM^T, ndW + dU' M_0^T, <dM, M_0>)``
    (``ndW``: ``-dW``)."""
    dP = _mm(dO, tl.trans(Up), PREC, dP)
    dOM = _mm(dO, tl.trans(M0), PREC, dOM)
    dKt = _mm(Up, tl.trans(dM), PREC, dKt)
    ndW = _mm(dUp, tl.trans(M0), PREC, ndW)
    return dP, dOM, dKt, ndW, tl.sum(tl.sum(dM * M0, 1), 0)


@triton.jit
def _chunk_grads(
    qq, kk, G, P, Gam, Kt, GL, dP, dOM, dKt, dW, dMM0, dq, dk, dWm, dGm, part, prow, i_h, t0, T, H,
    K: tl.constexpr, BK: tl.constexpr, C: tl.constexpr, NSTEP: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One chunk's ``dQ``, ``dK`` (the state's part), ``dW`` and the state's part of ``dG`` (module
    docstring) from the sums of ``_block_grads`` over value columns (of every block, or of one), stored:
    ``dq, dk`` at batch index ``part``, ``dW, dG`` at rows ``prow``."""
    r = tl.arange(0, C)
    ok = tl.arange(0, BK)
    gam, eK, gC = tl.exp(G), tl.exp(GL - G), tl.exp(GL)
    dP = tl.where(r[:, None] >= r[None, :], dP, 0.0)
    dQK = dP * Gam
    dqc = _mm(dQK, kk, PREC, gam[:, None] * dOM)
    dkc = _mm(tl.trans(dQK), qq, PREC, eK[:, None] * dKt)
    E = dP * P
    eKt = dKt * Kt
    # gamma_i's share through diag(gamma) Q M_0 is rowsum(dO' o gamma Q M_0) = gamma_i (q_i . dO'_i M_0^T)
    dG = gam * tl.sum(qq * dOM, 1) + tl.sum(E, 1) - tl.sum(E, 0) - tl.sum(eKt, 1)
    last = tl.sum(tl.sum(eKt, 1), 0) + gC * dMM0
    dG += tl.where(r == C - 1, last, 0.0)
    _store_rows(dq, dqc, part, i_h, t0, T, H, K, C, BK, 0, NSTEP)
    _store_rows(dk, dkc, part, i_h, t0, T, H, K, C, BK)
    tl.store(dWm + prow[:, None] * BK + ok[None, :], dW)
    tl.store(dGm + prow, dG)


@triton.jit
def chunk_bwd_state_kernel(
    q,
    k,
    g,
    Wm,
    Um,
    ckpt,
    do,
    dckpt,
    dq,
    dk,
    dWm,
    dUm,
    dGm,
    B,
    T,
    H,
    scale,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    VP: tl.constexpr,
    C: tl.constexpr,
    NSTEP: tl.constexpr,
    HAS_G: tl.constexpr,
    GRADS: tl.constexpr,
    PREC: tl.constexpr,
):
    """Grid ``(NV, B H)``: the chunks of one head in reverse, ``dM (BK, BV)`` in registers (module
    docstring), storing ``dU' (B H, NC C, VP)`` at the block's columns. ``GRADS``: also every chunk's
    gradients (``_chunk_grads`` from ``U'`` in ``Um``; per block of value columns, leading ``NV``: ``dq (NV,
    B, T / NSTEP, H, K)``, ``dk (NV, B, T, H, K)``, ``dW (NV, B H, NC C, BK)``, ``dG (NV, B H, NC C)``);
    else the gradient of the state leaving each chunk, ``dckpt (B H, NC, BK, VP)``, for
    ``chunk_bwd_grads_kernel``."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NC = tl.cdiv(T, C)
    r = tl.arange(0, C)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    dM = tl.zeros([BK, BV], dtype=tl.float32)
    for cc in range(0, NC):
        c = NC - 1 - cc
        t0 = c * C
        row = i_bh * NC * C + t0 + r
        qq = _rows(q, i_b, i_h, t0, T, H, K, C, BK, 0, NSTEP)
        kk = _rows(k, i_b, i_h, t0, T, H, K, C, BK)
        dO = _rows(do, i_b, i_h, t0, T, H, V, C, BV, i_v * BV, NSTEP) * scale
        G = _cum_decay(g, i_b, i_h, t0, T, H, C, HAS_G)
        W = tl.load(Wm + row[:, None] * BK + ok[None, :]).to(tl.float32)
        P, Gam, Kt, GL = _chunk_pk(qq, kk, G, C, PREC)
        dUp = _mm(Kt, dM, PREC, _mm(tl.trans(P), dO, PREC))
        tl.store(dUm + row[:, None] * VP + ov[None, :], dUp.to(dUm.dtype.element_ty))
        if GRADS:
            M0 = tl.load(ckpt + ((i_bh * NC + c) * BK + ok[:, None]) * VP + ov[None, :]).to(tl.float32)
            Up = tl.load(Um + row[:, None] * VP + ov[None, :]).to(tl.float32)
            zc, zk = tl.zeros([C, C], dtype=tl.float32), tl.zeros([C, BK], dtype=tl.float32)
            dP, dOM, dKt, ndW, dMM0 = _block_grads(dO, Up, M0, dM, dUp, zc, zk, zk, zk, PREC)
            prow = i_v.to(tl.int64) * B * H * NC * C + row  # this block's slice of dW, dG
            _chunk_grads(
                qq, kk, G, P, Gam, Kt, GL, dP, dOM, dKt, -ndW, dMM0, dq, dk, dWm, dGm, i_v * B + i_b, prow,
                i_h, t0, T, H, K, BK, C, NSTEP, PREC,
            )  # fmt: skip
        else:
            tl.store(dckpt + ((i_bh * NC + c) * BK + ok[:, None]) * VP + ov[None, :], dM.to(dckpt.dtype.element_ty))
        dM = _mm(tl.trans(qq * tl.exp(G)[:, None]), dO, PREC, dM * tl.exp(GL))
        dM = dM - _mm(tl.trans(W), dUp, PREC)


@triton.jit
def _stored_block_grads(
    ckpt, dckpt, do, Um, dUm, i_v, i_bh, i_c, NC, row, i_b, i_h, t0, T, H, scale, dP, dOM, dKt, ndW, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, VP: tl.constexpr, C: tl.constexpr, NSTEP: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``_block_grads`` of value block ``i_v`` of chunk ``i_c`` from the stored ``M_0``, ``dM``, ``U'``, ``dU'``,
    added to ``dP, dOM, dKt, ndW``."""
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    at = ((i_bh * NC + i_c) * BK + ok[:, None]) * VP + ov[None, :]
    M0, dM = tl.load(ckpt + at).to(tl.float32), tl.load(dckpt + at).to(tl.float32)
    dO = _rows(do, i_b, i_h, t0, T, H, V, C, BV, i_v * BV, NSTEP) * scale
    Up = tl.load(Um + row[:, None] * VP + ov[None, :]).to(tl.float32)
    dUp = tl.load(dUm + row[:, None] * VP + ov[None, :]).to(tl.float32)
    return _block_grads(dO, Up, M0, dM, dUp, dP, dOM, dKt, ndW, PREC)


@triton.jit
def chunk_bwd_grads_kernel(
    q,
    k,
    g,
    Wm,
    Um,
    ckpt,
    do,
    dckpt,
    dq,
    dk,
    dWm,
    dUm,
    dGm,
    B,
    T,
    H,
    scale,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    VP: tl.constexpr,
    C: tl.constexpr,
    NSTEP: tl.constexpr,
    HAS_G: tl.constexpr,
    PREC: tl.constexpr,
):
    """Grid ``(NC, B H)``: one chunk's gradients (``_chunk_grads``) from its stored entering state, the
    stored gradient of its leaving state, ``U'`` and ``dU'``, the value columns' shares summed in registers
    over blocks of ``min(BV, 32)`` columns (narrower blocks hold fewer registers: the compile report's
    spills) (the backward without the on-chip recurrence; ``dq, dk, dW, dG`` with one leading slice)."""
    i_c = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NC = tl.num_programs(0)
    t0 = i_c * C
    row = i_bh * NC * C + t0 + tl.arange(0, C)
    dP = tl.zeros([C, C], dtype=tl.float32)
    dOM = tl.zeros([C, BK], dtype=tl.float32)
    dKt = tl.zeros([C, BK], dtype=tl.float32)
    ndW = tl.zeros([C, BK], dtype=tl.float32)
    dMM0 = 0.0
    GB: tl.constexpr = 32 if BV > 32 else BV
    for i_v in range(0, VP // GB):
        dP, dOM, dKt, ndW, mm = _stored_block_grads(
            ckpt, dckpt, do, Um, dUm, i_v, i_bh, i_c, NC, row, i_b, i_h, t0, T, H, scale, dP, dOM, dKt, ndW,
            V, BK, GB, VP, C, NSTEP, PREC,
        )  # fmt: skip
        dMM0 += mm
    qq = _rows(q, i_b, i_h, t0, T, H, K, C, BK, 0, NSTEP)
    kk = _rows(k, i_b, i_h, t0, T, H, K, C, BK)
    G = _cum_decay(g, i_b, i_h, t0, T, H, C, HAS_G)
    P, Gam, Kt, GL = _chunk_pk(qq, kk, G, C, PREC)
    _chunk_grads(
        qq, kk, G, P, Gam, Kt, GL, dP, dOM, dKt, -ndW, dMM0, dq, dk, dWm, dGm, i_b, row,
        i_h, t0, T, H, K, BK, C, NSTEP, PREC,
    )  # fmt: skip


@triton.jit
def _block_and_grad(x, dxm, row, i_b, i_h, t0, T, H, width, WP: tl.constexpr, C: tl.constexpr, B: tl.constexpr, col0):
    """Columns ``col0 .. col0 + B`` of one chunk of a ``(B, T, H, width)`` input (``_rows``) and of its
    per-chunk gradient ``dxm (B H, NC C, WP)`` at rows ``row``, both float32."""
    xb = _rows(x, i_b, i_h, t0, T, H, width, C, B, col0)
    return xb, tl.load(dxm + row[:, None] * WP + col0 + tl.arange(0, B)[None, :]).to(tl.float32)


@triton.jit
def chunk_bwd_prep_kernel(
    k,
    v,
    g,
    beta,
    Tm,
    dWm,
    dUm,
    dk,
    dv,
    dbeta,
    dGm,
    dg,
    T,
    H,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    VP: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    PREC: tl.constexpr,
):
    """Grid ``(NC, B H)``: the backward of one chunk's ``T``, ``W``, ``U`` (module docstring) from ``dW``
    (summed over value blocks) and ``dU``, finishing the input gradients: ``dk (B, T, H, K)`` holds the
    state's part on entry and the whole ``dk`` on exit (float32); ``dv (B, T, H, V)`` (in its own dtype),
    ``dbeta (B, T, H)`` (float32); with ``HAS_G``, from the state's part of ``dG`` in ``dGm (B H, NC C)``,
    ``dg (B, T, H)`` (float32): ``g_s`` reaches every ``G_i`` of its chunk with ``i >= s``, so ``dg`` is
    ``dG``'s reverse cumulative sum inside the chunk. Keys and values are taken in blocks of 64 columns,
    twice: first for the ``(C, C)`` products ``K K^T`` and ``dT``, then for the gradients of each block's
    columns (one block: loaded once)."""
    i_c = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    t0 = i_c * C
    r = tl.arange(0, C)
    t = t0 + r
    row = i_bh * tl.num_programs(0) * C + t0 + r
    KB: tl.constexpr = BK if BK <= 64 else 64  # blocks of 64 columns (the fastest timed at head dims 64, 128)
    VB: tl.constexpr = VP if VP <= 64 else 64
    G = _cum_decay(g, i_b, i_h, t0, T, H, C, HAS_G)
    bb = _steps(beta, i_b, i_h, t0, T, H, C)
    eG = tl.exp(G)
    bg = bb * eG
    # K K^T and dT = dW Xw^T + dU Xu^T (Xw = diag(beta gamma) K, Xu = diag(beta) V), block by block
    KK = tl.zeros([C, C], dtype=tl.float32)
    dT = tl.zeros([C, C], dtype=tl.float32)
    for b in tl.static_range(BK // KB):
        kk, dW = _block_and_grad(k, dWm, row, i_b, i_h, t0, T, H, K, BK, C, KB, b * KB)
        KK = _mm(kk, tl.trans(kk), PREC, KK)
        dT = _mm(dW, tl.trans(kk * bg[:, None]), PREC, dT)
    for b in tl.static_range(VP // VB):
        vv, dU = _block_and_grad(v, dUm, row, i_b, i_h, t0, T, H, V, VP, C, VB, b * VB)
        dT = _mm(dU, tl.trans(vv * bb[:, None]), PREC, dT)
    TT = tl.trans(tl.load(Tm + row[:, None] * C + r[None, :]))
    dA = -_mm(_mm(TT, dT, PREC), TT, PREC)
    Gam, _ = _decays(G, C)
    dA = tl.where(r[:, None] > r[None, :], dA, 0.0)
    D = dA * Gam * bb[:, None]
    dbc = tl.sum(dA * KK * Gam, 1)
    EA = dA * _inner(bb, KK, Gam, C)
    dG = tl.sum(EA, 1) - tl.sum(EA, 0)
    # each block's gradients: dXw = T^T dW, dXu = T^T dU
    for b in tl.static_range(BK // KB):
        if BK > KB:
            kk, dW = _block_and_grad(k, dWm, row, i_b, i_h, t0, T, H, K, BK, C, KB, b * KB)
        dXw = _mm(TT, dW, PREC)
        dkc = _mm(D, kk, PREC, dXw * bg[:, None])
        dkc = _mm(tl.trans(D), kk, PREC, dkc)
        dXwK = tl.sum(dXw * kk, 1)
        dbc += dXwK * eG
        dG += dXwK * bg
        dkc += _rows(dk, i_b, i_h, t0, T, H, K, C, KB, b * KB)
        _store_rows(dk, dkc, i_b, i_h, t0, T, H, K, C, KB, b * KB)
    for b in tl.static_range(VP // VB):
        if VP > VB:
            vv, dU = _block_and_grad(v, dUm, row, i_b, i_h, t0, T, H, V, VP, C, VB, b * VB)
        dXu = _mm(TT, dU, PREC)
        dbc += tl.sum(dXu * vv, 1)
        _store_rows(dv, dXu * bb[:, None], i_b, i_h, t0, T, H, V, C, VB, b * VB)
    if HAS_G:
        dG += tl.load(dGm + row)
        tl.store(dg + (i_b * T + t) * H + i_h, tl.cumsum(dG, 0, reverse=True), mask=t < T)
    tl.store(dbeta + (i_b * T + t) * H + i_h, dbc, mask=t < T)
