"""Triton kernels of the single-pass chunked linear scan (diagonal and 2x2-block).

One program per (lane tile of ``BD`` channels, chunk of ``CH`` time steps): it loads its tile once,
scans it along time with ``tl.associative_scan`` (the composition of affine maps
``y -> a * y + b``), gets its carry-in by decoupled look-back (``_lookback.py``), and writes the
result once: one pass over memory, ``12`` bytes per element (diagonal, float32, forward).

Modes (constexpr):

- ``REVERSE``: scan from the end (chunk ``k`` in scan order is memory chunk ``n_chunks - 1 - k``, and
  the tile holds its rows in reverse memory order, so the in-register scan always runs forward:
  Triton lowers ``reverse=True`` scans with warp shuffles even when a thread owns the whole axis).
- ``GRAD``: the backward of a scan of the *opposite* direction. The coefficient of row ``t`` is the
  forward coefficient at the previous position in this kernel's scan order ``p(t)``
  (``t + 1`` when ``REVERSE``, ``t - 1`` otherwise), transposed for 2x2 blocks; besides the result
  ``dx`` the kernel writes the coefficient gradient ``dc_t = dx_t * y_{q(t)}`` (outer product for
  blocks) where ``q(t)`` is the other neighbour and ``y`` the forward output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.scan._lookback import FLAG_AGG, FLAG_INC, pack, take_ticket, unpack


@triton.jit
def _compose(a1, y1, a2, y2):
    """``(a1, y1)`` then ``(a2, y2)``: ``y -> a2 * (a1 * y + y1) + y2``."""
    return a1 * a2, a2 * y1 + y2


@triton.jit
def _compose2(a00, a01, a10, a11, y0, y1, b00, b01, b10, b11, z0, z1):
    """2x2 blocks: ``(A, y)`` then ``(B, z)`` is ``(B A, B y + z)``."""
    return (
        b00 * a00 + b01 * a10,
        b00 * a01 + b01 * a11,
        b10 * a00 + b11 * a10,
        b10 * a01 + b11 * a11,
        b00 * y0 + b01 * y1 + z0,
        b10 * y0 + b11 * y1 + z1,
    )


@triton.jit
def _row_of(v, sel):
    """The row of a ``[CH, BD]`` tile picked by the one-hot column ``sel [CH, 1]`` -> ``[BD]``."""
    return tl.sum(tl.where(sel, v, 0.0), axis=0)


@triton.jit
def _diag_scan_kernel(
    c_ptr, x_ptr, out_ptr, yfwd_ptr, dc_ptr, ws_ptr, counter_ptr,
    L, D, n_dt, n_lt, n_chunks,
    REVERSE: tl.constexpr, GRAD: tl.constexpr, CH: tl.constexpr, BD: tl.constexpr,
):
    k, lt = take_ticket(counter_ptr, n_lt)
    b = lt // n_dt
    dt = lt % n_dt
    m = n_chunks - 1 - k if REVERSE else k
    # reverse: the tile's rows in reverse memory order, so the scan always runs forward over the tile
    rows = m * CH + ((CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH))
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    mask = (rows < L)[:, None] & lmask[None, :]
    base = b.to(tl.int64) * L * D
    offs = base + rows[:, None] * D + lanes[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if GRAD:
        prow = rows + 1 if REVERSE else rows - 1
        pmask = ((prow >= 0) & (prow < L))[:, None] & lmask[None, :]
        a = tl.load(c_ptr + base + prow[:, None] * D + lanes[None, :], mask=pmask, other=0.0).to(tl.float32)
    else:
        a = tl.load(c_ptr + offs, mask=mask, other=1.0).to(tl.float32)
    a = tl.where(mask, a, 1.0)  # rows past the end are the identity map

    A, Y = tl.associative_scan((a, x), 0, _compose)
    sel = (tl.arange(0, CH) == CH - 1)[:, None]  # the chunk's last step in scan order
    agg_a = _row_of(A, sel)
    agg_y = _row_of(Y, sel)

    # ---- decoupled look-back: words [A, Y] x BD per (lane tile, chunk) ----
    lane = tl.arange(0, BD)
    rec = ws_ptr + (lt * n_chunks) * 2 * BD + lane  # record of chunk j: rec + j * 2 * BD (+ BD for Y)
    carry = tl.zeros([BD], dtype=tl.float32)
    if k > 0:
        tl.store(rec + k * 2 * BD, pack(agg_a, FLAG_AGG))
        tl.store(rec + k * 2 * BD + BD, pack(agg_y, FLAG_AGG))
        j = tl.full([BD], 0, tl.int32) + (k - 1)
        prod = tl.full([BD], 1.0, tl.float32)
        done = tl.zeros([BD], dtype=tl.int32)
        while tl.min(done) == 0:
            live = done == 0
            wy = tl.load(rec + j * 2 * BD + BD, mask=live, other=0, volatile=True)
            wa = tl.load(rec + j * 2 * BD, mask=live, other=0, volatile=True)
            vy, fy = unpack(wy)
            va, fa = unpack(wa)
            inc = live & (fy == FLAG_INC)
            agg = live & (fy == FLAG_AGG) & (fa == FLAG_AGG)
            carry = tl.where(inc | agg, carry + prod * vy, carry)
            prod = tl.where(agg, prod * va, prod)
            j = tl.where(agg, j - 1, j)
            done = tl.where(inc, 1, done)
    tl.store(rec + k * 2 * BD + BD, pack(agg_y + agg_a * carry, FLAG_INC))

    y = Y + A * carry[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    if GRAD:
        qrow = rows - 1 if REVERSE else rows + 1
        qmask = ((qrow >= 0) & (qrow < L))[:, None] & lmask[None, :]
        yq = tl.load(yfwd_ptr + base + qrow[:, None] * D + lanes[None, :], mask=qmask, other=0.0).to(tl.float32)
        tl.store(dc_ptr + offs, (y * yq).to(dc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _block2_scan_kernel(
    c_ptr, x_ptr, out_ptr, yfwd_ptr, dc_ptr, ws_ptr, counter_ptr,
    L, D, n_dt, n_lt, n_chunks,
    REVERSE: tl.constexpr, GRAD: tl.constexpr, CH: tl.constexpr, BD: tl.constexpr,
):
    """``C (B, L, 2, 2, D)``, ``x / out / yfwd (B, L, 2, D)``, ``dc`` like ``C``."""
    k, lt = take_ticket(counter_ptr, n_lt)
    b = lt // n_dt
    dt = lt % n_dt
    m = n_chunks - 1 - k if REVERSE else k
    # reverse: the tile's rows in reverse memory order, so the scan always runs forward over the tile
    rows = m * CH + ((CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH))
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    mask = (rows < L)[:, None] & lmask[None, :]
    bl = b.to(tl.int64) * L
    xo = (bl + rows[:, None]) * 2 * D + lanes[None, :]  # x[b, t, 0, d]
    x0 = tl.load(x_ptr + xo, mask=mask, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + xo + D, mask=mask, other=0.0).to(tl.float32)
    if GRAD:
        prow = rows + 1 if REVERSE else rows - 1
        pmask = ((prow >= 0) & (prow < L))[:, None] & lmask[None, :]
        co = (bl + prow[:, None]) * 4 * D + lanes[None, :]
        # transposed: a_ij = C[p(t)][j, i]
        a00 = tl.load(c_ptr + co, mask=pmask, other=0.0).to(tl.float32)
        a10 = tl.load(c_ptr + co + D, mask=pmask, other=0.0).to(tl.float32)
        a01 = tl.load(c_ptr + co + 2 * D, mask=pmask, other=0.0).to(tl.float32)
        a11 = tl.load(c_ptr + co + 3 * D, mask=pmask, other=0.0).to(tl.float32)
    else:
        co = (bl + rows[:, None]) * 4 * D + lanes[None, :]
        a00 = tl.load(c_ptr + co, mask=mask, other=0.0).to(tl.float32)
        a01 = tl.load(c_ptr + co + D, mask=mask, other=0.0).to(tl.float32)
        a10 = tl.load(c_ptr + co + 2 * D, mask=mask, other=0.0).to(tl.float32)
        a11 = tl.load(c_ptr + co + 3 * D, mask=mask, other=0.0).to(tl.float32)
    a00 = tl.where(mask, a00, 1.0)
    a01 = tl.where(mask, a01, 0.0)
    a10 = tl.where(mask, a10, 0.0)
    a11 = tl.where(mask, a11, 1.0)

    A00, A01, A10, A11, Y0, Y1 = tl.associative_scan(
        (a00, a01, a10, a11, x0, x1), 0, _compose2
    )
    sel = (tl.arange(0, CH) == CH - 1)[:, None]  # the chunk's last step in scan order
    g00 = _row_of(A00, sel)
    g01 = _row_of(A01, sel)
    g10 = _row_of(A10, sel)
    g11 = _row_of(A11, sel)
    gy0 = _row_of(Y0, sel)
    gy1 = _row_of(Y1, sel)

    # ---- decoupled look-back: words [A00, A01, A10, A11, Y0, Y1] x BD per (lane tile, chunk) ----
    lane = tl.arange(0, BD)
    rec = ws_ptr + (lt * n_chunks) * 6 * BD + lane
    r0 = tl.zeros([BD], dtype=tl.float32)
    r1 = tl.zeros([BD], dtype=tl.float32)
    if k > 0:
        here = rec + k * 6 * BD
        tl.store(here, pack(g00, FLAG_AGG))
        tl.store(here + BD, pack(g01, FLAG_AGG))
        tl.store(here + 2 * BD, pack(g10, FLAG_AGG))
        tl.store(here + 3 * BD, pack(g11, FLAG_AGG))
        tl.store(here + 4 * BD, pack(gy0, FLAG_AGG))
        tl.store(here + 5 * BD, pack(gy1, FLAG_AGG))
        j = tl.full([BD], 0, tl.int32) + (k - 1)
        # running product P (2x2) of the coefficients between chunk j and us; carry += P @ value
        p00 = tl.full([BD], 1.0, tl.float32)
        p01 = tl.zeros([BD], dtype=tl.float32)
        p10 = tl.zeros([BD], dtype=tl.float32)
        p11 = tl.full([BD], 1.0, tl.float32)
        done = tl.zeros([BD], dtype=tl.int32)
        while tl.min(done) == 0:
            live = done == 0
            there = rec + j * 6 * BD
            v0, f0 = unpack(tl.load(there + 4 * BD, mask=live, other=0, volatile=True))
            v1, f1 = unpack(tl.load(there + 5 * BD, mask=live, other=0, volatile=True))
            q00, e00 = unpack(tl.load(there, mask=live, other=0, volatile=True))
            q01, e01 = unpack(tl.load(there + BD, mask=live, other=0, volatile=True))
            q10, e10 = unpack(tl.load(there + 2 * BD, mask=live, other=0, volatile=True))
            q11, e11 = unpack(tl.load(there + 3 * BD, mask=live, other=0, volatile=True))
            inc = live & (f0 == FLAG_INC) & (f1 == FLAG_INC)
            agg = (
                live & (f0 == FLAG_AGG) & (f1 == FLAG_AGG)
                & (e00 == FLAG_AGG) & (e01 == FLAG_AGG) & (e10 == FLAG_AGG) & (e11 == FLAG_AGG)
            )
            use = inc | agg
            r0 = tl.where(use, r0 + p00 * v0 + p01 * v1, r0)
            r1 = tl.where(use, r1 + p10 * v0 + p11 * v1, r1)
            n00 = p00 * q00 + p01 * q10
            n01 = p00 * q01 + p01 * q11
            n10 = p10 * q00 + p11 * q10
            n11 = p10 * q01 + p11 * q11
            p00 = tl.where(agg, n00, p00)
            p01 = tl.where(agg, n01, p01)
            p10 = tl.where(agg, n10, p10)
            p11 = tl.where(agg, n11, p11)
            j = tl.where(agg, j - 1, j)
            done = tl.where(inc, 1, done)
    here = rec + k * 6 * BD
    tl.store(here + 4 * BD, pack(gy0 + g00 * r0 + g01 * r1, FLAG_INC))
    tl.store(here + 5 * BD, pack(gy1 + g10 * r0 + g11 * r1, FLAG_INC))

    y0 = Y0 + A00 * r0[None, :] + A01 * r1[None, :]
    y1 = Y1 + A10 * r0[None, :] + A11 * r1[None, :]
    ety = out_ptr.dtype.element_ty
    tl.store(out_ptr + xo, y0.to(ety), mask=mask)
    tl.store(out_ptr + xo + D, y1.to(ety), mask=mask)
    if GRAD:
        qrow = rows - 1 if REVERSE else rows + 1
        qmask = ((qrow >= 0) & (qrow < L))[:, None] & lmask[None, :]
        qo = (bl + qrow[:, None]) * 2 * D + lanes[None, :]
        yq0 = tl.load(yfwd_ptr + qo, mask=qmask, other=0.0).to(tl.float32)
        yq1 = tl.load(yfwd_ptr + qo + D, mask=qmask, other=0.0).to(tl.float32)
        co = (bl + rows[:, None]) * 4 * D + lanes[None, :]
        cty = dc_ptr.dtype.element_ty
        tl.store(dc_ptr + co, (y0 * yq0).to(cty), mask=mask)
        tl.store(dc_ptr + co + D, (y0 * yq1).to(cty), mask=mask)
        tl.store(dc_ptr + co + 2 * D, (y1 * yq0).to(cty), mask=mask)
        tl.store(dc_ptr + co + 3 * D, (y1 * yq1).to(cty), mask=mask)
