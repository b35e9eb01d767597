"""Triton persistent kernels of the fused backend (paper 001 §5.2-5.3, App. E, Alg. 5).

One program per (head, batch block): the time loop runs inside the kernel, the head's recurrent
matrices R_g (DH x DH per gate) and biases are loaded once and stay on chip, and each step fuses
the recurrent matmul with the pointwise cell. The backward walks time in reverse with R_g^T on
chip; it writes the gate gradients (= input and bias gradients, eq. 5-6) and, with ``ACC_DR`` /
``ACC_DB``, accumulates dR (eq. 7) / db in registers (one partial sum per batch block).

Layouts (all contiguous; DHP = DH padded to a power of two >= 16, masked):
    WX (B, T, NH, GX, DH)   R (NH, DH, GR, DH)   RT (NH, GR, DH, DH) = R transposed (backward)
    BIAS (NH, GB, DH)       S0 / LAST (NS, B, NH, DH)
    H (B, T, NH, DH)        SAVED (B, T + 1, NH, NSAVE, DH) float32 (row 0: initial states)
    DY (B, T, NH, DH)       DLAST (NS, B, NH, DH)     DG (B, T, NH, GB, DH) gate gradients
    DS0 (NS, B, NH, DH)     DR_PART (NBB, NH, DH, GR, DH)   DB_PART (NBB, NH, GB, DH) float32
"""

from __future__ import annotations

import triton
import triton.language as tl

from seqkernels.fused_rnn.cell_kernels import (
    ELMAN,
    GRU,
    LSTM,
    SLSTM,
    elman_bwd,
    elman_fwd,
    gru_bwd,
    gru_fwd,
    lstm_bwd,
    lstm_fwd,
    slstm_bwd,
    slstm_fwd,
)


@triton.jit
def _load_r(R, pid_h, g, rd, DH, GR: tl.constexpr):
    """R_g of head ``pid_h`` as a (DHP, DHP) tile, zero-padded: tile[i, j] = R[h, i, g, j]."""
    md = rd < DH
    off = ((pid_h * DH + rd[:, None]) * GR + g) * DH + rd[None, :]
    return tl.load(R + off, mask=md[:, None] & md[None, :], other=0.0)


@triton.jit
def _tile(PTR, row, col, mask, ACC: tl.constexpr):
    return tl.load(PTR + row[:, None] + col[None, :], mask=mask, other=0.0).to(ACC)


@triton.jit
def _put(PTR, row, col, mask, value):
    tl.store(PTR + row[:, None] + col[None, :], value.to(PTR.dtype.element_ty), mask=mask)


@triton.jit
def _rdot(hd, hl, Rg, PREC: tl.constexpr, SPLIT_H: tl.constexpr):
    """``h R_g`` with h as ``hd`` (rounded to the storage dtype), plus ``hl`` (the rounding error,
    rounded again) where ``SPLIT_H``: two tensor-core dots give h to ~16 mantissa bits."""
    y = tl.dot(hd, Rg, input_precision=PREC)
    if SPLIT_H:
        y = tl.dot(hl, Rg, y, input_precision=PREC)
    return y


