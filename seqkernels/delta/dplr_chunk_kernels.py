"""RWKV-7's DPLR rule chunkwise with factored decays, as Triton kernels per chunk around the inter-chunk scan
(``dplr_scan_kernels.py``); ``triton_dplr.py`` launches them. The equations are ``pytorch.dplr_delta_rule``'s
with a decay bound. Per batch element and head, chunk of ``C`` steps, ``M_0`` the state entering it (from
the scan), inside the chunk ``c = cumsum(w)`` per key channel, ``c' = c - w``, ``c_C`` the last row::

    a* = a o exp(c')    q* = q o exp(c)    b~ = b o exp(-c)    k~ = k o exp(-c)           (C, K)
    A_b = strictly_lower(a* b~^T)    A_k = strictly_lower(a* k~^T)    T = (I - A_b)^-1   (C, C)
    U_v = T A_k v        W = T a*                                                         (scan's inputs)
    Be = b o exp(c_C - c)      Ke = k o exp(c_C - c)      D = exp(c_C)          (and v itself)
    O = scale (q* M_0 + Q_b U + Q_k v),    Q_x = lower(q* x~^T)                           (U from the scan)

Kernels, grid ``(NC, B H, NV)``, one program per chunk, head and block of ``BV`` value columns with whole
key rows (``BK``, ``BV`` powers of two, ``BK`` covering ``K``). Every gradient is linear in the value
blocks' shares, so a program adds the terms that do not depend on the values only in block 0, and what
sums over the values (``dq``, ``dk``, ``da``, ``db``, ``dw`` and the output's shares) is written per block
(``NV`` leading slices ``PART`` elements apart, summed by the caller):

- ``dplr_prep_kernel``: ``U_v, W, Be, Ke, D`` and ``T`` (by the stacked block inverse, ``chunk_kernels``, in
  each value block's own scratch; block 0's kept for the backward);
- ``dplr_out_kernel``: ``O`` from the scan's ``U`` and ``M_0``;
- ``dplr_out_bwd_kernel``: from ``dO' = scale dO``, the scan's output gradient ``dU = Q_b^T dO'`` (the
  chunk's share of ``dM_0``, ``q*^T dO'``, the scan's backward forms from the same rows), ``dq`` whole, and
  the output's shares of ``dk, db, dv`` and of ``dc`` (the gradient of ``c``)::

      dQ_x = lower(dO' Y^T)  (Y = U, v)     dq* = dO' M_0^T + dQ_b b~ + dQ_k k~      dv = Q_k^T dO'
      dq = dq* o exp(c)      db = dQ_b^T q* o exp(-c)     dc = dq* o q* - dQ_b^T q* o b~ - (k alike)

- ``dplr_prep_bwd_kernel``: with the forward's ``T``, the scan's input gradients ``dU_v, dW, dBe, dKe, dv,
  dD`` (the scan backward's value blocks each write a share of ``dW, dBe, dKe, dD``: summed as they are read)
  and the output's shares, ``R = A_k v``::

      dT = dU_v R^T + dW a*^T      dR = T^T dU_v      da* = T^T dW + dA_b b~ + dA_k k~
      dA_b = strictly_lower(T^T dT T^T)      dA_k = strictly_lower(dR v^T)      dv += A_k^T dR
      db~ = dA_b^T a*     dk~ = dA_k^T a*

  then the decays' chain rule onto ``a, b, k`` and ``c, c', c_C``, and ``dw`` (``c`` and ``c'`` are sums
  of ``w`` up to and before each step, ``c_C`` of all the chunk's).

Inputs ``(B, L, H, K or V)`` (rows past ``L`` read as zeros: identity steps), any float dtype read as
float32; the scan's tensors float32 ``(B H, NC, rows, cols)`` (``M_in`` may be bfloat16); partial gradients
float32 in the inputs' layout. ``PREC``: every product's precision (``chunk_kernels._mm``: ``"bf16"`` or
``tl.dot``'s ``input_precision``); the inverse is IEEE float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from seqkernels.delta.chunk_kernels import _mm, _rows, _store_rows, _unit_lower_inverse_stacked
from seqkernels.delta.dplr_scan_kernels import _load, _store


@triton.jit
def _decayed(w, C: tl.constexpr):
    """``(c, c', c_C)`` of one chunk's log decays ``w (C, BK)``: inclusive and exclusive cumulative sums, and
    the last row ``(BK,)``."""
    c = tl.cumsum(w, 0)
    r = tl.arange(0, C)
    return c, c - w, tl.sum(tl.where(r[:, None] == C - 1, c, 0.0), 0)


@triton.jit
def _strict(x, C: tl.constexpr):
    r = tl.arange(0, C)
    return tl.where(r[:, None] > r[None, :], x, 0.0)


@triton.jit
def _lower(x, C: tl.constexpr):
    r = tl.arange(0, C)
    return tl.where(r[:, None] >= r[None, :], x, 0.0)


@triton.jit
def _load_shares(x, base, rows, cols, n_rows, n_cols, NS: tl.constexpr, STRIDE):
    """The sum of ``NS`` tiles ``STRIDE`` elements apart (the scan backward's per-value-block shares)."""
    acc = _load(x, base, rows, cols, n_rows, n_cols)
    for s in tl.static_range(1, NS):
        acc += _load(x, base + s * STRIDE, rows, cols, n_rows, n_cols)
    return acc


@triton.jit
def _share_row_sum(x, base, cols, n_cols, NS: tl.constexpr, STRIDE):
    """The sum of ``NS`` rows ``STRIDE`` elements apart."""
    acc = tl.load(x + base + cols, mask=cols < n_cols, other=0.0)
    for s in tl.static_range(1, NS):
        acc += tl.load(x + base + s * STRIDE + cols, mask=cols < n_cols, other=0.0)
    return acc


@triton.jit
def dplr_prep_kernel(
    k, v, a, b, w, Uv, Wy, Be, Ke, D, Tm, T, H, NC, K, V,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The scan's inputs ``Uv (B H, NC, C, V)``, ``Wy, Be, Ke (B H, NC, C, K)``, ``D (B H, NC, K)`` of one
    chunk, and its ``T`` in ``Tm (NV, B H, NC, C, C)`` (the inverse's scratch); grid ``(NC, B H, NV)``."""
    i_c, i_bh, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h, t0, v0 = i_bh // H, i_bh % H, i_c * C, i_v * BV
    n = (i_bh * NC + i_c).to(tl.int64)
    rc, rk, rv = tl.arange(0, C), tl.arange(0, BK), v0 + tl.arange(0, BV)
    c, cp, cC = _decayed(_rows(w, i_b, i_h, t0, T, H, K, C, BK), C)
    kk, bb = _rows(k, i_b, i_h, t0, T, H, K, C, BK), _rows(b, i_b, i_h, t0, T, H, K, C, BK)
    vv = _rows(v, i_b, i_h, t0, T, H, V, C, BV, v0)
    a_s = _rows(a, i_b, i_h, t0, T, H, K, C, BK) * tl.exp(cp)
    grow = tl.exp(-c)
    Ab = _strict(_mm(a_s, tl.trans(bb * grow), PREC), C)
    Ak = _strict(_mm(a_s, tl.trans(kk * grow), PREC), C)
    # each value block inverts in its own scratch; block 0's T is the backward's
    Ti = _unit_lower_inverse_stacked(-Ab, Tm + (i_v * tl.num_programs(1) * NC + n) * C * C, C)
    _store(Uv, n * C * V, _mm(Ti, _mm(Ak, vv, PREC), PREC), rc, rv, C, V)
    if i_v == 0:
        to_end = tl.exp(cC[None, :] - c)
        _store(Wy, n * C * K, _mm(Ti, a_s, PREC), rc, rk, C, K)
        _store(Be, n * C * K, bb * to_end, rc, rk, C, K)
        _store(Ke, n * C * K, kk * to_end, rc, rk, C, K)
        tl.store(D + n * K + rk, tl.exp(cC), mask=rk < K)


@triton.jit
def dplr_out_kernel(
    q, k, v, b, w, U, M_in, o, scale, T, H, NC, K, V,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``o (B, L, H, V)`` of one chunk from the scan's ``U`` and ``M_in``; grid ``(NC, B H, NV)``."""
    i_c, i_bh, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h, t0, v0 = i_bh // H, i_bh % H, i_c * C, i_v * BV
    n = (i_bh * NC + i_c).to(tl.int64)
    rc, rk, rv = tl.arange(0, C), tl.arange(0, BK), v0 + tl.arange(0, BV)
    c, _, _ = _decayed(_rows(w, i_b, i_h, t0, T, H, K, C, BK), C)
    q_s = _rows(q, i_b, i_h, t0, T, H, K, C, BK) * tl.exp(c)
    grow = tl.exp(-c)
    Qb = _lower(_mm(q_s, tl.trans(_rows(b, i_b, i_h, t0, T, H, K, C, BK) * grow), PREC), C)
    Qk = _lower(_mm(q_s, tl.trans(_rows(k, i_b, i_h, t0, T, H, K, C, BK) * grow), PREC), C)
    out = _mm(q_s, _load(M_in, n * K * V, rk, rv, K, V), PREC)
    out = _mm(Qb, _load(U, n * C * V, rc, rv, C, V), PREC, out)
    out = _mm(Qk, _rows(v, i_b, i_h, t0, T, H, V, C, BV, v0), PREC, out)
    _store_rows(o, scale * out, i_b, i_h, t0, T, H, V, C, BV, v0)


@triton.jit
def dplr_out_bwd_kernel(
    do, q, k, v, b, w, U, M_in, dU, dq, dk_o, db_o, dv_o, dc_o, scale, T, H, NC, K, V, PART,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The output's gradients of one chunk: ``dU`` (the scan's output gradient; that of ``M_0`` the scan's
    backward forms), ``dq``, and the output's shares ``dk_o, db_o, dc_o (B, L, H, K)``, ``dv_o (B, L, H, V)``;
    grid ``(NC, B H, NV)``."""
    i_c, i_bh, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h, t0, v0 = i_bh // H, i_bh % H, i_c * C, i_v * BV
    n = (i_bh * NC + i_c).to(tl.int64)
    rc, rk, rv = tl.arange(0, C), tl.arange(0, BK), v0 + tl.arange(0, BV)
    c, _, _ = _decayed(_rows(w, i_b, i_h, t0, T, H, K, C, BK), C)
    grow, ec = tl.exp(-c), tl.exp(c)
    # each tile loaded where it is first needed and each product stored when done: fewer live tiles
    q_s = _rows(q, i_b, i_h, t0, T, H, K, C, BK) * ec
    dO = scale * _rows(do, i_b, i_h, t0, T, H, V, C, BV, v0)
    b_g = _rows(b, i_b, i_h, t0, T, H, K, C, BK) * grow
    _store(dU, n * C * V, _mm(tl.trans(_lower(_mm(q_s, tl.trans(b_g), PREC), C)), dO, PREC), rc, rv, C, V)
    k_g = _rows(k, i_b, i_h, t0, T, H, K, C, BK) * grow
    dv_ = _mm(tl.trans(_lower(_mm(q_s, tl.trans(k_g), PREC), C)), dO, PREC)
    _store_rows(dv_o, dv_, i_b, i_h, t0, T, H, V, C, BV, v0)
    dq_s = _mm(dO, tl.trans(_load(M_in, n * K * V, rk, rv, K, V)), PREC)
    part = i_v.to(tl.int64) * PART  # this value block's slice of the (NV, B, L, H, K) shares
    dQb = _lower(_mm(dO, tl.trans(_load(U, n * C * V, rc, rv, C, V)), PREC), C)
    dq_s = _mm(dQb, b_g, PREC, dq_s)
    db_g = _mm(tl.trans(dQb), q_s, PREC)
    _store_rows(db_o + part, db_g * grow, i_b, i_h, t0, T, H, K, C, BK)
    dc = -db_g * b_g
    dQk = _lower(_mm(dO, tl.trans(_rows(v, i_b, i_h, t0, T, H, V, C, BV, v0)), PREC), C)
    dq_s = _mm(dQk, k_g, PREC, dq_s)
    dk_g = _mm(tl.trans(dQk), q_s, PREC)
    _store_rows(dk_o + part, dk_g * grow, i_b, i_h, t0, T, H, K, C, BK)
    dc -= dk_g * k_g
    _store_rows(dq + part, dq_s * ec, i_b, i_h, t0, T, H, K, C, BK)
    _store_rows(dc_o + part, dq_s * q_s + dc, i_b, i_h, t0, T, H, K, C, BK)


@triton.jit
def dplr_prep_bwd_kernel(
    k, v, a, b, w, Tm, dUv, dWy, dBe, dKe, dVe, dD, dk_o, db_o, dv_o, dc_o, dk, dv, da, db, dw, T, H, NC, K, V, PART,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, NS: tl.constexpr,
):  # fmt: skip
    """``dk, dv, da, db, dw`` of one chunk from the forward's ``Tm``, the scan's input gradients (``dWy, dBe,
    dKe, dD`` as the scan backward's ``NS`` value blocks' shares, summed here) and the output's shares; grid
    ``(NC, B H, NV)``."""
    BHC = tl.num_programs(1).to(tl.int64) * NC  # chunks of every head: the shares' (B H, NC) elements
    i_c, i_bh, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h, t0, v0 = i_bh // H, i_bh % H, i_c * C, i_v * BV
    n = (i_bh * NC + i_c).to(tl.int64)
    rc, rk, rv = tl.arange(0, C), tl.arange(0, BK), v0 + tl.arange(0, BV)
    ww = _rows(w, i_b, i_h, t0, T, H, K, C, BK)
    c, cp, cC = _decayed(ww, C)
    kk, bb = _rows(k, i_b, i_h, t0, T, H, K, C, BK), _rows(b, i_b, i_h, t0, T, H, K, C, BK)
    vv = _rows(v, i_b, i_h, t0, T, H, V, C, BV, v0)
    ecp, grow = tl.exp(cp), tl.exp(-c)
    a_s = _rows(a, i_b, i_h, t0, T, H, K, C, BK) * ecp
    b_g, k_g = bb * grow, kk * grow
    Ak = _strict(_mm(a_s, tl.trans(k_g), PREC), C)
    Ti = tl.load(Tm + n * C * C + rc[:, None] * C + rc[None, :])
    R = _mm(Ak, vv, PREC)
    dUv_ = _load(dUv, n * C * V, rc, rv, C, V)
    first = (i_v == 0).to(tl.float32)  # the terms that do not depend on the values come from block 0
    dWy_ = first * _load_shares(dWy, n * C * K, rc, rk, C, K, NS, BHC * C * K)
    dT = _mm(dWy_, tl.trans(a_s), PREC, _mm(dUv_, tl.trans(R), PREC))
    Tt = tl.trans(Ti)
    dR = _mm(Tt, dUv_, PREC)
    dAb = _strict(_mm(_mm(Tt, dT, PREC), Tt, PREC), C)
    dAk = _strict(_mm(dR, tl.trans(vv), PREC), C)
    da_s = _mm(dAk, k_g, PREC, _mm(dAb, b_g, PREC, _mm(Tt, dWy_, PREC)))
    db_g = _mm(tl.trans(dAb), a_s, PREC)
    dk_g = _mm(tl.trans(dAk), a_s, PREC)
    to_end = tl.exp(cC[None, :] - c)
    dv_ = _load(dVe, n * C * V, rc, rv, C, V) + _mm(tl.trans(Ak), dR, PREC)
    _store_rows(dv, dv_ + _rows(dv_o, i_b, i_h, t0, T, H, V, C, BV, v0), i_b, i_h, t0, T, H, V, C, BV, v0)
    dBe_ = first * _load_shares(dBe, n * C * K, rc, rk, C, K, NS, BHC * C * K)
    dKe_ = first * _load_shares(dKe, n * C * K, rc, rk, C, K, NS, BHC * C * K)
    part = i_v.to(tl.int64) * PART  # this value block's slice of the (NV, B, L, H, K) gradients
    db_ = dBe_ * to_end + db_g * grow + first * _rows(db_o, i_b, i_h, t0, T, H, K, C, BK)
    dk_ = dKe_ * to_end + dk_g * grow + first * _rows(dk_o, i_b, i_h, t0, T, H, K, C, BK)
    _store_rows(db + part, db_, i_b, i_h, t0, T, H, K, C, BK)
    _store_rows(dk + part, dk_, i_b, i_h, t0, T, H, K, C, BK)
    _store_rows(da + part, da_s * ecp, i_b, i_h, t0, T, H, K, C, BK)
    d_end = (dBe_ * bb + dKe_ * kk) * to_end  # the gradient of exp(c_C - c), times it
    dcC = tl.sum(d_end, 0) + first * _share_row_sum(dD, n * K, rk, K, NS, BHC * K) * tl.exp(cC)
    dc = first * _rows(dc_o, i_b, i_h, t0, T, H, K, C, BK) - d_end - db_g * b_g - dk_g * k_g
    dcp = da_s * a_s
    dw_ = tl.cumsum(dc, 0, reverse=True) + tl.cumsum(dcp, 0, reverse=True) - dcp + dcC[None, :]
    _store_rows(dw + part, dw_, i_b, i_h, t0, T, H, K, C, BK)
