"""Triton kernels of the single-pass chunked linear scan (diagonal and 2x2-block).

One program per (lane tile of ``BD`` channels, chunk of ``CH`` time steps): it loads its tile once,
scans it along time with ``tl.associative_scan`` (the composition of affine maps
``y -> a * y + b``), gets its carry-in by decoupled look-back (``lookback_kernels.py``), and writes the
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

from seqkernels.scan.lookback_kernels import lookback_block2, lookback_diag, records, take_ticket


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
def _load_diag_tile(c_ptr, x_ptr, start, offs, rows, mask, lmask, L, D, REVERSE: tl.constexpr, GRAD: tl.constexpr):
    """One ``[CH, BD]`` tile of a diagonal scan in float32: ``(a, x)`` at element offsets
    ``start + offs`` (``rows``: the tile's time steps; ``mask``: in bounds). ``GRAD``: ``a`` is the
    coefficient of the previous step in the scan's order. Rows past the end are the identity map."""
    x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
    if GRAD:
        prow = rows + 1 if REVERSE else rows - 1
        pmask = ((prow >= 0) & (prow < L))[:, None] & lmask[None, :]
        a = tl.load(c_ptr + start + offs + (D if REVERSE else -D), mask=pmask, other=0.0).to(tl.float32)
    else:
        a = tl.load(c_ptr + start + offs, mask=mask, other=1.0).to(tl.float32)
    return tl.where(mask, a, 1.0), x


@triton.jit
def _store_diag_tile(
    out_ptr, yfwd_ptr, dc_ptr, y, start, offs, rows, mask, lmask, L, D, REVERSE: tl.constexpr, GRAD: tl.constexpr
):
    """Write the scanned tile ``y`` and, for ``GRAD``, ``dc_t = y_t * yfwd_{q(t)}`` (``q(t)``: the
    next step in the scan's order)."""
    tl.store(out_ptr + start + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    if GRAD:
        qrow = rows - 1 if REVERSE else rows + 1
        qmask = ((qrow >= 0) & (qrow < L))[:, None] & lmask[None, :]
        yq = tl.load(yfwd_ptr + start + offs + (-D if REVERSE else D), mask=qmask, other=0.0).to(tl.float32)
        tl.store(dc_ptr + start + offs, (y * yq).to(dc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_block2_tile(c_ptr, x_ptr, xs, cs, xo, co, rows, mask, lmask, L, D, REVERSE: tl.constexpr, GRAD: tl.constexpr):
    """One tile of a 2x2-block scan in float32: ``(a00, a01, a10, a11, x0, x1)``, each ``[CH, BD]``;
    ``xs + xo`` / ``cs + co``: element offsets of ``x[b, t, 0, d]`` / ``C[b, t, 0, 0, d]``. ``GRAD``:
    the previous step's block, transposed. Rows past the end are the identity map."""
    x0 = tl.load(x_ptr + xs + xo, mask=mask, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + xs + xo + D, mask=mask, other=0.0).to(tl.float32)
    if GRAD:
        prow = rows + 1 if REVERSE else rows - 1
        pmask = ((prow >= 0) & (prow < L))[:, None] & lmask[None, :]
        pc = c_ptr + cs + co + (4 * D if REVERSE else -4 * D)
        # transposed: a_ij = C[p(t)][j, i]
        a00 = tl.load(pc, mask=pmask, other=0.0).to(tl.float32)
        a10 = tl.load(pc + D, mask=pmask, other=0.0).to(tl.float32)
        a01 = tl.load(pc + 2 * D, mask=pmask, other=0.0).to(tl.float32)
        a11 = tl.load(pc + 3 * D, mask=pmask, other=0.0).to(tl.float32)
    else:
        pc = c_ptr + cs + co
        a00 = tl.load(pc, mask=mask, other=0.0).to(tl.float32)
        a01 = tl.load(pc + D, mask=mask, other=0.0).to(tl.float32)
        a10 = tl.load(pc + 2 * D, mask=mask, other=0.0).to(tl.float32)
        a11 = tl.load(pc + 3 * D, mask=mask, other=0.0).to(tl.float32)
    a00 = tl.where(mask, a00, 1.0)
    a01 = tl.where(mask, a01, 0.0)
    a10 = tl.where(mask, a10, 0.0)
    a11 = tl.where(mask, a11, 1.0)
    return a00, a01, a10, a11, x0, x1


@triton.jit
def _store_block2_tile(
    out_ptr,
    yfwd_ptr,
    dc_ptr,
    y0,
    y1,
    xs,
    cs,
    xo,
    co,
    rows,
    mask,
    lmask,
    L,
    D,
    REVERSE: tl.constexpr,
    GRAD: tl.constexpr,
):
    """Write the scanned tile ``(y0, y1)`` and, for ``GRAD``, ``dc_t = y_t yfwd_{q(t)}^T``."""
    ety = out_ptr.dtype.element_ty
    tl.store(out_ptr + xs + xo, y0.to(ety), mask=mask)
    tl.store(out_ptr + xs + xo + D, y1.to(ety), mask=mask)
    if GRAD:
        qrow = rows - 1 if REVERSE else rows + 1
        qmask = ((qrow >= 0) & (qrow < L))[:, None] & lmask[None, :]
        pq = yfwd_ptr + xs + xo + (-2 * D if REVERSE else 2 * D)
        yq0 = tl.load(pq, mask=qmask, other=0.0).to(tl.float32)
        yq1 = tl.load(pq + D, mask=qmask, other=0.0).to(tl.float32)
        pd = dc_ptr + cs + co
        cty = dc_ptr.dtype.element_ty
        tl.store(pd, (y0 * yq0).to(cty), mask=mask)
        tl.store(pd + D, (y0 * yq1).to(cty), mask=mask)
        tl.store(pd + 2 * D, (y1 * yq0).to(cty), mask=mask)
        tl.store(pd + 3 * D, (y1 * yq1).to(cty), mask=mask)


@triton.jit
def _diag_scan_kernel(
    c_ptr,
    x_ptr,
    out_ptr,
    yfwd_ptr,
    dc_ptr,
    ws_ptr,
    L,
    D,
    n_dt,
    REVERSE: tl.constexpr,
    GRAD: tl.constexpr,
    CH: tl.constexpr,
    BD: tl.constexpr,
    WIN: tl.constexpr,
    DC: tl.constexpr,
):
    """``c, x, out, yfwd, dc (B, L, D)`` (``yfwd``, ``dc``: ``None`` unless ``GRAD``); ``ws_ptr``: the
    int64 look-back workspace (``lookback_kernels.py``); ``n_dt = cdiv(D, BD)``; grid
    ``(B * n_dt * cdiv(L, CH),)``; ``DC``: ``D`` as a compile-time constant, or 0 (runtime ``D``).
    ``n_dt`` stays a runtime argument: derived from a constant ``D`` it costs registers (spills under
    the forward's 168-register cap, ``benchmarks/ops/compile_report.py``)."""
    if DC > 0:  # the channel count as a compile-time constant: row addresses fold into immediates
        D = DC
    n_chunks = tl.cdiv(L, CH)
    n_lt = tl.num_programs(0) // n_chunks
    k, lt, tag = take_ticket(ws_ptr, n_lt)
    b = lt // n_dt
    dt = lt % n_dt
    m = n_chunks - 1 - k if REVERSE else k
    # reverse: the tile's rows in reverse memory order, so the scan always runs forward over the tile
    i = (CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH)  # row within the chunk in memory
    rows = m * CH + i
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    mask = (rows < L)[:, None] & lmask[None, :]
    # int64 element offset of the tile's corner (b, m * CH, dt * BD); int32 offsets inside the tile
    start = (b.to(tl.int64) * L + m * CH) * D + dt * BD
    offs = i[:, None] * D + tl.arange(0, BD)[None, :]
    a, x = _load_diag_tile(c_ptr, x_ptr, start, offs, rows, mask, lmask, L, D, REVERSE, GRAD)

    A, Y = tl.associative_scan((a, x), 0, _compose)
    sel = (tl.arange(0, CH) == CH - 1)[:, None]  # the chunk's last step in scan order
    agg_a = _row_of(A, sel)
    agg_y = _row_of(Y, sel)

    # ---- decoupled look-back (lookback_kernels.py): records of 3 x BD words per (lane tile, chunk) ----
    rec = records(ws_ptr) + (lt * n_chunks) * 3 * BD + tl.arange(0, BD)
    carry = lookback_diag(rec, k, agg_a, agg_y, tag, CH, BD, WIN)

    y = Y + A * carry[None, :]
    _store_diag_tile(out_ptr, yfwd_ptr, dc_ptr, y, start, offs, rows, mask, lmask, L, D, REVERSE, GRAD)


@triton.jit
def _block2_scan_kernel(
    c_ptr,
    x_ptr,
    out_ptr,
    yfwd_ptr,
    dc_ptr,
    ws_ptr,
    L,
    D,
    n_dt,
    REVERSE: tl.constexpr,
    GRAD: tl.constexpr,
    CH: tl.constexpr,
    BD: tl.constexpr,
    DC: tl.constexpr,
):
    """``C (B, L, 2, 2, D)``, ``x / out / yfwd (B, L, 2, D)``, ``dc`` like ``C``; the rest as
    ``_diag_scan_kernel``."""
    if DC > 0:  # the channel count as a compile-time constant: row addresses fold into immediates
        D = DC
    n_chunks = tl.cdiv(L, CH)
    n_lt = tl.num_programs(0) // n_chunks
    k, lt, tag = take_ticket(ws_ptr, n_lt)
    b = lt // n_dt
    dt = lt % n_dt
    m = n_chunks - 1 - k if REVERSE else k
    # reverse: the tile's rows in reverse memory order, so the scan always runs forward over the tile
    i = (CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH)  # row within the chunk in memory
    rows = m * CH + i
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    mask = (rows < L)[:, None] & lmask[None, :]
    # int64 offsets of the tile's corner in x (2 D per step) and C (4 D per step); int32 inside the tile
    bm = b.to(tl.int64) * L + m * CH
    xs = bm * 2 * D + dt * BD
    cs = bm * 4 * D + dt * BD
    xo = i[:, None] * (2 * D) + tl.arange(0, BD)[None, :]  # x[b, t, 0, d]
    co = i[:, None] * (4 * D) + tl.arange(0, BD)[None, :]  # C[b, t, 0, 0, d]
    a00, a01, a10, a11, x0, x1 = _load_block2_tile(c_ptr, x_ptr, xs, cs, xo, co, rows, mask, lmask, L, D, REVERSE, GRAD)

    A00, A01, A10, A11, Y0, Y1 = tl.associative_scan((a00, a01, a10, a11, x0, x1), 0, _compose2)
    sel = (tl.arange(0, CH) == CH - 1)[:, None]  # the chunk's last step in scan order
    g00 = _row_of(A00, sel)
    g01 = _row_of(A01, sel)
    g10 = _row_of(A10, sel)
    g11 = _row_of(A11, sel)
    gy0 = _row_of(Y0, sel)
    gy1 = _row_of(Y1, sel)

    # ---- decoupled look-back (lookback_kernels.py): records of 8 x BD words per (lane tile, chunk) ----
    rec = records(ws_ptr) + (lt * n_chunks) * 8 * BD + tl.arange(0, BD)
    r0, r1 = lookback_block2(rec, k, g00, g01, g10, g11, gy0, gy1, tag, CH, BD)

    y0 = Y0 + A00 * r0[None, :] + A01 * r1[None, :]
    y1 = Y1 + A10 * r0[None, :] + A11 * r1[None, :]
    _store_block2_tile(out_ptr, yfwd_ptr, dc_ptr, y0, y1, xs, cs, xo, co, rows, mask, lmask, L, D, REVERSE, GRAD)
