"""The two Triton kernels of the SSD chunked scan; ``triton_ops.py`` composes them.

Notation (per batch ``b``, head ``h``, chunk ``c`` of ``Q`` steps): ``acum_t`` is the cumulative
sum of ``dt * A`` inside the chunk, ``dt_t`` the step size (both float32, laid out
``(batch, H, Lp)`` with ``Lp`` the length padded to a multiple of ``Q``; padded steps have
``dt = 0``). Sequence tensors are ``(batch, L, heads_of_tensor, dim)`` with any strides; a tensor
with fewer heads than ``H`` (``B``, ``C`` per group) is read at head ``h // ratio``.

``chunk_state``: the chunk states and the recurrence across chunks in one pass (paper 004's fused
inter-chunk recurrence); a program owns one ``(DU, DV)`` tile of one ``(b, h)`` state and walks
the ``BS``-step blocks of the sequence in one flat loop (in order, or backwards), keeping the state
in registers and folding each block into it with one product (the next blocks' loads overlap it):
- forward:  ``out[c] = prev_c`` (``out[0] = init``, ``out[nc]`` = final) with
  ``prev_{c+1} = exp(acum_last_c) prev_c + sum_{s in c} dt_s exp(acum_last_c - acum_s) U_s (x) V_s``
  (``U = x``, ``V = B``: the state entering each chunk);
- reverse:  ``out[nc] = init`` (the final state's gradient) and
  ``out[c] = exp(acum_last_c) out[c+1] + sum_{s in c} exp(acum_s) U_s (x) V_s``
  (``U = dy``, ``V = C``: the gradient reaching the state entering each chunk), plus this tile's
  share of ``<out[c+1], exp(acum_last_c) prev[c]>`` (the decay gradient of the carried state).

``chunk_attn``: the quadratic, attention-like form inside a chunk plus a state term:
- causal:      ``out_t = sum_{s<=t} (Q_t.K_s) exp(acum_t - acum_s) dt_s V_s + exp(acum_t) Q_t S_c``
- anticausal:  ``out_s = dt_s [sum_{t>=s} (Q_s.K_t) exp(acum_t - acum_s) V_t + exp(acum_last - acum_s) Q_s S_c]``
Optionally (``HAS_DOT``) ``dot_t = state_t . W_t`` per head, ``state_t`` being the state term
alone (``exp(acum_t) Q_t S_c``, or in reverse the bracket's ``exp(acum_last - acum_s) Q_s S_c``),
and (``FULL_DOT``) ``full_t = acc_t . W_t`` with ``acc`` one head's whole sum (in reverse, the
bracket before the ``dt_s`` factor); optionally (``HAS_CB``) ``Q_t . K_s`` is read from a
precomputed ``(Q, Q)`` matrix per chunk and group instead of being recomputed per head.
``DDA`` (causal only, used with ``Q = dy``, ``K = x``, ``CB_ts = C_t . B_s`` from ``cb``): the
intra-chunk part of the gradient of ``a_r = dt_r A``, ``sum_{t >= r > s} M_ts`` with
``M_ts = (dy_t.x_s)(C_t.B_s) exp(acum_t - acum_s) dt_s``, summed from per-element terms (no
difference of large row and column sums): a running row prefix sum over ``s`` (``tl.cumsum``),
then a column sum over rows ``t > s``, written at ``r = s + 1`` into ``dda (batch, H, Q / BT, Lp)``
(one slice per row tile, zero-initialised, summed by the caller).
A program owns ``BT`` rows of one chunk and walks the columns it needs (causal: up to its last
row; anticausal: from its first) in blocks of ``BC`` (``BT % BC == 0``; ``BC < BT`` gives the
pipeline more, smaller blocks, ``(BT, BC)`` score tiles, and masks less of the diagonal).
``S_c`` is ``(DK, DV)``. With ``HPP > 1`` a program sums its output over ``HPP`` consecutive heads
(gradients of ``B``, ``C`` shared by the heads of a group). Accumulation is float32; ``PREC`` is
the ``input_precision`` of every ``tl.dot`` (float32 inputs: ``"tf32"`` or ``"tf32x3"``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_state_kernel(
    u_ptr,
    v_ptr,
    init_ptr,
    out_ptr,
    p_ptr,
    dot_ptr,
    acum_ptr,
    dt_ptr,
    L,
    H,
    Lp,
    nc,
    DU,
    DV,
    rv,
    su_b,
    su_l,
    su_h,
    su_d,
    sv_b,
    sv_l,
    sv_h,
    sv_d,
    si_b,
    si_h,
    si_r,
    si_k,
    so_b,
    so_c,
    so_h,
    so_r,
    so_k,
    sp_b,
    sp_c,
    sp_h,
    sp_r,
    sp_k,
    Q: tl.constexpr,
    BS: tl.constexpr,
    BU: tl.constexpr,
    BV: tl.constexpr,
    REVERSE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    PREC: tl.constexpr,
):
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    nv = tl.cdiv(DV, BV)
    du = (tl.program_id(1) // nv) * BU + tl.arange(0, BU)
    dv = (tl.program_id(1) % nv) * BV + tl.arange(0, BV)
    tile_ok = (du[:, None] < DU) & (dv[None, :] < DV)
    tile = du[:, None] * so_r + dv[None, :] * so_k
    base = b * H * Lp + h * Lp
    state = tl.zeros((BU, BV), dtype=tl.float32)
    if HAS_INIT:
        state += tl.load(
            init_ptr + b * si_b + h * si_h + du[:, None] * si_r + dv[None, :] * si_k, mask=tile_ok, other=0.0
        )
    out = out_ptr + b * so_b + h * so_h
    dtype = out_ptr.dtype.element_ty
    tl.store(out + (nc if REVERSE else 0) * so_c + tile, state.to(dtype), mask=tile_ok)
    NB: tl.constexpr = Q // BS  # step blocks per chunk
    # one flat loop over the step blocks (in reverse order for REVERSE), so that the loads of the
    # next blocks overlap this block's product; per-chunk work is predicated on the block's place
    for i in range(nc * NB):
        if REVERSE:
            k = nc * NB - 1 - i + 0 * b  # + 0 * b: a tensor under the interpreter too (masks below)
        else:
            k = i + 0 * b
        c = k // NB
        j = k % NB
        s = k * BS + tl.arange(0, BS)
        u = tl.load(
            u_ptr + b * su_b + s[:, None] * su_l + h * su_h + du[None, :] * su_d,
            mask=(s[:, None] < L) & (du[None, :] < DU),
            other=0.0,
        )
        v = tl.load(
            v_ptr + b * sv_b + s[:, None] * sv_l + (h // rv) * sv_h + dv[None, :] * sv_d,
            mask=(s[:, None] < L) & (dv[None, :] < DV),
            other=0.0,
        )
        a = tl.load(acum_ptr + base + s)
        if REVERSE:  # G_c = exp(acum_last_c) G_{c+1} + sum_{s in c} exp(acum_s) U_s (x) V_s
            a_last = tl.load(acum_ptr + base + c * Q + Q - 1)
            if j == NB - 1:  # the chunk's last block comes first: state = G_{c+1}
                prev = tl.load(
                    p_ptr + b * sp_b + c * sp_c + h * sp_h + du[:, None] * sp_r + dv[None, :] * sp_k,
                    mask=tile_ok,
                    other=0.0,
                ).to(tl.float32)
                tl.store(
                    dot_ptr + ((b * nc + c) * H + h) * tl.num_programs(1) + tl.program_id(1),
                    tl.sum(tl.sum(state * prev, 1), 0) * tl.exp(a_last),
                )
            scale = tl.where(j == NB - 1, tl.exp(a_last), 1.0)
            w = tl.exp(a)
        else:  # the state at the block's end: exp(a_end - a_start) state + sum dt_s exp(a_end - a_s) U_s (x) V_s
            a_end = tl.load(acum_ptr + base + k * BS + BS - 1)
            a_start = tl.load(acum_ptr + base + k * BS - 1, mask=j > 0, other=0.0)  # 0 at a chunk's start
            scale = tl.exp(a_end - a_start)
            w = tl.exp(a_end - a) * tl.load(dt_ptr + base + s)
        state = tl.dot(tl.trans((u * w[:, None]).to(v.dtype)), v, state * scale, input_precision=PREC)
        if REVERSE:
            if j == 0:  # the chunk's first block: state = G_c
                tl.store(out + c * so_c + tile, state.to(dtype), mask=tile_ok)
        else:
            if j == NB - 1:  # the chunk's last block: state = prev_{c+1}
                tl.store(out + (c + 1) * so_c + tile, state.to(dtype), mask=tile_ok)


@triton.jit
def chunk_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    s_ptr,
    w_ptr,
    cb_ptr,
    out_ptr,
    dot_ptr,
    full_ptr,
    dda_ptr,
    acum_ptr,
    dt_ptr,
    L,
    H,
    Lp,
    DK,
    DV,
    n_out,
    rq,
    rk,
    rv,
    rw,
    rcb,
    sq_b,
    sq_l,
    sq_h,
    sq_d,
    sk_b,
    sk_l,
    sk_h,
    sk_d,
    sv_b,
    sv_l,
    sv_h,
    sv_d,
    ss_b,
    ss_c,
    ss_h,
    ss_r,
    ss_k,
    sw_b,
    sw_l,
    sw_h,
    sw_d,
    scb_b,
    scb_c,
    scb_h,
    scb_r,
    scb_k,
    so_b,
    so_l,
    so_h,
    so_d,
    Q: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HPP: tl.constexpr,
    REVERSE: tl.constexpr,
    HAS_DOT: tl.constexpr,
    FULL_DOT: tl.constexpr,
    HAS_CB: tl.constexpr,
    DDA: tl.constexpr,
    PREC: tl.constexpr,
):
    c = tl.program_id(0) // (Q // BT)
    tile = tl.program_id(0) % (Q // BT)
    t0 = c * Q + tile * BT
    b = tl.program_id(1) // n_out
    o = tl.program_id(1) % n_out
    rows = t0 + tl.arange(0, BT)
    dk = tl.arange(0, BK)
    dv = tl.arange(0, BV)
    row_ok = rows < L
    total = tl.zeros((BT, BV), dtype=tl.float32)
    for i in range(HPP):
        h = o * HPP + i
        base = b * H * Lp + h * Lp
        a_rows = tl.load(acum_ptr + base + rows)
        q = tl.load(
            q_ptr + b * sq_b + rows[:, None] * sq_l + (h // rq) * sq_h + dk[None, :] * sq_d,
            mask=row_ok[:, None] & (dk[None, :] < DK),
            other=0.0,
        )
        s_tile = tl.load(
            s_ptr + b * ss_b + c * ss_c + h * ss_h + dk[:, None] * ss_r + dv[None, :] * ss_k,
            mask=(dk[:, None] < DK) & (dv[None, :] < DV),
            other=0.0,
        )
        acc = tl.zeros((BT, BV), dtype=tl.float32)
        carry = tl.zeros((BT,), dtype=tl.float32)  # DDA: sum of the row's M over the column tiles done
        if REVERSE:
            lo = t0
            hi = c * Q + Q
        else:
            lo = c * Q
            hi = t0 + BT
        for j in range(lo, hi, BC):  # BC-column blocks (BT % BC == 0), pipelined over num_stages
            cols = j + tl.arange(0, BC)
            col_ok = cols < L
            v = tl.load(
                v_ptr + b * sv_b + cols[:, None] * sv_l + (h // rv) * sv_h + dv[None, :] * sv_d,
                mask=col_ok[:, None] & (dv[None, :] < DV),
                other=0.0,
            )
            a_cols = tl.load(acum_ptr + base + cols)
            if HAS_CB:  # Q.K precomputed per chunk and group, shared by the group's heads
                scores = tl.load(
                    cb_ptr
                    + b * scb_b
                    + c * scb_c
                    + (h // rcb) * scb_h
                    + (rows - c * Q)[:, None] * scb_r
                    + (cols - c * Q)[None, :] * scb_k
                )
            else:
                k = tl.load(
                    k_ptr + b * sk_b + cols[:, None] * sk_l + (h // rk) * sk_h + dk[None, :] * sk_d,
                    mask=col_ok[:, None] & (dk[None, :] < DK),
                    other=0.0,
                )
                scores = tl.dot(q, tl.trans(k), input_precision=PREC)
            if REVERSE:
                keep = cols[None, :] >= rows[:, None]
                decay = tl.exp(tl.where(keep, a_cols[None, :] - a_rows[:, None], float("-inf")))
            else:
                keep = cols[None, :] <= rows[:, None]
                dt_cols = tl.load(dt_ptr + base + cols)
                decay = tl.exp(tl.where(keep, a_rows[:, None] - a_cols[None, :], float("-inf"))) * dt_cols[None, :]
            weights = scores * decay
            acc += tl.dot(weights.to(v.dtype), v, input_precision=PREC)
            if DDA:  # causal only: d(dt*A)_r += sum_{t >= r > s} M_ts, M_ts = weights_ts * CB_ts for s < t
                cbv = tl.load(
                    cb_ptr
                    + b * scb_b
                    + c * scb_c
                    + (h // rcb) * scb_h
                    + (rows - c * Q)[:, None] * scb_r
                    + (cols - c * Q)[None, :] * scb_k
                )
                m = tl.where(cols[None, :] < rows[:, None], weights * cbv, 0.0)
                run = carry[:, None] + tl.cumsum(m, axis=1)  # run_ts = sum_{s' <= s} M_ts'
                carry += tl.sum(m, axis=1)
                part = tl.sum(tl.where(rows[:, None] > cols[None, :], run, 0.0), axis=0)  # for r = s + 1
                tl.store(dda_ptr + (base * (Q // BT) + tile * Lp) + cols + 1, part, mask=cols + 1 < c * Q + Q)
        state = tl.dot(q, s_tile.to(q.dtype), input_precision=PREC)
        if REVERSE:
            a_last = tl.load(acum_ptr + base + c * Q + Q - 1)
            state = tl.exp(a_last - a_rows)[:, None] * state
        else:
            state = tl.exp(a_rows)[:, None] * state
        if HAS_DOT:
            w = tl.load(
                w_ptr + b * sw_b + rows[:, None] * sw_l + (h // rw) * sw_h + dv[None, :] * sw_d,
                mask=row_ok[:, None] & (dv[None, :] < DV),
                other=0.0,
            ).to(tl.float32)
            tl.store(dot_ptr + base + rows, tl.sum(state * w, axis=1))
        acc += state
        if FULL_DOT:
            tl.store(full_ptr + base + rows, tl.sum(acc * w, axis=1))
        if REVERSE:
            total += acc * tl.load(dt_ptr + base + rows)[:, None]
        else:
            total += acc
    tl.store(
        out_ptr + b * so_b + rows[:, None] * so_l + o * so_h + dv[None, :] * so_d,
        total.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (dv[None, :] < DV),
    )
