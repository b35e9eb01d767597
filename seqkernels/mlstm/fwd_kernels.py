"""TFLA forward kernels (paper 002 §3.2, App. C.1-C.2) for mLSTMexp (``EXP=True``) and mLSTMsig.

Per (batch, head) the sequence is split into ``NC`` chunks of ``L`` steps (padded to ``NC * L``; the
padded steps have log forget gate 0 and log input gate -inf, i.e. they change nothing). Gate vectors
(float32, or float64 for float64 inputs) are precomputed per chunk: ``b`` (in-chunk cumulative log
forget gate), ``li`` (log input gate), ``a = g - b + li`` and ``g`` (chunk total), ``amax = max(a)``.

* ``chunk_gates``: the gate vectors above from the pre-activations, one program per (chunk,
  batch*head) (one launch instead of a dozen small PyTorch ops; ``triton_ops._gates`` is the
  PyTorch reference).
* ``inter_chunk_states``: the recurrent kernel (first level of sequence parallelism). One program per
  (DQK block, DV block, batch*head) runs over the chunks and writes the state entering every chunk
  (``NC + 1`` states: the last one is the final state). ``FUSED=True`` keeps the state on chip
  across chunks (paper 004); ``FUSED=False`` is the per-chunk loop: one launch per chunk that reads
  the previous state back from memory. Both run the same update and give bit-identical states. The
  state is carried in float32 (``clast_ptr``'s dtype, float64 under float64); the materialized
  states ``cst`` may be stored in the 16-bit input dtype (``MlstmTiles.lp_states``): every reader
  casts them to that dtype before its dot anyway, so h and the gradients do not change, and the
  dominant HBM traffic (``NC + 1`` states of ``DQK x DV``) halves. The final state is also written
  in float32 to ``clast_ptr``. mLSTMsig has no normalizer: ``n`` is not accumulated (stays ``n0``).
* ``intra_chunk_h``: the parallel kernel (second level). One program per (query block of a chunk,
  DV block, batch*head) loops over key/value blocks of the chunk (online max-state rescaling for
  mLSTMexp, Alg. 1), then adds the inter-chunk part from the chunk's entering state (eq. 99-100).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _logsigmoid(x):
    """``log sigmoid(x) = min(x, 0) - log1p(exp(-|x|))`` with an accurate log1p."""
    z = tl.exp(-tl.abs(x))
    u = 1.0 + z
    log1p = tl.where(u == 1.0, z, tl.log(u) * (z / (u - 1.0)))
    return tl.minimum(x, 0.0) - log1p


@triton.jit
def chunk_gates(i_ptr, f_ptr, b_ptr, li_ptr, a_ptr, g_ptr, amax_ptr, S, NC, L: tl.constexpr, EXP: tl.constexpr):
    """Gate vectors of chunk ``program_id(0)`` of head ``program_id(1)``: ``b, li, a`` (``NC * L`` per
    head; padded steps: log f = 0, log i = -inf), ``g`` and ``amax`` (``NC`` per head), in the dtype of
    ``b_ptr``. Pre-activations ``i, f`` are ``(B*NH, S)`` in the input dtype."""
    c, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    acc_t = b_ptr.dtype.element_ty
    pos = c * L + tl.arange(0, L)
    ok = pos < S
    ip = tl.load(i_ptr + bh * S + pos, mask=ok, other=0.0).to(acc_t)
    fp = tl.load(f_ptr + bh * S + pos, mask=ok, other=0.0).to(acc_t)
    lf = tl.where(ok, _logsigmoid(fp), 0.0)
    if EXP:
        li = tl.where(ok, ip, float("-inf"))
    else:
        li = tl.where(ok, _logsigmoid(ip), float("-inf"))
    b = tl.cumsum(lf, axis=0)
    g = tl.sum(lf, axis=0)
    a = g - b + li
    tok = bh * NC * L + pos
    tl.store(b_ptr + tok, b)
    tl.store(li_ptr + tok, li)
    tl.store(a_ptr + tok, a)
    tl.store(g_ptr + bh * NC + c, g)
    tl.store(amax_ptr + bh * NC + c, tl.max(a, axis=0))


@triton.jit
def _state_update(
    C,
    n,
    M,
    k_ptr,
    v_ptr,
    a_ptr,
    g_ptr,
    amax_ptr,
    c,
    offs_k,
    offs_v,
    S,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BL: tl.constexpr,
    EXP: tl.constexpr,
    PREC: tl.constexpr,
):
    """State entering chunk ``c`` -> state entering chunk ``c + 1`` (eq. 12-13 with max state)."""
    g = tl.load(g_ptr + c)
    if EXP:
        M_new = tl.maximum(g + M, tl.load(amax_ptr + c))
    else:
        M_new = M
    decay = tl.exp(g + M - M_new)
    C = C * decay
    n = n * decay
    for l0 in range(0, L, BL):
        pos = c * L + l0 + tl.arange(0, BL)
        kT = tl.load(
            k_ptr + pos[None, :] * DQK + offs_k[:, None], mask=(pos[None, :] < S) & (offs_k[:, None] < DQK), other=0.0
        )
        vv = tl.load(
            v_ptr + pos[:, None] * DV + offs_v[None, :], mask=(pos[:, None] < S) & (offs_v[None, :] < DV), other=0.0
        )
        w = tl.exp(tl.load(a_ptr + pos) - M_new)
        kw = kT.to(C.dtype) * w[None, :]
        C += tl.dot(kw.to(vv.dtype), vv, input_precision=PREC).to(C.dtype)
        if EXP:
            n += tl.sum(kw, axis=1)
    return C, n, M_new


@triton.jit
def inter_chunk_states(
    k_ptr,
    v_ptr,
    a_ptr,
    g_ptr,
    amax_ptr,
    c0_ptr,
    n0_ptr,
    m0_ptr,
    cst_ptr,
    nst_ptr,
    mst_ptr,
    clast_ptr,
    S,
    NC,
    chunk,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BL: tl.constexpr,
    EXP: tl.constexpr,
    HAS_INIT: tl.constexpr,
    FUSED: tl.constexpr,
    PREC: tl.constexpr,
):
    pid_k, pid_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # offsets > 2**31
    acc_t = clast_ptr.dtype.element_ty
    st_t = cst_ptr.dtype.element_ty
    offs_k = pid_k * BK + tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_kv = (offs_k[:, None] < DQK) & (offs_v[None, :] < DV)
    k_ptr += bh * S * DQK
    v_ptr += bh * S * DV
    a_ptr += bh * NC * L
    g_ptr += bh * NC
    amax_ptr += bh * NC
    cst_ptr += bh * (NC + 1) * DQK * DV
    nst_ptr += bh * (NC + 1) * DQK
    mst_ptr += bh * (NC + 1)
    c_off = offs_k[:, None] * DV + offs_v[None, :]
    first = pid_v == 0
    if FUSED:
        if HAS_INIT:
            C = tl.load(c0_ptr + bh * DQK * DV + c_off, mask=mask_kv, other=0.0).to(acc_t)
            n = tl.load(n0_ptr + bh * DQK + offs_k, mask=offs_k < DQK, other=0.0).to(acc_t)
        else:
            C = tl.zeros((BK, BV), dtype=acc_t)
            n = tl.zeros((BK,), dtype=acc_t)
        M = tl.load(m0_ptr + bh).to(acc_t)  # always given (zeros without a state)
        for c in range(0, NC):
            tl.store(cst_ptr + c * DQK * DV + c_off, C.to(st_t), mask=mask_kv)
            if first:
                tl.store(nst_ptr + c * DQK + offs_k, n, mask=offs_k < DQK)
                if pid_k == 0:
                    tl.store(mst_ptr + c, M)
            C, n, M = _state_update(
                C, n, M, k_ptr, v_ptr, a_ptr, g_ptr, amax_ptr, c, offs_k, offs_v, S, DQK, DV, L, BL, EXP, PREC
            )
        c_out = NC
    else:  # one chunk per launch: the state goes through memory (float32 storage, see the caller)
        C = tl.load(cst_ptr + chunk * DQK * DV + c_off, mask=mask_kv, other=0.0).to(acc_t)
        n = tl.load(nst_ptr + chunk * DQK + offs_k, mask=offs_k < DQK, other=0.0)
        M = tl.load(mst_ptr + chunk)
        C, n, M = _state_update(
            C, n, M, k_ptr, v_ptr, a_ptr, g_ptr, amax_ptr, chunk, offs_k, offs_v, S, DQK, DV, L, BL, EXP, PREC
        )
        c_out = chunk + 1
    tl.store(cst_ptr + c_out * DQK * DV + c_off, C.to(st_t), mask=mask_kv)
    if c_out == NC:
        tl.store(clast_ptr + bh * DQK * DV + c_off, C, mask=mask_kv)
    if first:
        tl.store(nst_ptr + c_out * DQK + offs_k, n, mask=offs_k < DQK)
        if pid_k == 0:
            tl.store(mst_ptr + c_out, M)


@triton.jit
def intra_chunk_h(
    q_ptr,
    k_ptr,
    v_ptr,
    b_ptr,
    li_ptr,
    cst_ptr,
    nst_ptr,
    mst_ptr,
    h_ptr,
    mtok_ptr,
    dtok_ptr,
    S,
    NC,
    scale,
    eps,
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
    pid_q, pid_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # offsets > 2**31
    NQB: tl.constexpr = L // BLQ
    c = pid_q // NQB
    iq = pid_q % NQB
    acc_t = b_ptr.dtype.element_ty  # float32 (float64 for float64 inputs); cst may be 16-bit
    q_ptr += bh * S * DQK
    k_ptr += bh * S * DQK
    v_ptr += bh * S * DV
    b_ptr += bh * NC * L
    li_ptr += bh * NC * L
    row = iq * BLQ + tl.arange(0, BLQ)  # position in the chunk
    pos_q = c * L + row
    offs_v = pid_v * BV + tl.arange(0, BV)
    b_q = tl.load(b_ptr + pos_q)
    m_run = tl.full((BLQ,), -1e30, dtype=acc_t)  # finite "-inf": exp(m_old - m_new) is never NaN
    den = tl.zeros((BLQ,), dtype=acc_t)
    acc = tl.zeros((BLQ, BV), dtype=acc_t)
    # intra-chunk part, tiled along the chunk (eq. 93-98)
    for j0 in range(0, (iq + 1) * BLQ, BLKV):
        col = j0 + tl.arange(0, BLKV)
        pos_kv = c * L + col
        s = tl.zeros((BLQ, BLKV), dtype=acc_t)
        for d0 in range(0, DQK, BK):
            offs_d = d0 + tl.arange(0, BK)
            qq = tl.load(
                q_ptr + pos_q[:, None] * DQK + offs_d[None, :],
                mask=(pos_q[:, None] < S) & (offs_d[None, :] < DQK),
                other=0.0,
            )
            kT = tl.load(
                k_ptr + pos_kv[None, :] * DQK + offs_d[:, None],
                mask=(pos_kv[None, :] < S) & (offs_d[:, None] < DQK),
                other=0.0,
            )
            s += tl.dot(qq, kT, input_precision=PREC).to(acc_t)
        logd = b_q[:, None] - tl.load(b_ptr + pos_kv)[None, :] + tl.load(li_ptr + pos_kv)[None, :]
        logd = tl.where(row[:, None] >= col[None, :], logd, float("-inf"))
        if EXP:
            m_new = tl.maximum(m_run, tl.max(logd, axis=1))
            alpha = tl.exp(m_run - m_new)
            acc = acc * alpha[:, None]
            den = den * alpha
            m_run = m_new
            p = s * scale * tl.exp(logd - m_new[:, None])
            den += tl.sum(p, axis=1)
        else:
            p = s * scale * tl.exp(logd)
        vv = tl.load(
            v_ptr + pos_kv[:, None] * DV + offs_v[None, :],
            mask=(pos_kv[:, None] < S) & (offs_v[None, :] < DV),
            other=0.0,
        )
        acc += tl.dot(p.to(vv.dtype), vv, input_precision=PREC).to(acc_t)
    # inter-chunk part from the state entering chunk c (eq. 17, 99-100)
    M_prev = tl.load(mst_ptr + bh * (NC + 1) + c)
    if EXP:
        m_comb = tl.maximum(b_q + M_prev, m_run)
        w_inter = tl.exp(b_q + M_prev - m_comb) * scale
        w_intra = tl.exp(m_run - m_comb)
    else:
        w_inter = tl.exp(b_q) * scale
    cst_ptr += (bh * (NC + 1) + c) * DQK * DV
    nst_ptr += (bh * (NC + 1) + c) * DQK
    hin = tl.zeros((BLQ, BV), dtype=acc_t)
    nin = tl.zeros((BLQ,), dtype=acc_t)
    for d0 in range(0, DQK, BK):
        offs_d = d0 + tl.arange(0, BK)
        qq = tl.load(
            q_ptr + pos_q[:, None] * DQK + offs_d[None, :],
            mask=(pos_q[:, None] < S) & (offs_d[None, :] < DQK),
            other=0.0,
        )
        cc = tl.load(
            cst_ptr + offs_d[:, None] * DV + offs_v[None, :],
            mask=(offs_d[:, None] < DQK) & (offs_v[None, :] < DV),
            other=0.0,
        )
        hin += tl.dot(qq, cc.to(qq.dtype), input_precision=PREC).to(acc_t)
        if EXP:
            nn = tl.load(nst_ptr + offs_d, mask=offs_d < DQK, other=0.0)
            nin += tl.sum(qq.to(acc_t) * nn[None, :], axis=1)
    if EXP:
        num = acc * w_intra[:, None] + hin * w_inter[:, None]
        dot = den * w_intra + nin * w_inter
        h = num / (tl.maximum(tl.abs(dot), tl.exp(-m_comb)) + eps)[:, None]
        if pid_v == 0:
            tl.store(mtok_ptr + bh * NC * L + pos_q, m_comb)
            tl.store(dtok_ptr + bh * NC * L + pos_q, dot)
    else:
        h = acc + hin * w_inter[:, None]
    h_ptr += bh * S * DV
    tl.store(
        h_ptr + pos_q[:, None] * DV + offs_v[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=(pos_q[:, None] < S) & (offs_v[None, :] < DV),
    )
