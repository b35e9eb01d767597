"""The pointwise Triton kernels of the alternating backend (``alternating.py``), forward and backward.

``_alt_fwd_step``: one time step's cell update of every (batch row, head, channel) from the input
pre-activations and the recurrent product of the step (computed by a torch batched matmul); it writes
``h``, the states and, with ``SAVE``, the saved slots of ``cell_kernels.py``. ``_alt_bwd_step``: one
step of the backward, the gate gradients from the saved slots. ``BLOCK`` elements per program.
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
def _alt_fwd_step(
    WX, RY, BIAS, ST, H, SAVED, t,
    B, T, NH, DH,
    CELL: tl.constexpr, GX: tl.constexpr, GR: tl.constexpr, GB: tl.constexpr,
    NSAVE: tl.constexpr, SAVE: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Step ``t``: ``RY (NH, B, GR, DH)`` = R^T h_{t-1}; ``ST (NS, NH, B, DH)`` states, updated in place."""
    e = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = e < NH * B * DH
    hh = e // (B * DH)
    bb = (e // DH) % B
    d = e % DH
    x = WX + ((bb * T + t) * NH + hh) * GX * DH + d
    ry = RY + (hh * B + bb) * GR * DH + d
    bias = BIAS + hh * GB * DH + d
    hb = hh * B * DH + bb * DH + d  # index into one state of ST
    ns = NH * B * DH
    sv = SAVED + (((bb * (T + 1) + t + 1) * NH + hh) * NSAVE) * DH + d

    def_ = tl.load(ry, mask=mask, other=0.0).to(ACC)  # gate 0 of R^T h
    h_prev = tl.load(ST + hb, mask=mask, other=0.0)
    if CELL == ELMAN:
        p0 = tl.load(x, mask=mask, other=0.0).to(ACC) + def_ + tl.load(bias, mask=mask, other=0.0).to(ACC)
        h = elman_fwd(p0)
        if SAVE:
            tl.store(sv, h, mask=mask)
    if CELL == LSTM or CELL == SLSTM:
        p0 = tl.load(x, mask=mask, other=0.0).to(ACC) + def_ + tl.load(bias, mask=mask, other=0.0).to(ACC)
        p1 = tl.load(x + DH, mask=mask, other=0.0).to(ACC) + tl.load(ry + DH, mask=mask, other=0.0)
        p1 += tl.load(bias + DH, mask=mask, other=0.0).to(ACC)
        p2 = tl.load(x + 2 * DH, mask=mask, other=0.0).to(ACC) + tl.load(ry + 2 * DH, mask=mask, other=0.0)
        p2 += tl.load(bias + 2 * DH, mask=mask, other=0.0).to(ACC)
        p3 = tl.load(x + 3 * DH, mask=mask, other=0.0).to(ACC) + tl.load(ry + 3 * DH, mask=mask, other=0.0)
        p3 += tl.load(bias + 3 * DH, mask=mask, other=0.0).to(ACC)
        c_prev = tl.load(ST + ns + hb, mask=mask, other=0.0)
        if CELL == LSTM:
            h, c, i, f, tz, o = lstm_fwd(p0, p1, p2, p3, c_prev)
            tl.store(ST + ns + hb, c, mask=mask)
            if SAVE:
                tl.store(sv, h, mask=mask)
                tl.store(sv + DH, c, mask=mask)
                tl.store(sv + 2 * DH, i, mask=mask)
                tl.store(sv + 3 * DH, f, mask=mask)
                tl.store(sv + 4 * DH, tz, mask=mask)
                tl.store(sv + 5 * DH, o, mask=mask)
        if CELL == SLSTM:
            n_prev = tl.load(ST + 2 * ns + hb, mask=mask, other=0.0)
            m_prev = tl.load(ST + 3 * ns + hb, mask=mask, other=0.0)
            h, c, n, m, ig, fg, tz, o, sf, fi = slstm_fwd(p0, p1, p2, p3, c_prev, n_prev, m_prev)
            tl.store(ST + ns + hb, c, mask=mask)
            tl.store(ST + 2 * ns + hb, n, mask=mask)
            tl.store(ST + 3 * ns + hb, m, mask=mask)
            if SAVE:
                tl.store(sv, h, mask=mask)
                tl.store(sv + DH, c, mask=mask)
                tl.store(sv + 2 * DH, n, mask=mask)
                tl.store(sv + 3 * DH, ig, mask=mask)
                tl.store(sv + 4 * DH, fg, mask=mask)
                tl.store(sv + 5 * DH, tz, mask=mask)
                tl.store(sv + 6 * DH, o, mask=mask)
                tl.store(sv + 7 * DH, sf, mask=mask)
                tl.store(sv + 8 * DH, fi, mask=mask)
    if CELL == GRU:
        g = def_ + tl.load(bias, mask=mask, other=0.0).to(ACC)
        rp = tl.load(x, mask=mask, other=0.0).to(ACC) + tl.load(ry + DH, mask=mask, other=0.0)
        rp += tl.load(bias + DH, mask=mask, other=0.0).to(ACC)
        zp = tl.load(x + DH, mask=mask, other=0.0).to(ACC) + tl.load(ry + 2 * DH, mask=mask, other=0.0)
        zp += tl.load(bias + 2 * DH, mask=mask, other=0.0).to(ACC)
        npre = tl.load(x + 2 * DH, mask=mask, other=0.0).to(ACC) + tl.load(bias + 3 * DH, mask=mask, other=0.0)
        h, r, z, a = gru_fwd(g, rp, zp, npre, h_prev)
        if SAVE:
            tl.store(sv, h, mask=mask)
            tl.store(sv + DH, g, mask=mask)
            tl.store(sv + 2 * DH, r, mask=mask)
            tl.store(sv + 3 * DH, z, mask=mask)
            tl.store(sv + 4 * DH, a, mask=mask)
    tl.store(ST + hb, h, mask=mask)
    tl.store(H + ((bb * T + t) * NH + hh) * DH + d, h.to(H.dtype.element_ty), mask=mask)


@triton.jit
def _alt_bwd_step(
    DY, DHR, DST, SAVED, DG, DGR, t,
    B, T, NH, DH,
    CELL: tl.constexpr, GR: tl.constexpr, GB: tl.constexpr, NSAVE: tl.constexpr,
    BLOCK: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Step ``t`` in reverse. ``DHR (NH, B, DH)``: gradient reaching h_t through R (in: from step
    t + 1; out: the direct part of dh_{t-1}); ``DST (NS, NH, B, DH)`` carried state gradients (in
    place); writes the gate gradients to ``DG (B, T, NH, GB, DH)`` and, rounded to the storage dtype,
    the recurrent ones to ``DGR (NH, B, GR, DH)``."""
    e = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = e < NH * B * DH
    hh = e // (B * DH)
    bb = (e // DH) % B
    d = e % DH
    hb = hh * B * DH + bb * DH + d
    ns = NH * B * DH
    cur = SAVED + (((bb * (T + 1) + t + 1) * NH + hh) * NSAVE) * DH + d
    prv = SAVED + (((bb * (T + 1) + t) * NH + hh) * NSAVE) * DH + d
    dh = tl.load(DY + ((bb * T + t) * NH + hh) * DH + d, mask=mask, other=0.0).to(ACC)
    dh += tl.load(DHR + hb, mask=mask, other=0.0)
    direct = dh * 0.0
    if CELL == ELMAN:
        d0 = elman_bwd(dh, tl.load(cur, mask=mask, other=0.0))
        d1 = d0
        d2 = d0
        d3 = d0
    if CELL == LSTM:
        d0, d1, d2, d3, dc = lstm_bwd(
            dh,
            tl.load(DST + ns + hb, mask=mask, other=0.0),
            tl.load(cur + DH, mask=mask, other=0.0),
            tl.load(prv + DH, mask=mask, other=0.0),
            tl.load(cur + 2 * DH, mask=mask, other=0.0),
            tl.load(cur + 3 * DH, mask=mask, other=0.0),
            tl.load(cur + 4 * DH, mask=mask, other=0.0),
            tl.load(cur + 5 * DH, mask=mask, other=0.0),
        )
        tl.store(DST + ns + hb, dc, mask=mask)
    if CELL == GRU:
        d0, d1, d2, d3, direct = gru_bwd(
            dh,
            tl.load(prv, mask=mask, other=0.0),
            tl.load(cur + DH, mask=mask, other=0.0),
            tl.load(cur + 2 * DH, mask=mask, other=0.0),
            tl.load(cur + 3 * DH, mask=mask, other=0.0),
            tl.load(cur + 4 * DH, mask=mask, other=0.0),
        )
    if CELL == SLSTM:
        d0, d1, d2, d3, dc, dn, dm = slstm_bwd(
            dh,
            tl.load(DST + ns + hb, mask=mask, other=0.0),
            tl.load(DST + 2 * ns + hb, mask=mask, other=0.0),
            tl.load(DST + 3 * ns + hb, mask=mask, other=0.0),
            tl.load(cur + DH, mask=mask, other=0.0),
            tl.load(cur + 2 * DH, mask=mask, other=1.0),
            tl.load(prv + DH, mask=mask, other=0.0),
            tl.load(prv + 2 * DH, mask=mask, other=0.0),
            tl.load(cur + 3 * DH, mask=mask, other=0.0),
            tl.load(cur + 4 * DH, mask=mask, other=0.0),
            tl.load(cur + 5 * DH, mask=mask, other=0.0),
            tl.load(cur + 6 * DH, mask=mask, other=0.0),
            tl.load(cur + 7 * DH, mask=mask, other=0.0),
            tl.load(cur + 8 * DH, mask=mask, other=0.0),
        )
        tl.store(DST + ns + hb, dc, mask=mask)
        tl.store(DST + 2 * ns + hb, dn, mask=mask)
        tl.store(DST + 3 * ns + hb, dm, mask=mask)
    tl.store(DHR + hb, direct, mask=mask)
    dt = DG.dtype.element_ty
    g = DG + ((bb * T + t) * NH + hh) * GB * DH + d
    gr = DGR + (hh * B + bb) * GR * DH + d
    tl.store(g, d0.to(dt), mask=mask)
    tl.store(gr, d0.to(dt).to(ACC), mask=mask)
    if GB > 1:
        tl.store(g + DH, d1.to(dt), mask=mask)
        tl.store(g + 2 * DH, d2.to(dt), mask=mask)
        tl.store(g + 3 * DH, d3.to(dt), mask=mask)
        tl.store(gr + DH, d1.to(dt).to(ACC), mask=mask)
        tl.store(gr + 2 * DH, d2.to(dt).to(ACC), mask=mask)
    if GR > 3:
        tl.store(gr + 3 * DH, d3.to(dt).to(ACC), mask=mask)