@triton.jit
def fused_fwd_kernel(
    WX, R, BIAS, S0, H, LAST, SAVED,
    B, T, NH, DH,
    CELL: tl.constexpr, GX: tl.constexpr, GR: tl.constexpr, GB: tl.constexpr, NS: tl.constexpr,
    NSAVE: tl.constexpr, SAVE: tl.constexpr,
    BLOCK_B: tl.constexpr, DHP: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr,
    SPLIT_H: tl.constexpr, FULL_H: tl.constexpr,
):  # fmt: skip
    pid_h = tl.program_id(0)
    rb = (tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)).to(tl.int64)
    rd = tl.arange(0, DHP)
    md = rd < DH
    m2 = (rb < B)[:, None] & md[None, :]

    # recurrent matrices and biases: loaded once, kept on chip for the whole time loop
    R0 = _load_r(R, pid_h, 0, rd, DH, GR)
    R1 = R0
    R2 = R0
    R3 = R0
    if GR > 1:
        R1 = _load_r(R, pid_h, 1, rd, DH, GR)
        R2 = _load_r(R, pid_h, 2, rd, DH, GR)
    if GR > 3:
        R3 = _load_r(R, pid_h, 3, rd, DH, GR)
    if UPCAST:  # the CPU interpreter's bfloat16 tl.dot is wrong: multiply the same values in float32
        R0 = R0.to(tl.float32)
        R1 = R1.to(tl.float32)
        R2 = R2.to(tl.float32)
        R3 = R3.to(tl.float32)
    b0 = tl.load(BIAS + pid_h * GB * DH + rd, mask=md, other=0.0).to(ACC)[None, :]
    b1 = b0
    b2 = b0
    b3 = b0
    if GB > 1:
        b1 = tl.load(BIAS + pid_h * GB * DH + DH + rd, mask=md, other=0.0).to(ACC)[None, :]
        b2 = tl.load(BIAS + pid_h * GB * DH + 2 * DH + rd, mask=md, other=0.0).to(ACC)[None, :]
        b3 = tl.load(BIAS + pid_h * GB * DH + 3 * DH + rd, mask=md, other=0.0).to(ACC)[None, :]

    # initial states
    s_row = (rb * NH + pid_h) * DH
    s_step = B * NH * DH
    h = _tile(S0, s_row, rd, m2, ACC)
    c = h * 0.0
    n = c
    m = c
    if NS > 1:
        c = _tile(S0, s_row + s_step, rd, m2, ACC)
    if NS > 2:
        n = _tile(S0, s_row + 2 * s_step, rd, m2, ACC)
        m = _tile(S0, s_row + 3 * s_step, rd, m2, ACC)

    sv_row = (rb * (T + 1) * NH + pid_h) * NSAVE * DH
    sv_t = NH * NSAVE * DH
    if SAVE:
        _put(SAVED, sv_row, rd, m2, h)
        if CELL == LSTM:
            _put(SAVED, sv_row + DH, rd, m2, c)
        if CELL == SLSTM:
            _put(SAVED, sv_row + DH, rd, m2, c)
            _put(SAVED, sv_row + 2 * DH, rd, m2, n)

    x_row = (rb * T * NH + pid_h) * GX * DH
    x_t = NH * GX * DH
    h_row = (rb * T * NH + pid_h) * DH
    h_t = NH * DH

    # inputs of step 0; each step prefetches the next step's inputs before its matmul
    x0n = _tile(WX, x_row, rd, m2, ACC)
    x1n = x0n
    x2n = x0n
    x3n = x0n
    if GX > 1:
        x1n = _tile(WX, x_row + DH, rd, m2, ACC)
        x2n = _tile(WX, x_row + 2 * DH, rd, m2, ACC)
    if GX > 3:
        x3n = _tile(WX, x_row + 3 * DH, rd, m2, ACC)

    for t in range(T):
        x0 = x0n
        x1 = x1n
        x2 = x2n
        x3 = x3n
        nxt = x_row + tl.minimum(t + 1, T - 1) * x_t
        x0n = _tile(WX, nxt, rd, m2, ACC)
        if GX > 1:
            x1n = _tile(WX, nxt + DH, rd, m2, ACC)
            x2n = _tile(WX, nxt + 2 * DH, rd, m2, ACC)
        if GX > 3:
            x3n = _tile(WX, nxt + 3 * DH, rd, m2, ACC)

        hs = h.to(H.dtype.element_ty)  # the storage dtype's rounding
        hd = hs.to(R0.dtype)
        if FULL_H:  # float32 dots (``UPCAST``): h unrounded
            hd = h
        hl = hd
        if SPLIT_H:  # and the rounding error, as a second operand (see ``fused.launch_config``)
            hl = (h - hs.to(ACC)).to(H.dtype.element_ty).to(R0.dtype)
        y0 = _rdot(hd, hl, R0, PREC, SPLIT_H)
        sv = sv_row + (t + 1) * sv_t
        if CELL == ELMAN:
            h = elman_fwd(x0 + y0 + b0)
            if SAVE:
                _put(SAVED, sv, rd, m2, h)
        if CELL == LSTM:
            y1 = _rdot(hd, hl, R1, PREC, SPLIT_H)
            y2 = _rdot(hd, hl, R2, PREC, SPLIT_H)
            y3 = _rdot(hd, hl, R3, PREC, SPLIT_H)
            h, c, i, f, tz, o = lstm_fwd(x0 + y0 + b0, x1 + y1 + b1, x2 + y2 + b2, x3 + y3 + b3, c)
            if SAVE:
                _put(SAVED, sv, rd, m2, h)
                _put(SAVED, sv + DH, rd, m2, c)
                _put(SAVED, sv + 2 * DH, rd, m2, i)
                _put(SAVED, sv + 3 * DH, rd, m2, f)
                _put(SAVED, sv + 4 * DH, rd, m2, tz)
                _put(SAVED, sv + 5 * DH, rd, m2, o)
        if CELL == GRU:
            y1 = _rdot(hd, hl, R1, PREC, SPLIT_H)
            y2 = _rdot(hd, hl, R2, PREC, SPLIT_H)
            g = y0 + b0
            h_new, r, z, a = gru_fwd(g, x0 + y1 + b1, x1 + y2 + b2, x2 + b3, h)
            h = h_new
            if SAVE:
                _put(SAVED, sv, rd, m2, h)
                _put(SAVED, sv + DH, rd, m2, g)
                _put(SAVED, sv + 2 * DH, rd, m2, r)
                _put(SAVED, sv + 3 * DH, rd, m2, z)
                _put(SAVED, sv + 4 * DH, rd, m2, a)
        if CELL == SLSTM:
            y1 = _rdot(hd, hl, R1, PREC, SPLIT_H)
            y2 = _rdot(hd, hl, R2, PREC, SPLIT_H)
            y3 = _rdot(hd, hl, R3, PREC, SPLIT_H)
            h, c, n, m, ig, fg, tz, o, sf, fi = slstm_fwd(
                x0 + y0 + b0, x1 + y1 + b1, x2 + y2 + b2, x3 + y3 + b3, c, n, m
            )
            if SAVE:
                _put(SAVED, sv, rd, m2, h)
                _put(SAVED, sv + DH, rd, m2, c)
                _put(SAVED, sv + 2 * DH, rd, m2, n)
                _put(SAVED, sv + 3 * DH, rd, m2, ig)
                _put(SAVED, sv + 4 * DH, rd, m2, fg)
                _put(SAVED, sv + 5 * DH, rd, m2, tz)
                _put(SAVED, sv + 6 * DH, rd, m2, o)
                _put(SAVED, sv + 7 * DH, rd, m2, sf)
                _put(SAVED, sv + 8 * DH, rd, m2, fi)
        _put(H, h_row + t * h_t, rd, m2, h)

    _put(LAST, s_row, rd, m2, h)
    if NS > 1:
        _put(LAST, s_row + s_step, rd, m2, c)
    if NS > 2:
        _put(LAST, s_row + 2 * s_step, rd, m2, n)
        _put(LAST, s_row + 3 * s_step, rd, m2, m)


