"""Device functions shared by the fused Newton kernels (``gru_kernels.py``, ``lstm_kernels.py``).

Algorithm (paper 000 App. D.2, "the same block sequentially processes consecutive segments"):
one program owns ``BD`` state channels of one (head, batch row) for the whole sequence and walks
it in chunks of ``CH`` steps. On each chunk it runs *all* Newton iterations in registers --
Jacobians and residuals, then the bi-diagonal solve as one ``tl.associative_scan`` -- starting from
the exact final state of the previous chunk, writes the states once, and carries the last state on.
Memory traffic is the minimum: the inputs ``u`` read once, the states written once.

The Newton update needs ``h_{t-1}`` next to ``h_t``; instead of shifting registers, the scan carries
the *exclusive* result too: for a segment of steps, ``(A, Y)`` maps a carry-in ``c`` to the last
value ``A c + Y`` and ``(A', Y')`` to the one before it, ``A' c + Y'``. With a zero carry-in
``Y'_t = delta_{t-1}`` and the iterate updates are ``h_t <- f(h_{t-1}, u_t) + J_t delta_{t-1}`` and
``h_{t-1} <- h_{t-1} + delta_{t-1}``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tanh(x):
    t = tl.exp(-2.0 * tl.abs(x))
    v = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -v, v)


@triton.jit
def row_of(v, sel):
    """The row of a ``[CH, BD]`` tile picked by the one-hot column ``sel [CH, 1]`` -> ``[BD]``."""
    return tl.sum(tl.where(sel, v, 0.0), axis=0)


@triton.jit
def lane_tile(pid, n_st, B, Ds, BD: tl.constexpr):
    """Program ``pid``'s work: sequence row ``n`` of the ``H * B`` rows (``pid // n_st``), its head
    ``n // B``, and the ``BD`` state channels of channel tile ``pid % n_st`` with their mask ``< Ds``."""
    n = pid // n_st
    lanes = (pid % n_st) * BD + tl.arange(0, BD)
    return n, n // B, lanes, lanes < Ds


@triton.jit
def chunk_masks(rows, L, lmask):
    """Masks of a ``[CH, BD]`` tile at positions ``rows [CH]``: in range; with a previous position in
    range (``rows >= 1``); with a next one (``rows + 1 < L``)."""
    here = (rows < L)[:, None] & lmask[None, :]
    prev = ((rows >= 1) & (rows < L))[:, None] & lmask[None, :]
    nxt = (rows + 1 < L)[:, None] & lmask[None, :]
    return here, prev, nxt


@triton.jit
def load3(ptr, Ds, mask):
    """The three gate planes at ``ptr``, ``ptr + Ds``, ``ptr + 2 Ds`` (0 where ``mask`` is off)."""
    return (
        tl.load(ptr, mask=mask, other=0.0),
        tl.load(ptr + Ds, mask=mask, other=0.0),
        tl.load(ptr + 2 * Ds, mask=mask, other=0.0),
    )


@triton.jit
def param_rows3(ptr, Ds, lmask):
    """Three per-gate parameter vectors ``(3, Ds)`` at ``ptr`` (the lanes' entries) as ``[1, BD]`` rows."""
    a0, a1, a2 = load3(ptr, Ds, lmask)
    return a0[None, :], a1[None, :], a2[None, :]


@triton.jit
def store3(ptr, Ds, v0, v1, v2, mask):
    """Store three gate planes at ``ptr``, ``ptr + Ds``, ``ptr + 2 Ds``."""
    tl.store(ptr, v0, mask=mask)
    tl.store(ptr + Ds, v1, mask=mask)
    tl.store(ptr + 2 * Ds, v2, mask=mask)


@triton.jit
def compose_excl(a1, y1, p1, q1, a2, y2, p2, q2):
    """Segment composition keeping the exclusive result: ``(A, Y, A', Y')`` (module docstring)."""
    return a1 * a2, a2 * y1 + y2, p2 * a1, p2 * y1 + q2


@triton.jit
def compose(a1, y1, a2, y2):
    """``(a1, y1)`` then ``(a2, y2)``: ``y -> a2 * (a1 * y + y1) + y2``."""
    return a1 * a2, a2 * y1 + y2


@triton.jit
def _mm(a00, a01, a10, a11, b00, b01, b10, b11):
    """``A @ B`` for 2x2 blocks of diagonals."""
    return a00 * b00 + a01 * b10, a00 * b01 + a01 * b11, a10 * b00 + a11 * b10, a10 * b01 + a11 * b11


@triton.jit
def compose2(a00, a01, a10, a11, y0, y1, b00, b01, b10, b11, z0, z1):
    """2x2 blocks: ``(A, y)`` then ``(B, z)`` is ``(B A, B y + z)``."""
    m00, m01, m10, m11 = _mm(b00, b01, b10, b11, a00, a01, a10, a11)
    return m00, m01, m10, m11, b00 * y0 + b01 * y1 + z0, b10 * y0 + b11 * y1 + z1


@triton.jit
def compose2_excl(
    a00,
    a01,
    a10,
    a11,
    y0,
    y1,
    p00,
    p01,
    p10,
    p11,
    q0,
    q1,
    b00,
    b01,
    b10,
    b11,
    z0,
    z1,
    s00,
    s01,
    s10,
    s11,
    w0,
    w1,
):
    """``compose_excl`` for 2x2 blocks: ``(A, Y, A', Y')`` with ``A`` 2x2 and ``Y`` 2-vectors."""
    m00, m01, m10, m11 = _mm(b00, b01, b10, b11, a00, a01, a10, a11)
    n00, n01, n10, n11 = _mm(s00, s01, s10, s11, a00, a01, a10, a11)
    return (
        m00,
        m01,
        m10,
        m11,
        b00 * y0 + b01 * y1 + z0,
        b10 * y0 + b11 * y1 + z1,
        n00,
        n01,
        n10,
        n11,
        s00 * y0 + s01 * y1 + w0,
        s10 * y0 + s11 * y1 + w1,
    )
