"""Triton kernels of the chunk-loop linear scan (diagonal and 2x2-block): one program per lane tile.

When there are many independent lanes (``B * D`` channels, e.g. 8192 at ``B = 8, D = 1024``), the
sequence need not be split across programs: one program per (batch row, tile of ``BD`` channels)
walks the whole sequence in chunks of ``CH`` steps, carrying the state from chunk to chunk in
registers. No tickets, no records, no communication between programs: one pass over memory,
``12`` bytes per element (diagonal, float32, forward). Loads are software-pipelined over the chunk
loop (``tl.range(..., num_stages=STAGES)``: Triton stages the next ``STAGES - 1`` chunks' tiles in
shared memory with asynchronous copies while the current chunk is scanned), so each program keeps
several tiles in flight; with few lane tiles (one long sequence) there are too few programs to fill
the GPU, and ``_scan_kernels.py``'s look-back kernels, which split the sequence, run instead.

Modes (constexpr) as in ``_scan_kernels.py``: ``REVERSE`` (chunks and rows from the end; the tile
holds its rows in reverse memory order so the in-register scan always runs forward) and ``GRAD``
(the backward of a scan of the opposite direction: coefficients of the previous position in this
kernel's order ``p(t)``, transposed for 2x2 blocks; also writes ``dc_t = dx_t * y_{q(t)}``, outer
product for blocks, ``q(t)`` the other neighbour, ``y`` the forward output).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.scan._scan_kernels import _compose, _compose2, _row_of


@triton.jit
def _diag_loop_kernel(
    c_ptr, x_ptr, out_ptr, yfwd_ptr, dc_ptr,
    L, D, n_dt, n_chunks,
    REVERSE: tl.constexpr, GRAD: tl.constexpr, CH: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
    DC: tl.constexpr,
):
    """``c, x, out, yfwd, dc (B, L, D)``; grid ``(B * n_dt,)``, ``n_dt = cdiv(D, BD)``,
    ``n_chunks = cdiv(L, CH)``; ``DC``: ``D`` as a compile-time constant, or 0 (runtime ``D``)."""
    if DC > 0:
        D = DC
    lt = tl.program_id(0)
    b = lt // n_dt
    dt = lt % n_dt
    i = (CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH)  # row within the chunk in memory
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    offs = i[:, None] * D + tl.arange(0, BD)[None, :]  # int32 offsets inside the tile
    shift = D if REVERSE else -D  # GRAD: the coefficient of the previous step in this scan's order
    sel = (tl.arange(0, CH) == CH - 1)[:, None]  # the chunk's last step in scan order
    carry = tl.zeros([BD], dtype=tl.float32)
    for k in tl.range(0, n_chunks, num_stages=STAGES):
        m = n_chunks - 1 - k if REVERSE else k
        rows = m * CH + i
        mask = (rows < L)[:, None] & lmask[None, :]
        start = (b.to(tl.int64) * L + m * CH) * D + dt * BD  # int64 element offset of the tile's corner
        x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        if GRAD:
            prow = rows + 1 if REVERSE else rows - 1
            pmask = ((prow >= 0) & (prow < L))[:, None] & lmask[None, :]
            a = tl.load(c_ptr + start + offs + shift, mask=pmask, other=0.0).to(tl.float32)
        else:
            a = tl.load(c_ptr + start + offs, mask=mask, other=1.0).to(tl.float32)
        a = tl.where(mask, a, 1.0)  # rows past the end are the identity map
        A, Y = tl.associative_scan((a, x), 0, _compose)
        y = Y + A * carry[None, :]
        tl.store(out_ptr + start + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if GRAD:
            qrow = rows - 1 if REVERSE else rows + 1
            qmask = ((qrow >= 0) & (qrow < L))[:, None] & lmask[None, :]
            yq = tl.load(yfwd_ptr + start + offs - shift, mask=qmask, other=0.0).to(tl.float32)
            tl.store(dc_ptr + start + offs, (y * yq).to(dc_ptr.dtype.element_ty), mask=mask)
        carry = _row_of(y, sel)


@triton.jit
def _block2_loop_kernel(
    c_ptr, x_ptr, out_ptr, yfwd_ptr, dc_ptr,
    L, D, n_dt, n_chunks,
    REVERSE: tl.constexpr, GRAD: tl.constexpr, CH: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
    DC: tl.constexpr,
):
    """``C (B, L, 2, 2, D)``, ``x / out / yfwd (B, L, 2, D)``, ``dc`` like ``C``; grid and ``DC`` as
    ``_diag_loop_kernel``."""
    if DC > 0:
        D = DC
    lt = tl.program_id(0)
    b = lt // n_dt
    dt = lt % n_dt
    i = (CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH)
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    xo = i[:, None] * (2 * D) + tl.arange(0, BD)[None, :]  # x[b, t, 0, d] inside the tile
    co = i[:, None] * (4 * D) + tl.arange(0, BD)[None, :]  # C[b, t, 0, 0, d]
    sel = (tl.arange(0, CH) == CH - 1)[:, None]
    r0 = tl.zeros([BD], dtype=tl.float32)
    r1 = tl.zeros([BD], dtype=tl.float32)
    for k in tl.range(0, n_chunks, num_stages=STAGES):
        m = n_chunks - 1 - k if REVERSE else k
        rows = m * CH + i
        mask = (rows < L)[:, None] & lmask[None, :]
        bm = b.to(tl.int64) * L + m * CH
        xs = bm * 2 * D + dt * BD
        cs = bm * 4 * D + dt * BD
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
        A00, A01, A10, A11, Y0, Y1 = tl.associative_scan((a00, a01, a10, a11, x0, x1), 0, _compose2)
        y0 = Y0 + A00 * r0[None, :] + A01 * r1[None, :]
        y1 = Y1 + A10 * r0[None, :] + A11 * r1[None, :]
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
        r0 = _row_of(y0, sel)
        r1 = _row_of(y1, sel)