@triton.jit
def _bwd_loads(DY, SAVED, y_off, cur, prv, rd, m2, DH, CELL: tl.constexpr, ACC: tl.constexpr):
    """One backward step's inputs: dy, h_prev and the cell's saved tiles (``cur``: the step's saved
    row, ``prv``: the row before it), in the argument order of the cell's ``*_bwd``."""
    dy = _tile(DY, y_off, rd, m2, ACC)
    hp = _tile(SAVED, prv, rd, m2, ACC)
    q1 = dy
    q2 = dy
    q3 = dy
    q4 = dy
    q5 = dy
    q6 = dy
    q7 = dy
    q8 = dy
    q9 = dy
    q10 = dy
    if CELL == ELMAN:  # h
        q1 = _tile(SAVED, cur, rd, m2, ACC)
    if CELL == LSTM:  # c, c_prev, i, f, tz, o
        q1 = _tile(SAVED, cur + DH, rd, m2, ACC)
        q2 = _tile(SAVED, prv + DH, rd, m2, ACC)
        q3 = _tile(SAVED, cur + 2 * DH, rd, m2, ACC)
        q4 = _tile(SAVED, cur + 3 * DH, rd, m2, ACC)
        q5 = _tile(SAVED, cur + 4 * DH, rd, m2, ACC)
        q6 = _tile(SAVED, cur + 5 * DH, rd, m2, ACC)
    if CELL == GRU:  # g, r, z, a
        q1 = _tile(SAVED, cur + DH, rd, m2, ACC)
        q2 = _tile(SAVED, cur + 2 * DH, rd, m2, ACC)
        q3 = _tile(SAVED, cur + 3 * DH, rd, m2, ACC)
        q4 = _tile(SAVED, cur + 4 * DH, rd, m2, ACC)
    if CELL == SLSTM:  # c, n (1 where masked: no 0/0), c_prev, n_prev, ig, fg, tz, o, sf, fi
        q1 = _tile(SAVED, cur + DH, rd, m2, ACC)
        q2 = tl.load(SAVED + cur[:, None] + 2 * DH + rd[None, :], mask=m2, other=1.0).to(ACC)
        q3 = _tile(SAVED, prv + DH, rd, m2, ACC)
        q4 = _tile(SAVED, prv + 2 * DH, rd, m2, ACC)
        q5 = _tile(SAVED, cur + 3 * DH, rd, m2, ACC)
        q6 = _tile(SAVED, cur + 4 * DH, rd, m2, ACC)
        q7 = _tile(SAVED, cur + 5 * DH, rd, m2, ACC)
        q8 = _tile(SAVED, cur + 6 * DH, rd, m2, ACC)
        q9 = _tile(SAVED, cur + 7 * DH, rd, m2, ACC)
        q10 = _tile(SAVED, cur + 8 * DH, rd, m2, ACC)
    return dy, hp, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10


