"""Fused Newton for FlashGRU (paper 000 eq. 7a + 9): forward and backward, one Triton kernel each.

``flashgru_fused(u, a, iters=3, tol=None, stats=False) -> (h, residuals)``

- ``u (H, B, L, 3, Ds)`` float32: the input pre-activations ``x @ B + b`` of the gates (z, r, c)
  per head ``H``, batch row, position and state channel (the mixer's ``input_projection``);
- ``a (H, 3, Ds)`` float32: the diagonal state weights ``(a_z, a_r, a_c)``;
- ``h (H, B, L, Ds)``: the states ``h_t = f(h_{t-1}, u_t)``, ``h_{-1} = 0``, with
  ``z = sigmoid(a_z h + u_z)``, ``r = sigmoid(a_r h + u_r)``, ``c = tanh(a_c (h r) + u_c)``,
  ``f = (1 - z) h + z c``;
- ``residuals (iters + 1,)``: with ``stats=True``, ``max |f(h^k_{t-1}, u_t) - h^k_t|`` of the
  ``k``-th iterate over every chunk that reached it (``-1`` where none did); ``stats=False``: all ``-1``.

Newton runs chunk by chunk from the exact state of the previous chunk (``common_kernels.py``):
initial guess ``h^0_t = f(0, u_t)``, at most ``iters`` iterations per chunk, stopping a chunk
early once its max residual is ``<= tol``. The backward (custom op ``flashgru_fused_bwd``) is one
reverse pass of the adjoint ``lambda_t = dL/dh_t + J_{t+1} lambda_{t+1}`` (eq. 6) with the
parameter gradients fused: ``du`` and ``da`` (summed over batch rows and positions).
Custom ops: ``expressivity::flashgru_fused``, ``expressivity::flashgru_fused_bwd``.

``flashgru_sequential(u, a) -> h``: the exact states (the loop's, to rounding) by the same kernels with
one-step chunks and one iteration: each step starts from the exact previous state, where one Newton
iteration is ``f`` itself. A sequential walk of ``L`` steps per program, with the same backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seqkernels.newton.common_kernels import (
    chunk_masks,
    compose,
    compose_excl,
    lane_tile,
    load3,
    param_rows3,
    row_of,
    sigmoid,
    store3,
    tanh,
)
from seqkernels.newton.triton_ops import FusedNewton, NewtonTiles


@triton.jit
def _f0(uz, uc):
    """``f(0, u)``: ``sigmoid(u_z) * tanh(u_c)``."""
    return sigmoid(uz) * tanh(uc)


@triton.jit
def _cell(hp, uz, ur, uc, az, ar, ac):
    """``f(h_prev, u)`` and its diagonal Jacobian (eq. 8)."""
    z = sigmoid(az * hp + uz)
    r = sigmoid(ar * hp + ur)
    c = tanh(ac * (hp * r) + uc)
    f = hp + z * (c - hp)
    jac = (1.0 - z) + (c - hp) * z * (1.0 - z) * az + z * (1.0 - c * c) * ac * (r + hp * r * (1.0 - r) * ar)
    return f, jac


@triton.jit
def _gru_fwd_kernel(
    u_ptr,
    a_ptr,
    h_ptr,
    res_ptr,
    skip_ptr,
    B,
    L,
    Ds,
    n_st,
    iters,
    tol,
    HAS_TOL: tl.constexpr,
    STATS: tl.constexpr,
    HAS_SKIP: tl.constexpr,
    CH: tl.constexpr,
    BD: tl.constexpr,
):
    if HAS_SKIP:  # a re-solve predicated on the device: no iteration where the first solve passed
        iters = tl.where(tl.load(skip_ptr) != 0, 0, iters)
    n, head, lanes, lmask = lane_tile(tl.program_id(0), n_st, B, Ds, BD)
    az, ar, ac = param_rows3(a_ptr + head * 3 * Ds + lanes, Ds, lmask)
    ubase = u_ptr + n.to(tl.int64) * L * 3 * Ds
    hbase = h_ptr + n.to(tl.int64) * L * Ds
    idx = tl.arange(0, CH)
    first = (idx == 0)[:, None]
    last = (idx == CH - 1)[:, None]
    hcarry = tl.zeros([BD], dtype=tl.float32)
    for m in range(0, tl.cdiv(L, CH)):
        rows = m * CH + idx
        mask, pmask, _next = chunk_masks(rows, L, lmask)  # (no `_`: the Newton loop reassigns it with another type)
        uo = rows[:, None] * (3 * Ds) + lanes[None, :]
        uz, ur, uc = load3(ubase + uo, Ds, mask)
        pz = tl.load(ubase + uo - 3 * Ds, mask=pmask, other=0.0)
        pc = tl.load(ubase + uo - Ds, mask=pmask, other=0.0)
        h = _f0(uz, uc)  # eq. 10: h^0_t = f(0, u_t)
        hp = tl.where(first, hcarry[None, :], _f0(pz, pc))  # h^0_{t-1}; exact at the chunk's start
        k = tl.full([], 0, tl.int32)
        conv = tl.full([], 0, tl.int32)
        while (k < iters) & (conv == 0):
            f, jac = _cell(hp, uz, ur, uc, az, ar, ac)
            r = tl.where(mask, f - h, 0.0)
            if HAS_TOL or STATS:
                rmax = tl.max(tl.max(tl.abs(r), axis=1), axis=0)
                if STATS:
                    tl.atomic_max(res_ptr + k, rmax)
                if HAS_TOL:
                    conv = (rmax <= tol).to(tl.int32)
            if conv == 0:
                one = tl.full([CH, BD], 1.0, tl.float32)
                _, _, _, e = tl.associative_scan((jac, r, one, tl.zeros_like(r)), 0, compose_excl)
                h = f + jac * e  # h^{k+1}_t = h^k_t + delta_t with delta_t = J_t delta_{t-1} + r_t
                hp = hp + e  # e_t = delta_{t-1}
            k += 1
        if STATS:
            if conv == 0:
                f, _ = _cell(hp, uz, ur, uc, az, ar, ac)
                rmax = tl.max(tl.max(tl.abs(tl.where(mask, f - h, 0.0)), axis=1), axis=0)
                tl.atomic_max(res_ptr + k, rmax)
        tl.store(hbase + rows[:, None] * Ds + lanes[None, :], h, mask=mask)
        hcarry = row_of(h, last)


@triton.jit
def _gru_bwd_kernel(
    u_ptr,
    a_ptr,
    h_ptr,
    gh_ptr,
    du_ptr,
    da_ptr,
    B,
    L,
    Ds,
    n_st,
    CH: tl.constexpr,
    BD: tl.constexpr,
):
    n, head, lanes, lmask = lane_tile(tl.program_id(0), n_st, B, Ds, BD)
    az, ar, ac = param_rows3(a_ptr + head * 3 * Ds + lanes, Ds, lmask)
    uoff = n.to(tl.int64) * L * 3 * Ds
    hoff = n.to(tl.int64) * L * Ds
    idx = tl.arange(0, CH)
    chunk_start = (idx == CH - 1)[:, None]  # the chunk's first step sits in the tile's last row
    lam_carry = tl.zeros([BD], dtype=tl.float32)
    acc_z = tl.zeros([CH, BD], dtype=tl.float32)
    acc_r = tl.zeros([CH, BD], dtype=tl.float32)
    acc_c = tl.zeros([CH, BD], dtype=tl.float32)
    n_chunks = tl.cdiv(L, CH)
    for i in range(0, n_chunks):
        rows = (n_chunks - 1 - i) * CH + (CH - 1 - idx)  # reversed rows: the adjoint scan runs forward over the tile
        mask, pmask, nmask = chunk_masks(rows, L, lmask)
        ho = hoff + rows[:, None] * Ds + lanes[None, :]
        h = tl.load(h_ptr + ho, mask=mask, other=0.0)
        hp = tl.load(h_ptr + ho - Ds, mask=pmask, other=0.0)
        g = tl.load(gh_ptr + ho, mask=mask, other=0.0)
        uo = uoff + rows[:, None] * (3 * Ds) + lanes[None, :]
        uz, ur, uc = load3(u_ptr + uo, Ds, mask)
        nz, nr, nc = load3(u_ptr + uo + 3 * Ds, Ds, nmask)
        _, jn = _cell(h, nz, nr, nc, az, ar, ac)  # J_{t+1}, evaluated at (h_t, u_{t+1})
        jn = tl.where(nmask, jn, 0.0)
        P, Y = tl.associative_scan((jn, g), 0, compose)
        lam = Y + P * lam_carry[None, :]  # lambda_t = g_t + J_{t+1} lambda_{t+1}
        lam_carry = row_of(lam, chunk_start)
        z = sigmoid(az * hp + uz)
        r = sigmoid(ar * hp + ur)
        c = tanh(ac * (hp * r) + uc)
        gz = lam * (c - hp) * z * (1.0 - z)
        gc = lam * z * (1.0 - c * c)
        gr = gc * ac * hp * r * (1.0 - r)
        store3(du_ptr + uo, Ds, gz, gr, gc, mask)
        acc_z += gz * hp
        acc_r += gr * hp
        acc_c += gc * hp * r
    store3(da_ptr + n * 3 * Ds + lanes, Ds, tl.sum(acc_z, axis=0), tl.sum(acc_r, axis=0), tl.sum(acc_c, axis=0), lmask)


_CELL = FusedNewton("flashgru_fused", _gru_fwd_kernel, _gru_bwd_kernel, {"a": 3}, 1, ch=128)


def flashgru_fused(
    u: torch.Tensor,
    a: torch.Tensor,
    iters: int = 3,
    tol: float | None = None,
    stats: bool = False,
    *,
    tiles: NewtonTiles | None = None,
    skip: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashGRU states by fused Newton; see the module docstring. Differentiable in ``u, a``.
    ``tiles``: chunk and channel tile (default ``128`` steps, 4 warps, 8 channels or 4 for small launches:
    ``FusedNewton.default_tiles``). ``skip``: a one-element bool tensor; where it holds true (read on the
    device) no Newton iteration runs and the result is the initial guess ``f(0, u_t)`` per position
    (a re-solve inside a CUDA graph that only matters when the first solve failed its check)."""
    return _CELL(u, a, iters=iters, tol=tol, stats=stats, tiles=tiles, skip=skip)


def flashgru_sequential(u: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """FlashGRU states ``h (H, B, L, Ds)`` of the loop, in one forward launch (module docstring);
    ``u (H, B, L, 3, Ds)``, ``a (H, 3, Ds)`` float32, contiguous. Differentiable in ``u, a``."""
    return _CELL.sequential(u, a)
