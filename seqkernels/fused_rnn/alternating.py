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
import triton.language as tl

from seqkernels._triton import cdiv, empty
from seqkernels.fused_rnn.alternating_kernels import _alt_bwd_step, _alt_fwd_step
from seqkernels.fused_rnn.cell_kernels import (
    CELL_IDS,
    NUM_SAVED,
)
from seqkernels.fused_rnn.reference import cell_spec
from seqkernels.fused_rnn.triton_ops import TritonBackend, acc_dtype, check_saved, full_precision_h, run_checked

BLOCK = 512  # elements per program of the pointwise kernels


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