@triton.jit
def _load_rt(RT, pid_h, g, rd, DH, GR: tl.constexpr):
    """R_g^T of head ``pid_h`` as a (DHP, DHP) tile, zero-padded: tile[j, n] = RT[h, g, j, n] =
    R[h, n, g, j]. ``RT`` is R transposed in memory (``fused_rnn_bwd``), so the tile's rows are
    contiguous and it sits in shared memory with n fastest: the dot's lanes (one n each) read it
    without bank conflicts (from R directly, with j fastest, every read of the dot's B operand would
    be an 8-way bank conflict on sm_90)."""
    md = rd < DH
    off = ((pid_h * GR + g) * DH + rd[:, None]) * DH + rd[None, :]
    return tl.load(RT + off, mask=md[:, None] & md[None, :], other=0.0)


@triton.jit
def fused_bwd_kernel(
    DY, DLAST, RT, SAVED, DG, DS0, DR_PART, DB_PART,
    B, T, NH, DH,
    CELL: tl.constexpr, GR: tl.constexpr, GB: tl.constexpr, NS: tl.constexpr,
    NSAVE: tl.constexpr, ACC_DR: tl.constexpr, ACC_DB: tl.constexpr,
    BLOCK_B: tl.constexpr, DHP: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid_h = tl.program_id(0)
    pid_b = tl.program_id(1)
    rb = (pid_b * BLOCK_B + tl.arange(0, BLOCK_B)).to(tl.int64)
    rd = tl.arange(0, DHP)
    md = rd < DH
    m2 = (rb < B)[:, None] & md[None, :]

    RT0 = _load_rt(RT, pid_h, 0, rd, DH, GR)
    RT1 = RT0
    RT2 = RT0
    RT3 = RT0
    if GR > 1:
        RT1 = _load_rt(RT, pid_h, 1, rd, DH, GR)
        RT2 = _load_rt(RT, pid_h, 2, rd, DH, GR)
    if GR > 3:
        RT3 = _load_rt(RT, pid_h, 3, rd, DH, GR)
    SDT = RT0.dtype  # storage dtype: dot operands are rounded to it
    if UPCAST:  # see the forward
        RT0 = RT0.to(tl.float32)
        RT1 = RT1.to(tl.float32)
        RT2 = RT2.to(tl.float32)
        RT3 = RT3.to(tl.float32)
    DT = RT0.dtype

    s_row = (rb * NH + pid_h) * DH
    s_step = B * NH * DH
    dh_rec = _tile(DLAST, s_row, rd, m2, ACC)
    dc = dh_rec * 0.0
    dn = dc
    dm = dc
    if NS > 1:
        dc = _tile(DLAST, s_row + s_step, rd, m2, ACC)
    if NS > 2:
        dn = _tile(DLAST, s_row + 2 * s_step, rd, m2, ACC)
        dm = _tile(DLAST, s_row + 3 * s_step, rd, m2, ACC)

    # ACC_DB: db as elementwise sums over time, reduced over the batch block once after the loop
    db0 = dh_rec * 0.0
    db1 = db0
    db2 = db0
    db3 = db0
    dR0 = tl.zeros((DHP, DHP), dtype=ACC)
    dR1 = dR0
    dR2 = dR0
    dR3 = dR0

    sv_row = (rb * (T + 1) * NH + pid_h) * NSAVE * DH
    sv_t = NH * NSAVE * DH
    y_row = (rb * T * NH + pid_h) * DH
    y_t = NH * DH
    g_row = (rb * T * NH + pid_h) * GB * DH
    g_t = NH * GB * DH

    # step T-1's saved tiles; each step prefetches the step before it (they do not depend on dh)
    q = _bwd_loads(DY, SAVED, y_row + (T - 1) * y_t, sv_row + T * sv_t, sv_row + (T - 1) * sv_t, rd, m2, DH, CELL, ACC)
    for tt in range(T):
        t = T - 1 - tt
        dy, h_prev, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10 = q
        tp = tl.maximum(t - 1, 0)
        q = _bwd_loads(DY, SAVED, y_row + tp * y_t, sv_row + (tp + 1) * sv_t, sv_row + tp * sv_t, rd, m2, DH, CELL, ACC)
        dh = dy + dh_rec
        gp = g_row + t * g_t
        if CELL == ELMAN:
            d0 = tl.where(m2, elman_bwd(dh, q1), 0.0)
            d1 = d0
            d2 = d0
            d3 = d0
            direct = dh * 0.0
        if CELL == LSTM:
            d0, d1, d2, d3, dc = lstm_bwd(dh, dc, q1, q2, q3, q4, q5, q6)
            direct = dh * 0.0
        if CELL == GRU:
            d0, d1, d2, d3, direct = gru_bwd(dh, h_prev, q1, q2, q3, q4)
        if CELL == SLSTM:
            d0, d1, d2, d3, dc, dn, dm = slstm_bwd(dh, dc, dn, dm, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10)
            direct = dh * 0.0

        # gate gradients = input / bias gradients (eq. 5-6); padded rows and columns are zero
        _put(DG, gp, rd, m2, d0)
        if GB > 1:
            _put(DG, gp + DH, rd, m2, d1)
            _put(DG, gp + 2 * DH, rd, m2, d2)
            _put(DG, gp + 3 * DH, rd, m2, d3)
        if ACC_DB:
            db0 += d0
            db1 += d1
            db2 += d2
            db3 += d3

        # recurrent part of eq. 4 (R^T dg) and eq. 7 (dR += h_prev^T dg)
        e0 = d0.to(SDT).to(DT)
        dh_rec = tl.dot(e0, RT0, direct, input_precision=PREC)
        if GR > 1:
            e1 = d1.to(SDT).to(DT)
            e2 = d2.to(SDT).to(DT)
            dh_rec = tl.dot(e1, RT1, dh_rec, input_precision=PREC)
            dh_rec = tl.dot(e2, RT2, dh_rec, input_precision=PREC)
        if GR > 3:
            e3 = d3.to(SDT).to(DT)
            dh_rec = tl.dot(e3, RT3, dh_rec, input_precision=PREC)
        if ACC_DR:
            hT = tl.trans(h_prev.to(SDT).to(DT))
            dR0 = tl.dot(hT, e0, dR0, input_precision=PREC)
            if GR > 1:
                dR1 = tl.dot(hT, e1, dR1, input_precision=PREC)
                dR2 = tl.dot(hT, e2, dR2, input_precision=PREC)
            if GR > 3:
                dR3 = tl.dot(hT, e3, dR3, input_precision=PREC)

    _put(DS0, s_row, rd, m2, dh_rec)
    if NS > 1:
        _put(DS0, s_row + s_step, rd, m2, dc)
    if NS > 2:
        _put(DS0, s_row + 2 * s_step, rd, m2, dn)
        _put(DS0, s_row + 3 * s_step, rd, m2, dm)

    if ACC_DB:
        db_base = DB_PART + (pid_b * NH + pid_h) * GB * DH
        tl.store(db_base + rd, tl.sum(db0, axis=0), mask=md)
        if GB > 1:
            tl.store(db_base + DH + rd, tl.sum(db1, axis=0), mask=md)
            tl.store(db_base + 2 * DH + rd, tl.sum(db2, axis=0), mask=md)
            tl.store(db_base + 3 * DH + rd, tl.sum(db3, axis=0), mask=md)
    if ACC_DR:
        mr = md[:, None] & md[None, :]
        dr_off = ((pid_b * NH + pid_h) * DH + rd[:, None]) * GR * DH + rd[None, :]
        tl.store(DR_PART + dr_off, dR0, mask=mr)
        if GR > 1:
            tl.store(DR_PART + dr_off + DH, dR1, mask=mr)
            tl.store(DR_PART + dr_off + 2 * DH, dR2, mask=mr)
        if GR > 3:
            tl.store(DR_PART + dr_off + 3 * DH, dR3, mask=mr)
