"""The sequential part of RWKV-7's DPLR rule in its chunk form (``pytorch.dplr_delta_rule``), as Triton kernels
that keep the state on chip between chunks (paper 004's inter-chunk recurrence); ``triton_dplr.py`` launches
them. Everything else of the chunk form is batched over chunks in PyTorch.

Per batch element and head, chunk ``i`` of ``NC``, with the state ``M_i (K, V)`` entering it (``M_0 = 0``)::

    U_i     = U_v,i + W_i M_i                                   (C, V)
    M_{i+1} = diag(d_i) M_i + Be_i^T U_i + KVe_i                (K, V)

``U_v (C, V)``, ``W, Be (C, K)``, ``KVe (K, V)``, ``d (K,)`` per chunk (``pytorch.dplr_scan``'s ``U_v, W, b_end,
KV_end, decay_end``). Its gradient, the chunks in reverse with ``dM`` (the gradient of ``M_{i+1}``) in registers,
``dU_i`` and ``dM_i`` the gradients of the outputs ``U_i`` and ``M_i``::

    dU'_i = dU_i + Be_i dM        dU_v,i = dU'_i      dW_i = dU'_i M_i^T
    dBe_i = U_i dM^T              dKVe_i = dM         dd_i = rowsum(M_i o dM)
    dM   <- diag(d_i) dM + W_i^T dU'_i + dM_i

Grids ``(NV, B H)``: one program per head and block of ``BV`` value columns (the value columns are
independent); ``dW, dBe, dd`` sum over value columns, so they are written per block (``NV`` leading slices,
summed by the caller). Tensors are float32, contiguous, ``(B H, NC, rows, cols)``; ``C``, ``K``, ``V`` padded to
the powers of two ``BC, BK`` and blocks of ``BV`` with masks. ``PREC``: every product's precision
(``chunk_kernels._mm``: ``"bf16"`` rounds both operands to bfloat16, else ``tl.dot``'s ``input_precision``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from seqkernels.delta.chunk_kernels import _mm


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
def dplr_scan_fwd_kernel(
    Uv, W, Be, KVe, D, U, M_in, NC,
    C: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``U`` and ``M_in`` (every chunk's entering state) from ``Uv, W, Be, KVe, D``; grid ``(NV, B H)``."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    rc, rk, rv = tl.arange(0, BC), tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    M = tl.zeros((BK, BV), dtype=tl.float32)
    for i in range(NC):
        n = (i_bh * NC + i).to(tl.int64)  # the chunk's index in the flattened (B H, NC)
        _store(M_in, n * K * V, M, rk, rv, K, V)
        u = _load(Uv, n * C * V, rc, rv, C, V) + _mm(_load(W, n * C * K, rc, rk, C, K), M, PREC)
        _store(U, n * C * V, u, rc, rv, C, V)
        be = _load(Be, n * C * K, rc, rk, C, K)
        d = tl.load(D + n * K + rk, mask=rk < K, other=0.0)
        M = d[:, None] * M + _mm(tl.trans(be), u, PREC) + _load(KVe, n * K * V, rk, rv, K, V)


@triton.jit
def dplr_scan_bwd_kernel(
    dU, dM_in, W, Be, D, U, M_in, dUv, dW, dBe, dKVe, dD, NC, BH,
    C: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The input gradients from ``dU, dM_in`` and the saved ``W, Be, D, U, M_in``; ``dW, dBe, dD`` per value
    block (leading ``NV``); grid ``(NV, B H)``."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    rc, rk, rv = tl.arange(0, BC), tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    dM = tl.zeros((BK, BV), dtype=tl.float32)
    for j in range(NC):
        n = (i_bh * NC + NC - 1 - j).to(tl.int64)
        part = i_v.to(tl.int64) * BH * NC + n  # the chunk's index in the per-block (NV, B H, NC)
        M = _load(M_in, n * K * V, rk, rv, K, V)
        u = _load(U, n * C * V, rc, rv, C, V)
        w = _load(W, n * C * K, rc, rk, C, K)
        be = _load(Be, n * C * K, rc, rk, C, K)
        d = tl.load(D + n * K + rk, mask=rk < K, other=0.0)
        du = _load(dU, n * C * V, rc, rv, C, V) + _mm(be, dM, PREC)
        _store(dUv, n * C * V, du, rc, rv, C, V)
        _store(dW, part * C * K, _mm(du, tl.trans(M), PREC), rc, rk, C, K)
        _store(dBe, part * C * K, _mm(u, tl.trans(dM), PREC), rc, rk, C, K)
        _store(dKVe, n * K * V, dM, rk, rv, K, V)
        tl.store(dD + part * K + rk, tl.sum(M * dM, 1), mask=rk < K)
        dM = d[:, None] * dM + _mm(tl.trans(w), du, PREC) + _load(dM_in, n * K * V, rk, rv, K, V)
