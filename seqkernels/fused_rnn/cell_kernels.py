"""The pointwise cells of ``reference.py`` as Triton device functions, forward and backward.

Shared by the fused persistent kernel (``fused.py``) and the alternating pointwise kernels
(``alternating.py``). Every function works on register tiles of any shape, in the accumulation
dtype (float32, or float64 for float64 inputs).

What the forward keeps for the backward, per time step ("saved slots", float32/float64):

    elman  [h]
    lstm   [h, c, i, f, tz, o]                          (i, f, o after the sigmoid, tz = tanh(z))
    gru    [h, g, r, z, a]                              (g = R_g h + b_g, r/z after the sigmoid,
                                                         a = tanh(n + r g))
    slstm  [h, c, n, ig, fg, tz, o, sf, fi]             (ig = exp(i - m), fg = exp(log σ(f) + m_prev - m),
                                                         sf = σ(f), fi = 1 where m took the input gate)

Slots ``0 .. N_s' - 1`` are states (h; c; n), so the slots of the step before give the previous
states (slot row 0 holds the initial states).

Backward (paper 001 eq. 3-4): given the total gradient ``dh`` reaching ``h_t`` and the carried
gradients of the other states, each ``*_bwd`` returns the gate gradients (equal to the input and
bias gradients, eq. 5-6) and the gradients flowing to the previous states (not through R).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: cell ids (the kernels' CELL constexpr)
CELL_IDS = {"elman": 0, "lstm": 1, "gru": 2, "slstm": 3}
ELMAN, LSTM, GRU, SLSTM = (tl.constexpr(i) for i in CELL_IDS.values())
#: saved slots per time step, per cell (see the module docstring)
NUM_SAVED = {"elman": 1, "lstm": 6, "gru": 5, "slstm": 9}
#: how many leading saved slots are states (h, c, n)
NUM_SAVED_STATES = {"elman": 1, "lstm": 2, "gru": 1, "slstm": 3}


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tanh(x):
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def logsigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


# ---------------------------------------------------------------- forward


@triton.jit
def elman_fwd(zp):
    """-> h"""
    return tanh(zp)


@triton.jit
def lstm_fwd(ip, fp, zp, op, c_prev):
    """-> h, c, i, f, tz, o"""
    i = sigmoid(ip)
    f = sigmoid(fp)
    tz = tanh(zp)
    o = sigmoid(op)
    c = f * c_prev + i * tz
    h = o * tanh(c)
    return h, c, i, f, tz, o


@triton.jit
def gru_fwd(g, rp, zp, npre, h_prev):
    """``g = R_g h + b_g``, ``rp``/``zp`` pre-activations, ``npre = W_n x + b_n`` -> h, r, z, a"""
    r = sigmoid(rp)
    z = sigmoid(zp)
    a = tanh(npre + r * g)
    h = z * h_prev + (1.0 - z) * a
    return h, r, z, a


@triton.jit
def slstm_fwd(ip, fp, zp, op, c_prev, n_prev, m_prev):
    """-> h, c, n, m, ig, fg, tz, o, sf, fi (eq. 12-15; m = i where n_prev == 0)"""
    log_f = logsigmoid(fp)
    lfm = log_f + m_prev
    from_i = (n_prev == 0.0) | (ip >= lfm)
    m = tl.where(from_i, ip, lfm)
    fg = tl.exp(lfm - m)
    ig = tl.exp(ip - m)
    tz = tanh(zp)
    o = sigmoid(op)
    c = fg * c_prev + ig * tz
    n = fg * n_prev + ig
    h = o * c / n
    sf = sigmoid(fp)
    fi = tl.where(from_i, 1.0, 0.0)
    return h, c, n, m, ig, fg, tz, o, sf, fi


# ---------------------------------------------------------------- backward


@triton.jit
def elman_bwd(dh, h):
    """-> dz"""
    return dh * (1.0 - h * h)


@triton.jit
def lstm_bwd(dh, dc, c, c_prev, i, f, tz, o):
    """-> di, df, dz, do, dc_prev"""
    tc = tanh(c)
    dct = dc + dh * o * (1.0 - tc * tc)
    do = dh * tc * o * (1.0 - o)
    di = dct * tz * i * (1.0 - i)
    df = dct * c_prev * f * (1.0 - f)
    dz = dct * i * (1.0 - tz * tz)
    return di, df, dz, do, dct * f


@triton.jit
def gru_bwd(dh, h_prev, g, r, z, a):
    """-> dg, dr, dz, dn (pre-activation gradients) and dh_prev (the direct part, not through R)"""
    dzp = dh * (h_prev - a) * z * (1.0 - z)
    dap = dh * (1.0 - z) * (1.0 - a * a)
    drp = dap * g * r * (1.0 - r)
    dg = dap * r
    return dg, drp, dzp, dap, dh * z


@triton.jit
def slstm_bwd(dh, dc, dn, dm, c, n, c_prev, n_prev, ig, fg, tz, o, sf, fi):
    """-> di, df, dz, do, dc_prev, dn_prev, dm_prev"""
    dct = dc + dh * o / n
    dnt = dn - dh * o * c / (n * n)
    do = dh * (c / n) * o * (1.0 - o)
    dz = dct * ig * (1.0 - tz * tz)
    a_f = (dct * c_prev + dnt * n_prev) * fg  # d/d(log σ(f) + m_prev - m)
    a_i = (dct * tz + dnt) * ig  # d/d(i - m)
    dm_new = dm - a_f - a_i
    di = a_i + fi * dm_new
    dlogf = a_f + (1.0 - fi) * dm_new
    df = dlogf * (1.0 - sf)
    return di, df, dz, do, dct * fg, dnt * fg, dlogf
