"""FlashGRU / FlashLSTM recurrence steps and closed-form Jacobians as pure functions (paper 000).

Shared by ``mixers.cells.flash`` (which wraps them in ``RNNCell``s) and by benchmarks that time
``newton_apply`` against ``sequential_apply`` without the ``mixers`` package. Inputs are the
pre-activations ``u = x @ B + b`` of shape ``(..., 3, Ds)``; the diagonal weights ``a (..., 3, Ds)``
and peepholes ``p (..., 2, Ds)`` broadcast against the states (e.g. ``(3, Ds)`` for one head, or
``(H, 1, 1, 3, Ds)`` for states ``(H, B, L, Ds)``).

FlashGRU (eq. 7a + 9; gates z, r, c), state ``h (..., Ds)``::

    z = s(a_z h + u_z)   r = s(a_r h + u_r)   c = tanh(a_c (h r) + u_c)   h' = (1 - z) h + z c

FlashLSTM (eq. 7b + 9; gates f, z, o; peepholes c_f, c_o), state ``[c, h] (..., 2 Ds)``::

    f = s(a_f h + u_f + c_f c_prev)   z = tanh(a_z h + u_z)   c = f c_prev + (1 - f) z
    o = s(a_o h + u_o + c_o c)        h = o tanh(c)
"""

from __future__ import annotations

import torch


def _dsigmoid(s: torch.Tensor) -> torch.Tensor:
    """sigmoid' from the sigmoid's value."""
    return s * (1 - s)


def _gru_gates(h, u, a):
    z = torch.sigmoid(a[..., 0, :] * h + u[..., 0, :])
    r = torch.sigmoid(a[..., 1, :] * h + u[..., 1, :])
    c = torch.tanh(a[..., 2, :] * (h * r) + u[..., 2, :])
    return z, r, c


def flashgru_step(h: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """One FlashGRU step: ``h (..., Ds)``, ``u (..., 3, Ds)``, ``a (..., 3, Ds)`` -> ``h' (..., Ds)``."""
    z, _, c = _gru_gates(h, u, a)
    return (1 - z) * h + z * c


def flashgru_jacobian(h: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Eq. 8, diagonal: ``(1-z) + (c-h) s'(z^) a_z + z tanh'(c^) a_c (r + h s'(r^) a_r)``, ``(..., Ds)``."""
    z, r, c = _gru_gates(h, u, a)
    a_z, a_r, a_c = a[..., 0, :], a[..., 1, :], a[..., 2, :]
    return (1 - z) + (c - h) * _dsigmoid(z) * a_z + z * (1 - c * c) * a_c * (r + h * _dsigmoid(r) * a_r)


def _lstm_gates(state, u, a, p):
    Ds = state.shape[-1] // 2
    c_prev, h = state[..., :Ds], state[..., Ds:]
    f = torch.sigmoid(a[..., 0, :] * h + u[..., 0, :] + p[..., 0, :] * c_prev)
    z = torch.tanh(a[..., 1, :] * h + u[..., 1, :])
    c = f * c_prev + (1 - f) * z
    o = torch.sigmoid(a[..., 2, :] * h + u[..., 2, :] + p[..., 1, :] * c)
    return c_prev, f, z, c, o


def flashlstm_step(state: torch.Tensor, u: torch.Tensor, a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """One FlashLSTM step: ``state = [c, h] (..., 2 Ds)``, ``u, a (..., 3, Ds)``, ``p (..., 2, Ds)``."""
    _, _, _, c, o = _lstm_gates(state, u, a, p)
    return torch.cat([c, o * torch.tanh(c)], dim=-1)


def flashlstm_jacobian(state: torch.Tensor, u: torch.Tensor, a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Eq. 8 with diagonal blocks: ``(..., 2, 2, Ds)`` = ``[[J_cc, J_ch], [J_hc, J_hh]]``."""
    c_prev, f, z, c, o = _lstm_gates(state, u, a, p)
    a_f, a_z, a_o = a[..., 0, :], a[..., 1, :], a[..., 2, :]
    c_f, c_o = p[..., 0, :], p[..., 1, :]
    tc = torch.tanh(c)
    df = (c_prev - z) * _dsigmoid(f)
    J_cc = f + df * c_f
    J_ch = df * a_f + (1 - f) * (1 - z * z) * a_z
    do = tc * _dsigmoid(o)  # d h / d o^
    dh_dc = do * c_o + o * (1 - tc * tc)  # through c directly and through the peephole
    J_hc = dh_dc * J_cc
    J_hh = do * a_o + dh_dc * J_ch
    return torch.stack([torch.stack([J_cc, J_ch], dim=-2), torch.stack([J_hc, J_hh], dim=-2)], dim=-3)
