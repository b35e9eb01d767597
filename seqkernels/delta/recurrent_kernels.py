"""The delta-rule family as one fused recurrent Triton kernel, forward and backward.

Every member of the family is a special case of one diagonal-plus-rank-one recurrence over *steps*
``s`` (a token has ``n`` steps: ``n = 1`` except for DeltaProduct), per batch element and head, with
the state ``S (V, K)`` starting at zero:

    S_s = S_{s-1} diag(exp(w_s)) + (S_{s-1} a_s) b_s^T + v_s k_s^T
    o_t = scale * S_{s(t)} q_t          (s(t) = n t + n - 1: the token's last step)

(``w`` absent: no decay). The members map onto it (``triton_ops.py``, which also holds the custom ops):

    delta rule           a = k,  b = -beta k,           v <- beta v,  no w
    gated delta rule     a = k,  b = -beta exp(g) k,    v <- beta v,  w = g on every channel
    Householder product  the n delta steps of a token as n steps, g on the first
    RWKV-7 (DPLR)        as given

The forward runs the steps in a loop with the state tile on chip (one program per batch element, head
and block of ``BV`` value rows: the rows of ``S`` are independent; the step loops' loads are
software-pipelined ``STAGES`` deep) and stores the state entering every
``chunk``-th step (``ckpt (B H, NC, V, K)``, float32). With ``G_s = dL/dS_s`` the backward runs the
steps in reverse:

    G_s      += scale do_t q_t^T                              (on a token's last step)
    dq_t      = scale S_s^T do_t
    dv_s      = G_s k_s,            dk_s = G_s^T v_s
    db_s      = G_s^T (S_{s-1} a_s),  da_s = S_{s-1}^T (G_s b_s),  dw_s = exp(w_s) * colsum(G_s o S_{s-1})
    G_{s-1}   = G_s diag(exp(w_s)) + (G_s b_s) a_s^T

It needs ``S_{s-1}`` in reverse order: per chunk it recomputes the chunk's states from the chunk's
checkpoint into a per-program scratch buffer (``(chunk, BV, K)`` float32, read back in reverse).
The gradients that sum over value rows (``dq, dk, da, db, dw``) are written per block of rows and
summed in torch (a view when one block holds every row). Inputs are read in their dtype (float32,
bfloat16, float16); all arithmetic is float32; outputs in the dtype of ``q``, gradients in their
input's dtype. No host reads: capturable in a CUDA graph.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_step(k, v, a, b, w, row, ok, ov, mk, mv, K: tl.constexpr, V: tl.constexpr, HAS_W: tl.constexpr):
    """The step's ``k, v, a, b`` and ``exp(w)`` (ones without ``w``) as float32 vectors."""
    kk = tl.load(k + row * K + ok, mask=mk, other=0.0).to(tl.float32)
    aa = tl.load(a + row * K + ok, mask=mk, other=0.0).to(tl.float32)
    bb = tl.load(b + row * K + ok, mask=mk, other=0.0).to(tl.float32)
    vv = tl.load(v + row * V + ov, mask=mv, other=0.0).to(tl.float32)
    if HAS_W:
        ew = tl.exp(tl.load(w + row * K + ok, mask=mk, other=0.0).to(tl.float32))
    else:
        ew = tl.full(kk.shape, 1.0, tl.float32)
    return kk, vv, aa, bb, ew


@triton.jit
def _advance(S, kk, vv, aa, bb, ew, HAS_W: tl.constexpr):
    """``S diag(exp(w)) + (S a) b^T + v k^T`` for a ``(BV, BK)`` state tile."""
    Sa = tl.sum(S * aa[None, :], 1)
    if HAS_W:
        S = S * ew[None, :]
    return S + Sa[:, None] * bb[None, :] + vv[:, None] * kk[None, :]


