"""The sequential part of RWKV-7's DPLR rule in its chunk form (``pytorch.dplr_delta_rule``), as Triton kernels
that keep the state on chip between chunks (paper 004's inter-chunk recurrence); ``triton_dplr.py`` launches
them. Everything else of the chunk form is batched over chunks (in PyTorch, or in ``dplr_chunk_kernels.py``).

Per batch element and head, chunk ``i`` of ``NC``, with the state ``M_i (K, V)`` entering it (``M_0 = 0``)::

    U_i     = U_v,i + W_i M_i                                   (C, V)
    M_{i+1} = diag(d_i) M_i + Be_i^T U_i + Ke_i^T v_i           (K, V)

``U_v, v (C, V)``, ``W, Be, Ke (C, K)``, ``d (K,)`` per chunk (``pytorch.dplr_scan``'s ``U_v, W, b_end, k_end,
v, decay_end``): the state's update is rank ``2 C``, so the kernels read ``C``-row tiles, never a ``(K, V)``
one per chunk. Its gradient, the chunks in reverse with ``dM`` (the gradient of ``M_{i+1}``) in registers,
``dU_i`` and ``dM_i`` the gradients of the outputs ``U_i`` and ``M_i``::

    dU'_i = dU_i + Be_i dM        dU_v,i = dU'_i      dW_i = dU'_i M_i^T
    dBe_i = U_i dM^T              dKe_i = v_i dM^T    dv_i = Ke_i dM        dd_i = rowsum(M_i o dM)
    dM   <- diag(d_i) dM + W_i^T dU'_i + dM_i

``dM_i`` read from a ``(K, V)`` tensor per chunk, or (``OUT_ROWS``, the fused kernels' outputs ``O_i = scale
(q o exp(c))_i M_i + ...``) formed on chip as ``scale (q o exp(c))_i^T dO_i`` from the rows of ``q``, ``w``
(``c`` their cumulative sum in the chunk) and the output gradient ``dO``.

Grids ``(NV, B H)``: one program per head and block of ``BV`` value columns (the value columns are
independent); ``dW, dBe, dKe, dd`` sum over value columns, so they are written per block (``NV`` leading
slices, summed by the caller). Tensors are float32 (``M_in`` may be stored in bfloat16), contiguous, ``(B H,
NC, rows, cols)``, but ``v``: any float dtype, its step ``t`` of head ``h`` of batch element ``b`` at ``b s_b
+ h s_h + t s_t`` (rows from ``L`` on read as zeros), so the fused kernels hand over their ``(B, L, H, V)``
input as it is. ``C``, ``K``, ``V`` padded to the powers of two ``BC, BK`` and blocks of ``BV`` with masks.
``PREC``: every product's precision (``chunk_kernels._mm``: ``"bf16"`` rounds both operands to bfloat16,
else ``tl.dot``'s ``input_precision``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from seqkernels.delta.chunk_kernels import _mm, _rows


@triton.jit
def _tile_ptrs(x, base, rows, cols, n_rows, n_cols):
    """``(pointers, mask)`` of the ``rows x cols`` tile of the ``(n_rows, n_cols)`` matrix at ``x + base``."""
    return x + base + rows[:, None] * n_cols + cols[None, :], (rows[:, None] < n_rows) & (cols[None, :] < n_cols)


@triton.jit
def _load(x, base, rows, cols, n_rows, n_cols):
    ptr, mask = _tile_ptrs(x, base, rows, cols, n_rows, n_cols)
    return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def _store(x, base, val, rows, cols, n_rows, n_cols):
    ptr, mask = _tile_ptrs(x, base, rows, cols, n_rows, n_cols)
    tl.store(ptr, val, mask=mask)


@triton.jit
def _value_rows(v, i_bh, i, rc, rv, H, L, s_b, s_h, s_t, C: tl.constexpr, V: tl.constexpr):
    """Chunk ``i``'s ``v`` rows ``rc`` and columns ``rv`` (of ``V``) of program ``i_bh`` (head ``i_bh % H`` of
    batch element ``i_bh // H``) as float32, zeros past ``L`` steps."""
    t = (i * C + rc).to(tl.int64)
    base = (i_bh // H).to(tl.int64) * s_b + (i_bh % H).to(tl.int64) * s_h
    mask = (rc[:, None] < C) & (t[:, None] < L) & (rv[None, :] < V)
    return tl.load(v + base + t[:, None] * s_t + rv[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _out_state_grad(
    q, w, do, scale, i_b, i_h, t0, L, H, K, V, v0, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """``scale (q o exp(c))^T dO (BK, BV)`` of the chunk from step ``t0`` of head ``i_h`` of batch element
    ``i_b``, value columns from ``v0``: the output's gradient of the state entering it, read from the token rows
    of ``q, w (B, L, H, K)`` and ``do (B, L, H, V)`` as the fused kernels read them."""
    c = tl.cumsum(_rows(w, i_b, i_h, t0, L, H, K, C, BK), 0)
    q_s = _rows(q, i_b, i_h, t0, L, H, K, C, BK) * tl.exp(c)
    return _mm(tl.trans(q_s), scale * _rows(do, i_b, i_h, t0, L, H, V, C, BV, v0), PREC)


@triton.jit
def dplr_scan_fwd_kernel(
    Uv, W, Be, Ke, v, D, U, M_in, NC, H, L, s_b, s_h, s_t,
    C: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``U`` and ``M_in`` (every chunk's entering state) from ``Uv, W, Be, Ke, v, D``; grid ``(NV, B H)``."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    rc, rk, rv = tl.arange(0, BC), tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    M = tl.zeros((BK, BV), dtype=tl.float32)
    for i in range(NC):
        n = (i_bh * NC + i).to(tl.int64)  # the chunk's index in the flattened (B H, NC)
        _store(M_in, n * K * V, M.to(M_in.dtype.element_ty), rk, rv, K, V)  # rounded as a product rounds it
        # the update's part that does not need M first, off the dependent chain
        kv = _mm(
            tl.trans(_load(Ke, n * C * K, rc, rk, C, K)),
            _value_rows(v, i_bh, i, rc, rv, H, L, s_b, s_h, s_t, C, V),
            PREC,
        )
        u = _load(Uv, n * C * V, rc, rv, C, V) + _mm(_load(W, n * C * K, rc, rk, C, K), M, PREC)
        _store(U, n * C * V, u, rc, rv, C, V)
        be = _load(Be, n * C * K, rc, rk, C, K)
        d = tl.load(D + n * K + rk, mask=rk < K, other=0.0)
        M = d[:, None] * M + _mm(tl.trans(be), u, PREC, kv)


@triton.jit
def dplr_scan_bwd_kernel(
    dU, dM_in, W, Be, Ke, v, D, U, M_in, dUv, dW, dBe, dKe, dv, dD, NC, BH, H, L, s_b, s_h, s_t, q, w, do, scale,
    C: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, OUT_ROWS: tl.constexpr,
):  # fmt: skip
    """The input gradients from ``dU, dM_in`` (or ``OUT_ROWS``: ``q, w, do, scale``, the values' layout) and
    the saved ``W, Be, Ke, v, D, U, M_in``: ``dUv``, ``dv (B H, NC, C, V)``; ``dW, dBe, dKe, dD`` per value
    block (leading ``NV``); grid ``(NV, B H)``."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    rc, rk, rv = tl.arange(0, BC), tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    dM = tl.zeros((BK, BV), dtype=tl.float32)
    for j in range(NC):
        i = NC - 1 - j
        n = (i_bh * NC + i).to(tl.int64)
        part = i_v.to(tl.int64) * BH * NC + n  # the chunk's index in the per-block (NV, B H, NC)
        M = _load(M_in, n * K * V, rk, rv, K, V).to(tl.float32)
        u = _load(U, n * C * V, rc, rv, C, V)
        wy = _load(W, n * C * K, rc, rk, C, K)
        be = _load(Be, n * C * K, rc, rk, C, K)
        ke = _load(Ke, n * C * K, rc, rk, C, K)
        vv = _value_rows(v, i_bh, i, rc, rv, H, L, s_b, s_h, s_t, C, V)
        d = tl.load(D + n * K + rk, mask=rk < K, other=0.0)
        du = _load(dU, n * C * V, rc, rv, C, V) + _mm(be, dM, PREC)
        _store(dUv, n * C * V, du, rc, rv, C, V)
        _store(dW, part * C * K, _mm(du, tl.trans(M), PREC), rc, rk, C, K)
        _store(dBe, part * C * K, _mm(u, tl.trans(dM), PREC), rc, rk, C, K)
        _store(dKe, part * C * K, _mm(vv, tl.trans(dM), PREC), rc, rk, C, K)
        _store(dv, n * C * V, _mm(ke, dM, PREC), rc, rv, C, V)
        tl.store(dD + part * K + rk, tl.sum(M * dM, 1), mask=rk < K)
        if OUT_ROWS:
            out = _out_state_grad(q, w, do, scale, i_bh // H, i_bh % H, i * C, L, H, K, V, i_v * BV, C, BK, BV, PREC)
        else:
            out = _load(dM_in, n * K * V, rk, rv, K, V)
        dM = d[:, None] * dM + _mm(tl.trans(wy), du, PREC) + out
