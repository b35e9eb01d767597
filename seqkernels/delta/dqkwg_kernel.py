"""fla's gated ``chunk_bwd_dqkwg`` as one Triton kernel: the equations of ``fla_gated_bwd.py``, one program
per chunk of ``BT`` positions and value head, the value columns in blocks of ``BV``.

Per program, with ``ds = tril(do v^T o 2^(g_i - g_j)) scale`` and its transpose formed from the loaded
tiles (``v do^T``, never a transpose of a product: the transposed product of an MMA result is what Triton
3.4-3.7.0 miscompiles on Hopper, fla issue #640):

    dq = scale 2^g (do h^T) + ds k,         dk = 2^(g_last - g) (v dh^T) + ds^T q,        dw = -(dv h^T)
    dg = rowsum(dq q) - rowsum(dk k) + [last position] (2^g_last <h, dh> + sum rowsum(2^(g_last - g) (v dh^T) k))

Products take the inputs' dtype (``ds`` rounded to it, as fla does) with float32 accumulation.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dqkwg_kernel(
    q,
    k,
    v,
    do,
    h,
    dh,
    w,
    dv,
    g,
    dq,
    dk,
    dw,
    dg,
    T,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_W: tl.constexpr,
    STATE_V_FIRST: tl.constexpr,
):
    """Grid ``(NT, B HV)``. q, k ``(B, T, H, K)``; v, do, dv ``(B, T, HV, V)``; w ``(B, T, HV, K)``; g ``(B,
    T, HV)`` float32; h, dh ``(B NT, HV, K, V)`` (``(.., V, K)`` with ``STATE_V_FIRST``). Writes dq, dk
    ``(B, T, HV, K)`` float32 (per value head), dw like w, dg ``(B, T, HV)`` float32."""
    i_t = tl.program_id(0)
    i_bhv = tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bhv // HV, i_bhv % HV
    i_h = i_hv // (HV // H)
    NT = tl.cdiv(T, BT)
    r = tl.arange(0, BT)
    t = i_t * BT + r
    valid = t < T
    ck = tl.arange(0, BK)
    kmask = valid[:, None] & (ck[None, :] < K)
    qk_off = ((i_b * T + t[:, None]) * H + i_h) * K + ck[None, :]
    b_q = tl.load(q + qk_off, mask=kmask, other=0.0)
    b_k = tl.load(k + qk_off, mask=kmask, other=0.0)
    b_g = tl.load(g + (i_b * T + t) * HV + i_hv, mask=valid, other=0.0).to(tl.float32)
    last = tl.minimum(T - i_t * BT, BT) - 1
    g_last = tl.sum(tl.where(r == last, b_g, 0.0), 0)

    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)
    b_dsT = tl.zeros([BT, BT], dtype=tl.float32)
    hdh = tl.sum(tl.zeros([BV], dtype=tl.float32), 0)  # <h, dh>, a float32 scalar carried through the loop
    state = ((i_b * NT + i_t) * HV + i_hv) * K * V
    for v0 in range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        vmask = valid[:, None] & (cv[None, :] < V)
        vo_off = ((i_b * T + t[:, None]) * HV + i_hv) * V + cv[None, :]
        b_v = tl.load(v + vo_off, mask=vmask, other=0.0)
        b_do = tl.load(do + vo_off, mask=vmask, other=0.0)
        smask = (ck[:, None] < K) & (cv[None, :] < V)
        if STATE_V_FIRST:
            s_off = state + cv[None, :] * K + ck[:, None]
        else:
            s_off = state + ck[:, None] * V + cv[None, :]
        b_h = tl.load(h + s_off, mask=smask, other=0.0)  # (BK, BV)
        b_dh = tl.load(dh + s_off, mask=smask, other=0.0)
        b_dq = tl.dot(b_do, tl.trans(b_h).to(b_do.dtype), b_dq)
        b_dk = tl.dot(b_v, tl.trans(b_dh).to(b_v.dtype), b_dk)
        b_ds = tl.dot(b_do, tl.trans(b_v), b_ds)
        b_dsT = tl.dot(b_v, tl.trans(b_do), b_dsT)
        hdh += tl.sum(tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1), 0)
        if HAS_W:
            b_dv = tl.load(dv + vo_off, mask=vmask, other=0.0)
            b_dw = tl.dot(b_dv, tl.trans(b_h).to(b_dv.dtype), b_dw)

    b_dq = b_dq * (tl.exp2(b_g) * scale)[:, None]
    b_dk = b_dk * tl.where(valid, tl.exp2(g_last - b_g), 0.0)[:, None]
    dg_last = hdh * tl.exp2(g_last) + tl.sum(tl.sum(b_dk * b_k.to(tl.float32), 1), 0)

    both = valid[:, None] & valid[None, :]
    diff = tl.where(both & (r[:, None] >= r[None, :]), b_g[:, None] - b_g[None, :], float("-inf"))
    b_ds = b_ds * tl.exp2(diff) * scale  # i >= j
    diffT = tl.where(both & (r[:, None] <= r[None, :]), b_g[None, :] - b_g[:, None], float("-inf"))
    b_dsT = b_dsT * tl.exp2(diffT) * scale  # (ds^T)_ij = ds_ji, i <= j
    b_dq = tl.dot(b_ds.to(b_k.dtype), b_k, b_dq)
    b_dk = tl.dot(b_dsT.to(b_q.dtype), b_q, b_dk)

    b_dg = tl.sum(b_dq * b_q.to(tl.float32), 1) - tl.sum(b_dk * b_k.to(tl.float32), 1)
    b_dg += tl.where(r == last, dg_last, 0.0)
    out_off = ((i_b * T + t[:, None]) * HV + i_hv) * K + ck[None, :]
    tl.store(dq + out_off, b_dq, mask=kmask)
    tl.store(dk + out_off, b_dk, mask=kmask)
    tl.store(dg + (i_b * T + t) * HV + i_hv, b_dg, mask=valid)
    if HAS_W:
        tl.store(dw + out_off, (-b_dw).to(dw.dtype.element_ty), mask=kmask)
