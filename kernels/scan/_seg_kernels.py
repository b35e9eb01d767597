"""Triton kernel of the segmented look-back linear scan (diagonal): few lanes, one long sequence.

The look-back kernels (``_scan_kernels.py``) hold their whole ``[CH, BD]`` tile in registers while
they wait for the carry, which limits the programs per SM to ~6 and left the look-back a third of the
time at ``(1, 65536, 256)``. Here a program owns a long *segment* of ``SEG = CH * NSUB`` steps of a
lane tile of ``BD`` channels and passes over it twice:

1. streams the segment in sub-chunks of ``[CH, BD]`` (loads software-pipelined over the sub-chunk
   loop with ``tl.range(..., num_stages=STAGES)``) and keeps only the running aggregate
   ``(A = prod a, Y = local scan end)``, two ``[BD]`` rows;
2. publishes the aggregate and gets its carry-in by decoupled look-back (``_lookback.lookback_diag``,
   the same records, tickets and launch tags as the look-back kernels), holding nothing but the
   aggregate while it waits;
3. streams the segment again (it was read moments ago: mostly L2 hits when the segments in flight fit
   in L2) and writes ``y`` with the carry.

DRAM traffic stays one read of ``c, x`` and one write of ``y`` (12 bytes per element, float32 forward)
while the L2 re-reads hit; the long segment means one look-back per ``SEG`` steps.

Modes (constexpr) as in ``_scan_kernels.py``: ``REVERSE`` (segments and sub-chunks from the end; each
tile holds its rows in reverse memory order so the in-register scan always runs forward) and ``GRAD``
(the backward of a scan of the opposite direction: the coefficient of row ``t`` is the forward one at
the previous position ``p(t)`` in this kernel's order; also writes ``dc_t = dx_t * y_{q(t)}``, ``q(t)``
the other neighbour, ``y`` the forward output).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.scan._lookback import lookback_diag, take_ticket
from kernels.scan._scan_kernels import _compose, _row_of


@triton.jit
def _diag_seg_kernel(
    c_ptr, x_ptr, out_ptr, yfwd_ptr, dc_ptr, ws_ptr, counter_ptr,
    L, D, n_dt, n_lt, n_seg,
    REVERSE: tl.constexpr, GRAD: tl.constexpr, CH: tl.constexpr, NSUB: tl.constexpr, BD: tl.constexpr,
    STAGES: tl.constexpr, WIN: tl.constexpr, DC: tl.constexpr,
):
    """``c, x, out, yfwd, dc (B, L, D)``; ``ws``: int64 records (3 x ``BD`` words per lane tile and
    segment), ``counter``: the ticket word (``_lookback.py``); grid ``(n_lt * n_seg,)`` with
    ``n_lt = B * n_dt``, ``n_dt = cdiv(D, BD)``, ``n_seg = cdiv(L, CH * NSUB)``; ``DC``: ``D`` as a
    compile-time constant, or 0 (runtime ``D``)."""
    if DC > 0:  # the channel count as a compile-time constant: row addresses fold into immediates
        D = DC
    k, lt, tag = take_ticket(counter_ptr, n_lt, n_lt * n_seg)
    b = lt // n_dt
    dt = lt % n_dt
    m = n_seg - 1 - k if REVERSE else k  # segment index in memory
    i = (CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH)  # row within the sub-chunk in memory
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    offs = i[:, None] * D + tl.arange(0, BD)[None, :]  # int32 offsets inside the tile
    shift = D if REVERSE else -D  # GRAD: the coefficient of the previous step in this scan's order
    sel = (tl.arange(0, CH) == CH - 1)[:, None]  # the sub-chunk's last step in scan order
    seg0 = m * (CH * NSUB)  # first row of the segment in memory

    # ---- pass 1: the segment's aggregate (A, Y), nothing else kept ----
    agg_a = tl.full([BD], 1.0, tl.float32)
    agg_y = tl.zeros([BD], dtype=tl.float32)
    for s in tl.range(0, NSUB, num_stages=STAGES):
        sub = NSUB - 1 - s if REVERSE else s
        rows = seg0 + sub * CH + i
        mask = (rows < L)[:, None] & lmask[None, :]
        start = (b.to(tl.int64) * L + seg0 + sub * CH) * D + dt * BD
        x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        if GRAD:
            prow = rows + 1 if REVERSE else rows - 1
            pmask = ((prow >= 0) & (prow < L))[:, None] & lmask[None, :]
            a = tl.load(c_ptr + start + offs + shift, mask=pmask, other=0.0).to(tl.float32)
        else:
            a = tl.load(c_ptr + start + offs, mask=mask, other=1.0).to(tl.float32)
        a = tl.where(mask, a, 1.0)  # rows past the end are the identity map
        A, Y = tl.associative_scan((a, x), 0, _compose)
        agg_a, agg_y = _compose(agg_a, agg_y, _row_of(A, sel), _row_of(Y, sel))

    # ---- decoupled look-back: records of 3 x BD words per (lane tile, segment) ----
    rec = ws_ptr + (lt * n_seg) * 3 * BD + tl.arange(0, BD)
    carry = lookback_diag(rec, k, agg_a, agg_y, tag, CH, BD, WIN)

    # ---- pass 2: the segment again (L2), written with the carry ----
    for s in tl.range(0, NSUB, num_stages=STAGES):
        sub = NSUB - 1 - s if REVERSE else s
        rows = seg0 + sub * CH + i
        mask = (rows < L)[:, None] & lmask[None, :]
        start = (b.to(tl.int64) * L + seg0 + sub * CH) * D + dt * BD
        x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        if GRAD:
            prow = rows + 1 if REVERSE else rows - 1
            pmask = ((prow >= 0) & (prow < L))[:, None] & lmask[None, :]
            a = tl.load(c_ptr + start + offs + shift, mask=pmask, other=0.0).to(tl.float32)
        else:
            a = tl.load(c_ptr + start + offs, mask=mask, other=1.0).to(tl.float32)
        a = tl.where(mask, a, 1.0)
        A, Y = tl.associative_scan((a, x), 0, _compose)
        y = Y + A * carry[None, :]
        tl.store(out_ptr + start + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if GRAD:
            qrow = rows - 1 if REVERSE else rows + 1
            qmask = ((qrow >= 0) & (qrow < L))[:, None] & lmask[None, :]
            yq = tl.load(yfwd_ptr + start + offs - shift, mask=qmask, other=0.0).to(tl.float32)
            tl.store(dc_ptr + start + offs, (y * yq).to(dc_ptr.dtype.element_ty), mask=mask)
        carry = _row_of(y, sel)
