"""Fused Newton for FlashLSTM (paper 000 eq. 7b + 9): forward and backward, one Triton kernel each.

``flashlstm_fused(u, a, p, iters=3, tol=None, stats=False) -> (state, residuals)``

- ``u (H, B, L, 3, Ds)`` float32: input pre-activations ``x @ B + b`` of the gates (f, z, o);
- ``a (H, 3, Ds)``: diagonal state weights ``(a_f, a_z, a_o)``; ``p (H, 2, Ds)``: peepholes
  ``(c_f, c_o)``;
- ``state (H, B, L, 2 Ds)`` = ``[c, h]`` per position, with ``(c_{-1}, h_{-1}) = 0`` and
  ``f = sigmoid(a_f h + u_f + c_f c_prev)``, ``z = tanh(a_z h + u_z)``, ``c = f c_prev + (1 - f) z``,
  ``o = sigmoid(a_o h + u_o + c_o c)``, ``h = o tanh(c)``;
- ``residuals (iters + 1,)``: as in ``gru_kernels`` (max over both state halves).

The Jacobian is a 2x2 block of diagonals (eq. 8); the chunked Newton and the exclusive scan are
described in ``common_kernels.py``. The backward (``flashlstm_fused_bwd``) is one reverse pass of
``lambda_t = dL/ds_t + J_{t+1}^T lambda_{t+1}`` with ``du``, ``da`` and ``dp`` fused.
Custom ops: ``expressivity::flashlstm_fused``, ``expressivity::flashlstm_fused_bwd``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seqkernels.newton.common_kernels import (
    chunk_masks,
    compose2,
    compose2_excl,
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
def _peepholes(ptr, Ds, lmask):
    """The peephole vectors ``(c_f, c_o)`` (``(2, Ds)`` at ``ptr``) as ``[1, BD]`` rows."""
    pf = tl.load(ptr, mask=lmask, other=0.0)[None, :]
    po = tl.load(ptr + Ds, mask=lmask, other=0.0)[None, :]
    return pf, po


@triton.jit
def _f0(uf, uz, uo, po):
    """``f(0, u)`` -> ``(c, h)``."""
    c = (1.0 - sigmoid(uf)) * tanh(uz)
    return c, sigmoid(uo + po * c) * tanh(c)


@triton.jit
def _cell(cp, hp, uf, uz, uo, af, az, ao, pf, po):
    """``f((c, h)_prev, u)`` and its 2x2-block Jacobian ``[[J_cc, J_ch], [J_hc, J_hh]]`` (eq. 8)."""
    f = sigmoid(af * hp + uf + pf * cp)
    z = tanh(az * hp + uz)
    c = f * cp + (1.0 - f) * z
    o = sigmoid(ao * hp + uo + po * c)
    tc = tanh(c)
    df = (cp - z) * f * (1.0 - f)
    j_cc = f + df * pf
    j_ch = df * af + (1.0 - f) * (1.0 - z * z) * az
    do = tc * o * (1.0 - o)
    dh_dc = do * po + o * (1.0 - tc * tc)
    return c, o * tc, j_cc, j_ch, dh_dc * j_cc, do * ao + dh_dc * j_ch


@triton.jit
def _lstm_fwd_kernel(
    u_ptr,
    a_ptr,
    p_ptr,
    s_ptr,
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
    af, az, ao = param_rows3(a_ptr + head * 3 * Ds + lanes, Ds, lmask)
    pf, po = _peepholes(p_ptr + head * 2 * Ds + lanes, Ds, lmask)
    ubase = u_ptr + n.to(tl.int64) * L * 3 * Ds
    sbase = s_ptr + n.to(tl.int64) * L * 2 * Ds
    idx = tl.arange(0, CH)
    first = (idx == 0)[:, None]
    last = (idx == CH - 1)[:, None]
    c_carry = tl.zeros([BD], dtype=tl.float32)
    h_carry = tl.zeros([BD], dtype=tl.float32)
    for m in range(0, tl.cdiv(L, CH)):
        rows = m * CH + idx
        mask, pmask, _next = chunk_masks(rows, L, lmask)  # (no `_`: the Newton loop reassigns it with another type)
        uo_ = rows[:, None] * (3 * Ds) + lanes[None, :]
        uf, uz, uo = load3(ubase + uo_, Ds, mask)
        qf, qz, qo = load3(ubase + uo_ - 3 * Ds, Ds, pmask)
        c, h = _f0(uf, uz, uo, po)  # eq. 10: s^0_t = f(0, u_t)
        cp, hp = _f0(qf, qz, qo, po)
        cp = tl.where(first, c_carry[None, :], cp)  # exact at the chunk's start
        hp = tl.where(first, h_carry[None, :], hp)
        k = tl.full([], 0, tl.int32)
        conv = tl.full([], 0, tl.int32)
        while (k < iters) & (conv == 0):
            fc, fh, j00, j01, j10, j11 = _cell(cp, hp, uf, uz, uo, af, az, ao, pf, po)
            rc = tl.where(mask, fc - c, 0.0)
            rh = tl.where(mask, fh - h, 0.0)
            if HAS_TOL or STATS:
                rmax = tl.max(tl.max(tl.maximum(tl.abs(rc), tl.abs(rh)), axis=1), axis=0)
                if STATS:
                    tl.atomic_max(res_ptr + k, rmax)
                if HAS_TOL:
                    conv = (rmax <= tol).to(tl.int32)
            if conv == 0:
                one = tl.full([CH, BD], 1.0, tl.float32)
                zero = tl.zeros([CH, BD], dtype=tl.float32)
                out = tl.associative_scan(
                    (j00, j01, j10, j11, rc, rh, one, zero, zero, one, zero, zero), 0, compose2_excl
                )
                ec = out[10]  # delta_{t-1}
                eh = out[11]
                c = fc + j00 * ec + j01 * eh
                h = fh + j10 * ec + j11 * eh
                cp = cp + ec
                hp = hp + eh
            k += 1
        if STATS:
            if conv == 0:
                fc, fh, _, _, _, _ = _cell(cp, hp, uf, uz, uo, af, az, ao, pf, po)
                err = tl.maximum(tl.abs(fc - c), tl.abs(fh - h))
                rmax = tl.max(tl.max(tl.where(mask, err, 0.0), axis=1), axis=0)
                tl.atomic_max(res_ptr + k, rmax)
        so = rows[:, None] * (2 * Ds) + lanes[None, :]
        tl.store(sbase + so, c, mask=mask)
        tl.store(sbase + so + Ds, h, mask=mask)
        c_carry = row_of(c, last)
        h_carry = row_of(h, last)


@triton.jit
def _lstm_bwd_kernel(
    u_ptr,
    a_ptr,
    p_ptr,
    s_ptr,
    gs_ptr,
    du_ptr,
    da_ptr,
    dp_ptr,
    B,
    L,
    Ds,
    n_st,
    CH: tl.constexpr,
    BD: tl.constexpr,
):
    n, head, lanes, lmask = lane_tile(tl.program_id(0), n_st, B, Ds, BD)
    af, az, ao = param_rows3(a_ptr + head * 3 * Ds + lanes, Ds, lmask)
    pf, po = _peepholes(p_ptr + head * 2 * Ds + lanes, Ds, lmask)
    uoff = n.to(tl.int64) * L * 3 * Ds
    soff = n.to(tl.int64) * L * 2 * Ds
    idx = tl.arange(0, CH)
    chunk_start = (idx == CH - 1)[:, None]  # the chunk's first step sits in the tile's last row
    lc_carry = tl.zeros([BD], dtype=tl.float32)
    lh_carry = tl.zeros([BD], dtype=tl.float32)
    acc_af = tl.zeros([CH, BD], dtype=tl.float32)
    acc_az = tl.zeros([CH, BD], dtype=tl.float32)
    acc_ao = tl.zeros([CH, BD], dtype=tl.float32)
    acc_pf = tl.zeros([CH, BD], dtype=tl.float32)
    acc_po = tl.zeros([CH, BD], dtype=tl.float32)
    n_chunks = tl.cdiv(L, CH)
    for i in range(0, n_chunks):
        rows = (n_chunks - 1 - i) * CH + (CH - 1 - idx)  # reversed rows: the adjoint scan runs forward over the tile
        mask, pmask, nmask = chunk_masks(rows, L, lmask)
        so = soff + rows[:, None] * (2 * Ds) + lanes[None, :]
        c = tl.load(s_ptr + so, mask=mask, other=0.0)
        h = tl.load(s_ptr + so + Ds, mask=mask, other=0.0)
        cp = tl.load(s_ptr + so - 2 * Ds, mask=pmask, other=0.0)
        hp = tl.load(s_ptr + so - Ds, mask=pmask, other=0.0)
        gc = tl.load(gs_ptr + so, mask=mask, other=0.0)
        gh = tl.load(gs_ptr + so + Ds, mask=mask, other=0.0)
        uo_ = uoff + rows[:, None] * (3 * Ds) + lanes[None, :]
        uf, uz, uo = load3(u_ptr + uo_, Ds, mask)
        nf, nz, no = load3(u_ptr + uo_ + 3 * Ds, Ds, nmask)
        # J_{t+1} at (s_t, u_{t+1}); the adjoint uses its transpose
        _, _, j00, j01, j10, j11 = _cell(c, h, nf, nz, no, af, az, ao, pf, po)
        j00 = tl.where(nmask, j00, 0.0)
        j01 = tl.where(nmask, j01, 0.0)
        j10 = tl.where(nmask, j10, 0.0)
        j11 = tl.where(nmask, j11, 0.0)
        P00, P01, P10, P11, Yc, Yh = tl.associative_scan((j00, j10, j01, j11, gc, gh), 0, compose2)
        lc = Yc + P00 * lc_carry[None, :] + P01 * lh_carry[None, :]
        lh = Yh + P10 * lc_carry[None, :] + P11 * lh_carry[None, :]
        lc_carry = row_of(lc, chunk_start)
        lh_carry = row_of(lh, chunk_start)
        # local gradients of step t at (s_{t-1}, u_t)
        f = sigmoid(af * hp + uf + pf * cp)
        z = tanh(az * hp + uz)
        cc = f * cp + (1.0 - f) * z
        o = sigmoid(ao * hp + uo + po * cc)
        tc = tanh(cc)
        g_op = lh * tc * o * (1.0 - o)
        g_c = lc + lh * o * (1.0 - tc * tc) + g_op * po
        g_fp = g_c * (cp - z) * f * (1.0 - f)
        g_zp = g_c * (1.0 - f) * (1.0 - z * z)
        store3(du_ptr + uo_, Ds, g_fp, g_zp, g_op, mask)
        acc_af += g_fp * hp
        acc_az += g_zp * hp
        acc_ao += g_op * hp
        acc_pf += g_fp * cp
        acc_po += g_op * cc
    store3(
        da_ptr + n * 3 * Ds + lanes, Ds, tl.sum(acc_af, axis=0), tl.sum(acc_az, axis=0), tl.sum(acc_ao, axis=0), lmask
    )
    dpp = dp_ptr + n * 2 * Ds + lanes
    tl.store(dpp, tl.sum(acc_pf, axis=0), mask=lmask)
    tl.store(dpp + Ds, tl.sum(acc_po, axis=0), mask=lmask)


_CELL = FusedNewton("flashlstm_fused", _lstm_fwd_kernel, _lstm_bwd_kernel, {"a": 3, "p": 2}, 2, ch=64)


def flashlstm_fused(
    u: torch.Tensor,
    a: torch.Tensor,
    p: torch.Tensor,
    iters: int = 3,
    tol: float | None = None,
    stats: bool = False,
    *,
    tiles: NewtonTiles | None = None,
    skip: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashLSTM states ``[c, h]`` by fused Newton; see the module docstring. Differentiable in ``u, a, p``.
    ``tiles``: chunk and channel tile (default ``64`` steps, 4 warps, 8 channels or 4 for small launches:
    ``FusedNewton.default_tiles``). ``skip``: a one-element bool tensor; where it holds true (read on the
    device) no Newton iteration runs and the result is the initial guess ``f(0, u_t)`` per position
    (a re-solve inside a CUDA graph that only matters when the first solve failed its check)."""
    return _CELL(u, a, p, iters=iters, tol=tol, stats=stats, tiles=tiles, skip=skip)


def flashlstm_sequential(u: torch.Tensor, a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """FlashLSTM states ``[c, h] (H, B, L, 2 Ds)`` of the loop, in one forward launch: one-step chunks
    and one iteration, each from the exact previous state (``gru_kernels.flashgru_sequential``);
    ``u (H, B, L, 3, Ds)``, ``a (H, 3, Ds)``, ``p (H, 2, Ds)`` float32, contiguous. Differentiable."""
    return _CELL.sequential(u, a, p)
