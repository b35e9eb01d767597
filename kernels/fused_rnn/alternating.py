"""The alternating backend (paper 001 §5.2): per time step one batched matmul over heads (torch)
and one fused Triton pointwise kernel, forward and backward. It serves any head dimension (R is
re-read from memory every step), so ``fused_rnn(backend="triton")`` falls back to it when a head's
R does not fit on chip.

``fused_rnn_alternating(cell, wx, R, b, states0=None)`` has the signature and result of
``fused_rnn_reference``. Custom ops (``triton_ops.TritonBackend``; namespace ``expressivity``):

    fused_rnn_alt_fwd(cell, wx, R, b, states0, save) -> (h, last_states, saved)
    fused_rnn_alt_bwd(cell, dh, dlast, R, saved)     -> (dwx, dR, db, dstates0)

``saved`` has the layout of the fused backend (``fused.py``). The matmuls run in float32 (float64
for float64 inputs) on operands rounded to the storage dtype, as the fused kernel's tensor-core dots
(the bfloat16 sLSTM's forward takes the float32 h: ``triton_ops.full_precision_h``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton import cdiv, empty
from kernels.fused_rnn.cell_kernels import (
    CELL_IDS,
    ELMAN,
    GRU,
    LSTM,
    NUM_SAVED,
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
from kernels.fused_rnn.reference import cell_spec
from kernels.fused_rnn.triton_ops import TritonBackend, acc_dtype, check_saved, full_precision_h, run_checked

BLOCK = 512  # elements per program of the pointwise kernels


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


def _heads_first(states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A fresh contiguous copy of ``states`` with dims 1 and 2 swapped ((NS, B, NH, DH) <-> (NS, NH, B, DH))."""
    ns, d1, d2, dh = states.shape
    out = torch.empty(ns, d2, d1, dh, device=states.device, dtype=dtype)
    out.copy_(states.transpose(1, 2))
    return out


def _tl(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _forward(cell: str, wx, R, b, states0, save: bool, config=None):
    """Forward of the alternating backend: ``(h, last_states, saved)`` (``triton_ops.TritonBackend``)."""
    spec = cell_spec(cell)
    bsz, length, nh, _, dh = wx.shape
    acc = acc_dtype(wx.dtype)
    h = empty((bsz, length, nh, dh), wx.device, wx.dtype)
    nsave = NUM_SAVED[cell]
    saved = empty((bsz, length + 1, nh, nsave, dh) if save else (0,), wx.device, acc)
    if save:
        saved[:, 0].zero_()  # row 0 holds the initial states; its gate slots are never read
    st = _heads_first(states0, acc)  # (NS, NH, B, DH), a fresh copy updated in place
    if save:
        saved[:, 0, :, 0] = states0[0].to(acc)
        if cell in ("lstm", "slstm"):
            saved[:, 0, :, 1] = states0[1].to(acc)
        if cell == "slstm":
            saved[:, 0, :, 2] = states0[2].to(acc)
    r_acc = R.to(acc).reshape(nh, dh, spec.recurrent_gates * dh)
    ry = empty((nh, bsz, spec.recurrent_gates * dh), wx.device, acc)
    grid = (cdiv(nh * bsz * dh, BLOCK),)
    # h enters the matmul rounded to the storage dtype (as the fused kernel's dots), except where
    # triton_ops.full_precision_h (the bfloat16 sLSTM): the float32 h (the fused kernel: hi + lo parts)
    full_h = full_precision_h(cell, wx.dtype)
    for t in range(length):
        torch.bmm(st[0] if full_h else st[0].to(wx.dtype).to(acc), r_acc, out=ry)
        _alt_fwd_step[grid](
            wx, ry, b, st, h, saved if save else st, t,
            bsz, length, nh, dh,
            CELL=CELL_IDS[cell], GX=spec.input_gates, GR=spec.recurrent_gates, GB=spec.bias_gates,
            NSAVE=nsave, SAVE=save, BLOCK=BLOCK, ACC=_tl(wx.dtype),
        )  # fmt: skip
    last = _heads_first(st, wx.dtype)
    return h, last, saved


def _backward(cell: str, dh_out, dlast, R, saved, config=None):
    """Backward of the alternating backend: ``(dwx, dR, db, dstates0)``."""
    spec = cell_spec(cell)
    bsz, length, nh, dh = dh_out.shape
    check_saved("fused_rnn_alt_bwd", cell, saved, dh_out.shape)
    acc = acc_dtype(R.dtype)
    gr = spec.recurrent_gates
    dh_out = dh_out.contiguous()
    dst = _heads_first(dlast, acc)  # (NS, NH, B, DH): dh_T through R is dlast[0]
    dhr = dst[0].clone()
    dst[0].zero_()
    dg = empty((bsz, length, nh, spec.bias_gates, dh), R.device, R.dtype)
    dgr = empty((nh, bsz, gr * dh), R.device, acc)
    rt = R.to(acc).reshape(nh, dh, gr * dh).transpose(1, 2)  # (NH, GR*DH, DH)
    grid = (cdiv(nh * bsz * dh, BLOCK),)
    for t in reversed(range(length)):
        _alt_bwd_step[grid](
            dh_out, dhr, dst, saved, dg, dgr, t,
            bsz, length, nh, dh,
            CELL=CELL_IDS[cell], GR=gr, GB=spec.bias_gates, NSAVE=NUM_SAVED[cell], BLOCK=BLOCK, ACC=_tl(R.dtype),
        )  # fmt: skip
        dhr.baddbmm_(dgr, rt)
    dst[0] = dhr
    h_prev = saved[:, :length, :, 0].to(R.dtype).to(acc)
    dR = torch.einsum("bthi,bthgj->higj", h_prev, dg[:, :, :, :gr].to(acc))
    db = dg.to(acc).sum((0, 1))
    dwx = dg[:, :, :, spec.bias_gates - spec.input_gates :]
    if spec.bias_gates != spec.input_gates:
        dwx = dwx.contiguous()
    return dwx, dR.to(R.dtype), db.to(R.dtype), _heads_first(dst, R.dtype)


_BACKEND = TritonBackend("fused_rnn_alt", _forward, _backward)
fused_rnn_alt_fwd, fused_rnn_alt_bwd = _BACKEND.fwd_op, _BACKEND.bwd_op


def fused_rnn_alternating(
    cell: str, wx: torch.Tensor, R: torch.Tensor, b: torch.Tensor, states0: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The alternating backend; same signature and result as ``fused_rnn_reference``."""
    return run_checked(_BACKEND, "alternating", cell, wx, R, b, states0)
