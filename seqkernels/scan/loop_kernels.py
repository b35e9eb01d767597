"""Triton kernels of the chunk-loop linear scan (diagonal and 2x2-block): one program per lane tile.

When there are many independent lanes (``B * D`` channels, e.g. 8192 at ``B = 8, D = 1024``), the
sequence need not be split across programs: one program per (batch row, tile of ``BD`` channels)
walks the whole sequence in chunks of ``CH`` steps, carrying the state from chunk to chunk in
registers. No tickets, no records, no communication between programs: one pass over memory,
``12`` bytes per element (diagonal, float32, forward). Loads are software-pipelined over the chunk
loop (``tl.range(..., num_stages=STAGES)``: Triton stages the next ``STAGES - 1`` chunks' tiles in
shared memory with asynchronous copies while the current chunk is scanned), so each program keeps
several tiles in flight; with few lane tiles (one long sequence) there are too few programs to fill
the GPU, and ``chunk_kernels.py``'s look-back kernels, which split the sequence, run instead.

Modes (constexpr) as in ``chunk_kernels.py``: ``REVERSE`` (chunks and rows from the end; the tile
holds its rows in reverse memory order so the in-register scan always runs forward) and ``GRAD``
(the backward of a scan of the opposite direction: coefficients of the previous position in this
kernel's order ``p(t)``, transposed for 2x2 blocks; also writes ``dc_t = dx_t * y_{q(t)}``, outer
product for blocks, ``q(t)`` the other neighbour, ``y`` the forward output).
"""

from __future__ import annotations

import triton
import triton.language as tl

from seqkernels.scan.chunk_kernels import (
    _compose,
    _compose2,
    _load_block2_tile,
    _load_diag_tile,
    _row_of,
    _store_block2_tile,
    _store_diag_tile,
)


@triton.jit
def _diag_loop_kernel(
    c_ptr,
    x_ptr,
    out_ptr,
    yfwd_ptr,
    dc_ptr,
    L,
    D,
    n_dt,
    REVERSE: tl.constexpr,
    GRAD: tl.constexpr,
    CH: tl.constexpr,
    BD: tl.constexpr,
    STAGES: tl.constexpr,
    DC: tl.constexpr,
):
    """``c, x, out, yfwd, dc (B, L, D)`` (``yfwd``, ``dc``: ``None`` unless ``GRAD``); grid
    ``(B * n_dt,)``, ``n_dt = cdiv(D, BD)`` (a runtime argument, as in ``chunk_kernels.py``); ``DC``:
    ``D`` as a compile-time constant, or 0 (runtime ``D``)."""
    if DC > 0:
        D = DC
    n_chunks = tl.cdiv(L, CH)
    lt = tl.program_id(0)
    b = lt // n_dt
    dt = lt % n_dt
    i = (CH - 1 - tl.arange(0, CH)) if REVERSE else tl.arange(0, CH)  # row within the chunk in memory
    lanes = dt * BD + tl.arange(0, BD)
    lmask = lanes < D
    offs = i[:, None] * D + tl.arange(0, BD)[None, :]  # int32 offsets inside the tile
    sel = (tl.arange(0, CH) == CH - 1)[:, None]  # the chunk's last step in scan order
    carry = tl.zeros([BD], dtype=tl.float32)
    for k in tl.range(0, n_chunks, num_stages=STAGES):
        m = n_chunks - 1 - k if REVERSE else k
        rows = m * CH + i
        mask = (rows < L)[:, None] & lmask[None, :]
        start = (b.to(tl.int64) * L + m * CH) * D + dt * BD  # int64 element offset of the tile's corner
        a, x = _load_diag_tile(c_ptr, x_ptr, start, offs, rows, mask, lmask, L, D, REVERSE, GRAD)
        A, Y = tl.associative_scan((a, x), 0, _compose)
        y = Y + A * carry[None, :]
        _store_diag_tile(out_ptr, yfwd_ptr, dc_ptr, y, start, offs, rows, mask, lmask, L, D, REVERSE, GRAD)
        carry = _row_of(y, sel)


@triton.jit
def _block2_loop_kernel(
    c_ptr,
    x_ptr,
    out_ptr,
    yfwd_ptr,
    dc_ptr,
    L,
    D,
    n_dt,
    REVERSE: tl.constexpr,
    GRAD: tl.constexpr,
    CH: tl.constexpr,
    BD: tl.constexpr,
    STAGES: tl.constexpr,
    DC: tl.constexpr,
):
    """``C (B, L, 2, 2, D)``, ``x / out / yfwd (B, L, 2, D)``, ``dc`` like ``C``; grid and ``DC`` as
    ``_diag_loop_kernel``."""
    if DC > 0:
        D = DC
    n_chunks = tl.cdiv(L, CH)
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
        a00, a01, a10, a11, x0, x1 = _load_block2_tile(
            c_ptr, x_ptr, xs, cs, xo, co, rows, mask, lmask, L, D, REVERSE, GRAD
        )
        A00, A01, A10, A11, Y0, Y1 = tl.associative_scan((a00, a01, a10, a11, x0, x1), 0, _compose2)
        y0 = Y0 + A00 * r0[None, :] + A01 * r1[None, :]
        y1 = Y1 + A10 * r0[None, :] + A11 * r1[None, :]
        _store_block2_tile(out_ptr, yfwd_ptr, dc_ptr, y0, y1, xs, cs, xo, co, rows, mask, lmask, L, D, REVERSE, GRAD)
        r0 = _row_of(y0, sel)
        r1 = _row_of(y1, sel)
