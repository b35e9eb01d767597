"""TFLA backward kernels (paper 002 App. B.3, C.3; Table 1 work partitioning).

The normalizer of mLSTMexp is differentiated exactly: ``h = num / (max(|d|, exp(-m)) + eps)`` gives
per step ``dnum = dh * inv`` and ``dd = -sign(d) [|d| > exp(-m)] inv (dh . h)`` with
``inv = 1 / (max(|d|, exp(-m)) + eps)``; ``d`` is ``num`` with every value replaced by 1, so in
every kernel the value-side gradient is ``dP = inv * (dh V^T) + dd`` (precomputed per step:
``inv``, ``dd``). mLSTMsig has ``inv = 1``, ``dd = 0`` (``EXP=False``). The max states are constants.

Every ``tl.dot`` takes ``input_precision=PREC``, one value per launch (``triton_ops._precision``:
3-pass TF32 for float32 by default). ``dP`` is a difference of two nearly equal terms when the
normalizer is active (like a softmax gradient), and the gate gradients are reverse cumulative sums
of ``q . dq - k . dk`` (differences of large terms), so single-pass TF32 anywhere in the float32
path shows up as percent-level gate-gradient errors.

* ``inter_chunk_dstates``: reverse recurrence over chunks for the gradients of the states entering
  every chunk (``NC + 1``: entry ``c`` is the gradient w.r.t. the state entering chunk ``c``; the
  last is the incoming gradient of the final state). State on chip across chunks, in float32 (the
  dtype of ``b_ptr``); ``dcst`` may be 16-bit (``MlstmTiles.lp_states``: its readers cast it to the
  input dtype before their dots), so entry 0, the initial state's gradient, also goes to ``dc0_ptr``
  in float32.
* ``intra_chunk_dq`` / ``intra_chunk_dk`` / ``intra_chunk_dv``: parallel over (block of the chunk,
  block of the output's feature dim, batch*head); loop over the other sequence block and the inner
  feature dim. ``dq``/``dk`` also write the row sums ``q . dq`` and ``k . dk`` (per feature block)
  from which the gate gradients follow.
* ``gate_grads``: ``di, df`` from those row sums (a reverse cumulative sum over the sequence), one
  program per batch*head (``triton_ops._gate_grads_torch`` is the PyTorch reference).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def inter_chunk_dstates(
    q_ptr,
    dh_ptr,
    b_ptr,
    g_ptr,
    mtok_ptr,
    inv_ptr,
    dd_ptr,
    mst_ptr,
    dcl_ptr,
    dnl_ptr,
    dcst_ptr,
    dnst_ptr,
    dc0_ptr,
    S,
    NC,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BL: tl.constexpr,
    EXP: tl.constexpr,
    HAS_DLAST: tl.constexpr,
    PREC: tl.constexpr,
):
    pid_k, pid_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # offsets > 2**31
    acc_t = b_ptr.dtype.element_ty
    st_t = dcst_ptr.dtype.element_ty
    offs_k = pid_k * BK + tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_kv = (offs_k[:, None] < DQK) & (offs_v[None, :] < DV)
    c_off = offs_k[:, None] * DV + offs_v[None, :]
    q_ptr += bh * S * DQK
    dh_ptr += bh * S * DV
    b_ptr += bh * NC * L
    mtok_ptr += bh * NC * L
    inv_ptr += bh * NC * L
    dd_ptr += bh * NC * L
    g_ptr += bh * NC
    mst_ptr += bh * (NC + 1)
    dcst_ptr += bh * (NC + 1) * DQK * DV
    dnst_ptr += bh * (NC + 1) * DQK
    first = pid_v == 0
    if HAS_DLAST:
        dC = tl.load(dcl_ptr + bh * DQK * DV + c_off, mask=mask_kv, other=0.0).to(acc_t)
        dn = tl.load(dnl_ptr + bh * DQK + offs_k, mask=offs_k < DQK, other=0.0).to(acc_t)
    else:
        dC = tl.zeros((BK, BV), dtype=acc_t)
        dn = tl.zeros((BK,), dtype=acc_t)
    for cc in range(0, NC):
        c = NC - 1 - cc
        tl.store(dcst_ptr + (c + 1) * DQK * DV + c_off, dC.to(st_t), mask=mask_kv)
        if first:
            tl.store(dnst_ptr + (c + 1) * DQK + offs_k, dn, mask=offs_k < DQK)
        M_c = tl.load(mst_ptr + c)
        if EXP:
            decay = tl.exp(tl.load(g_ptr + c) + M_c - tl.load(mst_ptr + c + 1))
        else:
            decay = tl.exp(tl.load(g_ptr + c))
        dC = dC * decay
        dn = dn * decay
        for l0 in range(0, L, BL):
            pos = c * L + l0 + tl.arange(0, BL)
            qT = tl.load(
                q_ptr + pos[None, :] * DQK + offs_k[:, None],
                mask=(pos[None, :] < S) & (offs_k[:, None] < DQK),
                other=0.0,
            )
            dh = tl.load(
                dh_ptr + pos[:, None] * DV + offs_v[None, :],
                mask=(pos[:, None] < S) & (offs_v[None, :] < DV),
                other=0.0,
            )
            if EXP:
                w = tl.exp(tl.load(b_ptr + pos) + M_c - tl.load(mtok_ptr + pos)) * scale
                qw = qT.to(acc_t) * (w * tl.load(inv_ptr + pos))[None, :]
                dn += tl.sum(qT.to(acc_t) * (w * tl.load(dd_ptr + pos))[None, :], axis=1)
            else:
                w = tl.exp(tl.load(b_ptr + pos)) * scale
                qw = qT.to(acc_t) * w[None, :]
            dC += tl.dot(qw.to(dh.dtype), dh, input_precision=PREC).to(acc_t)
    tl.store(dcst_ptr + c_off, dC.to(st_t), mask=mask_kv)
    tl.store(dc0_ptr + bh * DQK * DV + c_off, dC, mask=mask_kv)
    if first:
        tl.store(dnst_ptr + offs_k, dn, mask=offs_k < DQK)


@triton.jit
def _gate_matrix(b_q, m_q, b_kv, li_kv, row, col, EXP: tl.constexpr):
    """``P[t, j] = exp(b_t - b_j + li_j - m_t)`` for ``j <= t`` (0 above the diagonal), (BLQ, BLKV)."""
    logd = b_q[:, None] - b_kv[None, :] + li_kv[None, :]
    if EXP:
        logd = logd - m_q[:, None]
    return tl.where(row[:, None] >= col[None, :], tl.exp(logd), 0.0)


@triton.jit
def intra_chunk_dq(
    q_ptr,
    k_ptr,
    v_ptr,
    dh_ptr,
    b_ptr,
    li_ptr,
    mtok_ptr,
    inv_ptr,
    dd_ptr,
    cst_ptr,
    nst_ptr,
    mst_ptr,
    dq_ptr,
    qdq_ptr,
    S,
    NC,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLQ: tl.constexpr,
    BLKV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    EXP: tl.constexpr,
    PREC: tl.constexpr,
):
    pid_q, pid_k, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # offsets > 2**31
    NQB: tl.constexpr = L // BLQ
    c = pid_q // NQB
    iq = pid_q % NQB
    acc_t = b_ptr.dtype.element_ty
    q_ptr += bh * S * DQK
    k_ptr += bh * S * DQK
    v_ptr += bh * S * DV
    dh_ptr += bh * S * DV
    tok = bh * NC * L
    row = iq * BLQ + tl.arange(0, BLQ)
    pos_q = c * L + row
    offs_k = pid_k * BK + tl.arange(0, BK)
    mask_q = pos_q < S
    b_q = tl.load(b_ptr + tok + pos_q)
    if EXP:
        m_q = tl.load(mtok_ptr + tok + pos_q)
        inv = tl.load(inv_ptr + tok + pos_q)
        dd = tl.load(dd_ptr + tok + pos_q)
    else:
        m_q = b_q
    acc = tl.zeros((BLQ, BK), dtype=acc_t)
    for j0 in range(0, (iq + 1) * BLQ, BLKV):
        col = j0 + tl.arange(0, BLKV)
        pos_kv = c * L + col
        dp = tl.zeros((BLQ, BLKV), dtype=acc_t)
        for v0 in range(0, DV, BV):
            offs_v = v0 + tl.arange(0, BV)
            dh = tl.load(
                dh_ptr + pos_q[:, None] * DV + offs_v[None, :], mask=mask_q[:, None] & (offs_v[None, :] < DV), other=0.0
            )
            vT = tl.load(
                v_ptr + pos_kv[None, :] * DV + offs_v[:, None],
                mask=(pos_kv[None, :] < S) & (offs_v[:, None] < DV),
                other=0.0,
            )
            dp += tl.dot(dh, vT, input_precision=PREC).to(acc_t)
        if EXP:
            dp = dp * inv[:, None] + dd[:, None]
        p = _gate_matrix(b_q, m_q, tl.load(b_ptr + tok + pos_kv), tl.load(li_ptr + tok + pos_kv), row, col, EXP)
        kk = tl.load(
            k_ptr + pos_kv[:, None] * DQK + offs_k[None, :],
            mask=(pos_kv[:, None] < S) & (offs_k[None, :] < DQK),
            other=0.0,
        )
        acc += tl.dot((dp * p * scale).to(kk.dtype), kk, input_precision=PREC).to(acc_t)
    # inter-chunk part: dq_t += scale * w_t * (C_{c} dnum_t + n_c dd_t)
    M_c = tl.load(mst_ptr + bh * (NC + 1) + c)
    cst_ptr += (bh * (NC + 1) + c) * DQK * DV
    t1 = tl.zeros((BLQ, BK), dtype=acc_t)
    for v0 in range(0, DV, BV):
        offs_v = v0 + tl.arange(0, BV)
        dh = tl.load(
            dh_ptr + pos_q[:, None] * DV + offs_v[None, :], mask=mask_q[:, None] & (offs_v[None, :] < DV), other=0.0
        )
        cT = tl.load(
            cst_ptr + offs_k[None, :] * DV + offs_v[:, None],
            mask=(offs_k[None, :] < DQK) & (offs_v[:, None] < DV),
            other=0.0,
        )
        t1 += tl.dot(dh, cT.to(dh.dtype), input_precision=PREC).to(acc_t)
    if EXP:
        w = tl.exp(b_q + M_c - m_q) * scale
        nn = tl.load(nst_ptr + (bh * (NC + 1) + c) * DQK + offs_k, mask=offs_k < DQK, other=0.0)
        acc += t1 * (w * inv)[:, None] + (w * dd)[:, None] * nn[None, :]
    else:
        acc += t1 * (tl.exp(b_q) * scale)[:, None]
    qq = tl.load(
        q_ptr + pos_q[:, None] * DQK + offs_k[None, :], mask=mask_q[:, None] & (offs_k[None, :] < DQK), other=0.0
    )
    tl.store(
        dq_ptr + bh * S * DQK + pos_q[:, None] * DQK + offs_k[None, :],
        acc.to(dq_ptr.dtype.element_ty),
        mask=mask_q[:, None] & (offs_k[None, :] < DQK),
    )
    tl.store(qdq_ptr + (pid_k * tl.num_programs(2) + bh) * NC * L + pos_q, tl.sum(qq.to(acc_t) * acc, axis=1))


@triton.jit
def _gate_matrix_t(b_q, m_q, b_kv, li_kv, row, col, EXP: tl.constexpr):
    """Transposed gate matrix ``P^T[j, t]`` (BLKV, BLQ)."""
    logd = b_q[None, :] - b_kv[:, None] + li_kv[:, None]
    if EXP:
        logd = logd - m_q[None, :]
    return tl.where(row[None, :] >= col[:, None], tl.exp(logd), 0.0)


@triton.jit
def intra_chunk_dk(
    q_ptr,
    k_ptr,
    v_ptr,
    dh_ptr,
    b_ptr,
    li_ptr,
    a_ptr,
    mtok_ptr,
    inv_ptr,
    dd_ptr,
    dcst_ptr,
    dnst_ptr,
    mst_ptr,
    dk_ptr,
    kdk_ptr,
    S,
    NC,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLQ: tl.constexpr,
    BLKV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    EXP: tl.constexpr,
    PREC: tl.constexpr,
):
    pid_kv, pid_k, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # offsets > 2**31
    NKB: tl.constexpr = L // BLKV
    c = pid_kv // NKB
    ik = pid_kv % NKB
    acc_t = b_ptr.dtype.element_ty
    q_ptr += bh * S * DQK
    k_ptr += bh * S * DQK
    v_ptr += bh * S * DV
    dh_ptr += bh * S * DV
    tok = bh * NC * L
    col = ik * BLKV + tl.arange(0, BLKV)
    pos_kv = c * L + col
    mask_kv = pos_kv < S
    offs_k = pid_k * BK + tl.arange(0, BK)
    b_kv = tl.load(b_ptr + tok + pos_kv)
    li_kv = tl.load(li_ptr + tok + pos_kv)
    acc = tl.zeros((BLKV, BK), dtype=acc_t)
    for i0 in range((ik * BLKV) // BLQ * BLQ, L, BLQ):
        row = i0 + tl.arange(0, BLQ)
        pos_q = c * L + row
        dpT = tl.zeros((BLKV, BLQ), dtype=acc_t)
        for v0 in range(0, DV, BV):
            offs_v = v0 + tl.arange(0, BV)
            vv = tl.load(
                v_ptr + pos_kv[:, None] * DV + offs_v[None, :],
                mask=mask_kv[:, None] & (offs_v[None, :] < DV),
                other=0.0,
            )
            dhT = tl.load(
                dh_ptr + pos_q[None, :] * DV + offs_v[:, None],
                mask=(pos_q[None, :] < S) & (offs_v[:, None] < DV),
                other=0.0,
            )
            dpT += tl.dot(vv, dhT, input_precision=PREC).to(acc_t)
        b_q = tl.load(b_ptr + tok + pos_q)
        if EXP:
            m_q = tl.load(mtok_ptr + tok + pos_q)
            dpT = dpT * tl.load(inv_ptr + tok + pos_q)[None, :] + tl.load(dd_ptr + tok + pos_q)[None, :]
        else:
            m_q = b_q
        pT = _gate_matrix_t(b_q, m_q, b_kv, li_kv, row, col, EXP)
        qq = tl.load(
            q_ptr + pos_q[:, None] * DQK + offs_k[None, :],
            mask=(pos_q[:, None] < S) & (offs_k[None, :] < DQK),
            other=0.0,
        )
        acc += tl.dot((dpT * pT * scale).to(qq.dtype), qq, input_precision=PREC).to(acc_t)
    # inter-chunk part through the state leaving chunk c: dk_j += w_j (dC v_j + dn)
    M_next = tl.load(mst_ptr + bh * (NC + 1) + c + 1)
    dcst_ptr += (bh * (NC + 1) + c + 1) * DQK * DV
    t1 = tl.zeros((BLKV, BK), dtype=acc_t)
    for v0 in range(0, DV, BV):
        offs_v = v0 + tl.arange(0, BV)
        vv = tl.load(
            v_ptr + pos_kv[:, None] * DV + offs_v[None, :], mask=mask_kv[:, None] & (offs_v[None, :] < DV), other=0.0
        )
        dcT = tl.load(
            dcst_ptr + offs_k[None, :] * DV + offs_v[:, None],
            mask=(offs_k[None, :] < DQK) & (offs_v[:, None] < DV),
            other=0.0,
        )
        t1 += tl.dot(vv, dcT.to(vv.dtype), input_precision=PREC).to(acc_t)
    a_kv = tl.load(a_ptr + tok + pos_kv)
    if EXP:
        w = tl.exp(a_kv - M_next)
        dn = tl.load(dnst_ptr + (bh * (NC + 1) + c + 1) * DQK + offs_k, mask=offs_k < DQK, other=0.0)
        acc += w[:, None] * (t1 + dn[None, :])
    else:
        acc += tl.exp(a_kv)[:, None] * t1
    kk = tl.load(
        k_ptr + pos_kv[:, None] * DQK + offs_k[None, :], mask=mask_kv[:, None] & (offs_k[None, :] < DQK), other=0.0
    )
    tl.store(
        dk_ptr + bh * S * DQK + pos_kv[:, None] * DQK + offs_k[None, :],
        acc.to(dk_ptr.dtype.element_ty),
        mask=mask_kv[:, None] & (offs_k[None, :] < DQK),
    )
    tl.store(kdk_ptr + (pid_k * tl.num_programs(2) + bh) * NC * L + pos_kv, tl.sum(kk.to(acc_t) * acc, axis=1))


@triton.jit
def intra_chunk_dv(
    q_ptr,
    k_ptr,
    dh_ptr,
    b_ptr,
    li_ptr,
    a_ptr,
    mtok_ptr,
    inv_ptr,
    dcst_ptr,
    mst_ptr,
    dv_ptr,
    S,
    NC,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLQ: tl.constexpr,
    BLKV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    EXP: tl.constexpr,
    PREC: tl.constexpr,
):
    pid_kv, pid_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # offsets > 2**31
    NKB: tl.constexpr = L // BLKV
    c = pid_kv // NKB
    ik = pid_kv % NKB
    acc_t = b_ptr.dtype.element_ty
    q_ptr += bh * S * DQK
    k_ptr += bh * S * DQK
    dh_ptr += bh * S * DV
    tok = bh * NC * L
    col = ik * BLKV + tl.arange(0, BLKV)
    pos_kv = c * L + col
    mask_kv = pos_kv < S
    offs_v = pid_v * BV + tl.arange(0, BV)
    b_kv = tl.load(b_ptr + tok + pos_kv)
    li_kv = tl.load(li_ptr + tok + pos_kv)
    acc = tl.zeros((BLKV, BV), dtype=acc_t)
    for i0 in range((ik * BLKV) // BLQ * BLQ, L, BLQ):
        row = i0 + tl.arange(0, BLQ)
        pos_q = c * L + row
        sT = tl.zeros((BLKV, BLQ), dtype=acc_t)
        for d0 in range(0, DQK, BK):
            offs_d = d0 + tl.arange(0, BK)
            kk = tl.load(
                k_ptr + pos_kv[:, None] * DQK + offs_d[None, :],
                mask=mask_kv[:, None] & (offs_d[None, :] < DQK),
                other=0.0,
            )
            qT = tl.load(
                q_ptr + pos_q[None, :] * DQK + offs_d[:, None],
                mask=(pos_q[None, :] < S) & (offs_d[:, None] < DQK),
                other=0.0,
            )
            sT += tl.dot(kk, qT, input_precision=PREC).to(acc_t)
        b_q = tl.load(b_ptr + tok + pos_q)
        dh = tl.load(
            dh_ptr + pos_q[:, None] * DV + offs_v[None, :],
            mask=(pos_q[:, None] < S) & (offs_v[None, :] < DV),
            other=0.0,
        )
        if EXP:
            m_q = tl.load(mtok_ptr + tok + pos_q)
            dh = (dh.to(acc_t) * tl.load(inv_ptr + tok + pos_q)[:, None]).to(dh.dtype)
        else:
            m_q = b_q
        pT = _gate_matrix_t(b_q, m_q, b_kv, li_kv, row, col, EXP)
        acc += tl.dot((sT * pT * scale).to(dh.dtype), dh, input_precision=PREC).to(acc_t)
    # inter-chunk part: dv_j += w_j dC^T k_j
    M_next = tl.load(mst_ptr + bh * (NC + 1) + c + 1)
    dcst_ptr += (bh * (NC + 1) + c + 1) * DQK * DV
    t1 = tl.zeros((BLKV, BV), dtype=acc_t)
    for d0 in range(0, DQK, BK):
        offs_d = d0 + tl.arange(0, BK)
        kk = tl.load(
            k_ptr + pos_kv[:, None] * DQK + offs_d[None, :], mask=mask_kv[:, None] & (offs_d[None, :] < DQK), other=0.0
        )
        dc = tl.load(
            dcst_ptr + offs_d[:, None] * DV + offs_v[None, :],
            mask=(offs_d[:, None] < DQK) & (offs_v[None, :] < DV),
            other=0.0,
        )
        t1 += tl.dot(kk, dc.to(kk.dtype), input_precision=PREC).to(acc_t)
    a_kv = tl.load(a_ptr + tok + pos_kv)
    if EXP:
        acc += tl.exp(a_kv - M_next)[:, None] * t1
    else:
        acc += tl.exp(a_kv)[:, None] * t1
    tl.store(
        dv_ptr + bh * S * DV + pos_kv[:, None] * DV + offs_v[None, :],
        acc.to(dv_ptr.dtype.element_ty),
        mask=mask_kv[:, None] & (offs_v[None, :] < DV),
    )


@triton.jit
def gate_grads(
    qdq_ptr,
    kdk_ptr,
    i_ptr,
    f_ptr,
    dlast_ptr,
    di_ptr,
    df_ptr,
    S,
    NCL,
    NKB: tl.constexpr,
    BS: tl.constexpr,
    EXP: tl.constexpr,
    HAS_DLAST: tl.constexpr,
):
    """``di, df`` of head ``program_id(0)`` (``(B*NH, S)``, the pre-activations' dtype) from the row
    sums ``qdq, kdk`` (``(NKB, B*NH, NCL)``, float32, summed over the ``NKB`` feature blocks):
    ``d log f_t = sum_{s >= t} (q.dq - k.dk)_s + dlast``, ``df = d log f * sigmoid(-f)``,
    ``di = k.dk`` (mLSTMexp) or ``k.dk * sigmoid(-i)`` (mLSTMsig). ``dlast`` (``B*NH``): the
    final-state term ``<C_last, dC_last> + <n_last, dn_last>``. Blocks of ``BS`` steps, last first."""
    bh = tl.program_id(0).to(tl.int64)
    acc_t = qdq_ptr.dtype.element_ty
    if HAS_DLAST:
        carry = tl.load(dlast_ptr + bh).to(acc_t)
    else:
        carry = tl.sum(tl.zeros((BS,), dtype=acc_t), axis=0)
    nblk = tl.cdiv(S, BS)
    for blk in range(0, nblk):
        pos = (nblk - 1 - blk) * BS + tl.arange(0, BS)
        ok = pos < S
        qdq = tl.zeros((BS,), dtype=acc_t)
        kdk = tl.zeros((BS,), dtype=acc_t)
        for kb in range(NKB):
            qdq += tl.load(qdq_ptr + (kb * tl.num_programs(0) + bh) * NCL + pos, mask=ok, other=0.0)
            kdk += tl.load(kdk_ptr + (kb * tl.num_programs(0) + bh) * NCL + pos, mask=ok, other=0.0)
        d = qdq - kdk
        dlogf = tl.flip(tl.cumsum(tl.flip(d, 0), axis=0), 0) + carry
        carry += tl.sum(d, axis=0)
        f = tl.load(f_ptr + bh * S + pos, mask=ok, other=0.0).to(acc_t)
        tl.store(df_ptr + bh * S + pos, (dlogf * tl.sigmoid(-f)).to(df_ptr.dtype.element_ty), mask=ok)
        if EXP:
            di = kdk
        else:
            di = kdk * tl.sigmoid(-tl.load(i_ptr + bh * S + pos, mask=ok, other=0.0).to(acc_t))
        tl.store(di_ptr + bh * S + pos, di.to(di_ptr.dtype.element_ty), mask=ok)