@triton.jit
def delta_recurrent_fwd_kernel(
    q,
    k,
    v,
    a,
    b,
    w,
    o,
    ckpt,
    T,
    H,
    scale,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    NSTEP: tl.constexpr,
    CHUNK: tl.constexpr,
    STAGES: tl.constexpr,
    HAS_W: tl.constexpr,
    SAVE: tl.constexpr,
):
    """Grid ``(cdiv(V, BV), B H)``: one program runs the ``T NSTEP`` steps of one head's ``BV`` rows."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk, mv = ok < K, ov < V
    Ts = T * NSTEP
    NC = tl.cdiv(Ts, CHUNK)
    S = tl.zeros([BV, BK], dtype=tl.float32)
    for c in range(0, NC):
        if SAVE:
            tl.store(ckpt + ((i_bh * NC + c) * V + ov[:, None]) * K + ok[None, :], S, mask=mv[:, None] & mk[None, :])
        for s in tl.range(c * CHUNK, tl.minimum(Ts, c * CHUNK + CHUNK), num_stages=STAGES):
            row = (i_b * Ts + s) * H + i_h
            kk, vv, aa, bb, ew = _load_step(k, v, a, b, w, row, ok, ov, mk, mv, K, V, HAS_W)
            S = _advance(S, kk, vv, aa, bb, ew, HAS_W)
            if (s + 1) % NSTEP == 0:
                tok = (i_b * T + s // NSTEP) * H + i_h
                qq = tl.load(q + tok * K + ok, mask=mk, other=0.0).to(tl.float32)
                oo = tl.sum(S * qq[None, :], 1) * scale
                tl.store(o + tok * V + ov, oo.to(o.dtype.element_ty), mask=mv)


@triton.jit
def delta_recurrent_bwd_kernel(
    q,
    k,
    v,
    a,
    b,
    w,
    ckpt,
    do,
    scratch,
    dq,
    dk,
    dv,
    da,
    db,
    dw,
    B,
    T,
    H,
    scale,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    NSTEP: tl.constexpr,
    CHUNK: tl.constexpr,
    STAGES: tl.constexpr,
    HAS_W: tl.constexpr,
):
    """Grid ``(cdiv(V, BV), B H)``; the steps in reverse, chunk by chunk (module docstring).
    ``dq (NV, B, T, H, K)`` and ``dk, da, db, dw (NV, B, T NSTEP, H, K)`` per block of value rows."""
    i_v = tl.program_id(0)
    NV = tl.num_programs(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk, mv = ok < K, ov < V
    m2 = mv[:, None] & mk[None, :]
    Ts = T * NSTEP
    NC = tl.cdiv(Ts, CHUNK)
    tile = tl.arange(0, BV)[:, None] * BK + ok[None, :]
    scr = scratch + (i_bh * NV + i_v) * (CHUNK * BV * BK)
    part = i_v * B  # leading index of this program's partial sums
    G = tl.zeros([BV, BK], dtype=tl.float32)
    for cc in range(0, NC):
        c = NC - 1 - cc
        s0 = c * CHUNK
        n_c = tl.minimum(CHUNK, Ts - s0)
        S = tl.load(ckpt + ((i_bh * NC + c) * V + ov[:, None]) * K + ok[None, :], mask=m2, other=0.0)
        for j in tl.range(0, n_c, num_stages=STAGES):  # the chunk's states S_{s-1}, in order, into the scratch buffer
            tl.store(scr + j * (BV * BK) + tile, S)
            row = (i_b * Ts + s0 + j) * H + i_h
            kk, vv, aa, bb, ew = _load_step(k, v, a, b, w, row, ok, ov, mk, mv, K, V, HAS_W)
            S = _advance(S, kk, vv, aa, bb, ew, HAS_W)
        tl.debug_barrier()
        for jj in tl.range(0, n_c, num_stages=STAGES):
            j = n_c - 1 - jj
            s = s0 + j
            Sp = tl.load(scr + j * (BV * BK) + tile)
            row = (i_b * Ts + s) * H + i_h
            kk, vv, aa, bb, ew = _load_step(k, v, a, b, w, row, ok, ov, mk, mv, K, V, HAS_W)
            if (s + 1) % NSTEP == 0:
                t = s // NSTEP
                tok = (i_b * T + t) * H + i_h
                qq = tl.load(q + tok * K + ok, mask=mk, other=0.0).to(tl.float32)
                dd = tl.load(do + tok * V + ov, mask=mv, other=0.0).to(tl.float32)
                Ss = _advance(Sp, kk, vv, aa, bb, ew, HAS_W)
                dqt = tl.sum(Ss * dd[:, None], 0) * scale
                tl.store(dq + ((part + i_b) * T + t) * H * K + i_h * K + ok, dqt, mask=mk)
                G += scale * dd[:, None] * qq[None, :]
            prow = ((part + i_b) * Ts + s) * H + i_h
            tl.store(dv + row * V + ov, tl.sum(G * kk[None, :], 1), mask=mv)
            tl.store(dk + prow * K + ok, tl.sum(G * vv[:, None], 0), mask=mk)
            Sa = tl.sum(Sp * aa[None, :], 1)
            tl.store(db + prow * K + ok, tl.sum(G * Sa[:, None], 0), mask=mk)
            Gb = tl.sum(G * bb[None, :], 1)
            tl.store(da + prow * K + ok, tl.sum(Sp * Gb[:, None], 0), mask=mk)
            if HAS_W:
                tl.store(dw + prow * K + ok, tl.sum(G * Sp, 0) * ew, mask=mk)
                G = G * ew[None, :]
            G = G + Gb[:, None] * aa[None, :]
        tl.debug_barrier()
