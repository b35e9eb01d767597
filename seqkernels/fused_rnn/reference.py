"""Reference for the FlashRNN family (paper 001 eq. 1-2): a plain PyTorch loop over time.

Generic form with N_s states and gates per cell, per head ``h`` (block-diagonal recurrent matrix):

    g_t = Wx_t + R^T s_{t-1}^{(0)} + b                      (eq. 1; s^{(0)} is the hidden state)
    s_t = P(s_{t-1}, g_t)                                   (eq. 2; the cell's pointwise update)

Shapes (B batch, T time, NH heads, DH head dim; G_x / G_r / G_b gates, per cell below):
    wx      (B, T, NH, G_x, DH)   input pre-activations (the input projection W x_t, outside)
    R       (NH, DH, G_r, DH)     recurrent weights: ry[b,h,g,j] = sum_i s0[b,h,i] R[h,i,g,j]
    b       (NH, G_b, DH)         biases
    states  (N_s, B, NH, DH)      state 0 is the hidden state h

Cells (states; gates of wx / R / b):
    elman  (h;          wx: z         R: z         b: z):        h = tanh(z)
    lstm   (h, c;       wx: i f z o   R: i f z o   b: i f z o):  c = σ(f) c + σ(i) tanh(z); h = σ(o) tanh(c)
    gru    (h;          wx: r z n     R: g r z     b: g r z n):  h = σ(z) h + (1 − σ(z)) tanh(n + σ(r) g)
           (paper 001 eq. 11 in FlashRNN's form: g = R_g h + b_g has no input part, n = W_n x + b_n
           no recurrent part — the cuDNN/PyTorch GRU)
    slstm  (h, c, n, m; wx: i f z o   R: i f z o   b: i f z o):  eq. 12-15 with the stabilizer m;
           on the first step (n == 0) m = i, which keeps n >= 1 afterwards.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class CellSpec:
    """Gate and state counts of a cell."""

    num_states: int
    input_gates: int
    recurrent_gates: int
    bias_gates: int


CELLS: dict[str, CellSpec] = {
    "elman": CellSpec(num_states=1, input_gates=1, recurrent_gates=1, bias_gates=1),
    "lstm": CellSpec(num_states=2, input_gates=4, recurrent_gates=4, bias_gates=4),
    "gru": CellSpec(num_states=1, input_gates=3, recurrent_gates=3, bias_gates=4),
    "slstm": CellSpec(num_states=4, input_gates=4, recurrent_gates=4, bias_gates=4),
}


def cell_spec(cell: str) -> CellSpec:
    if cell not in CELLS:
        raise ValueError(f"unknown cell {cell!r}; known cells: {', '.join(CELLS)}")
    return CELLS[cell]


def pointwise(cell: str, wx: torch.Tensor, ry: torch.Tensor, b: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """One step of the cell: ``wx (B, NH, G_x, DH)``, ``ry (B, NH, G_r, DH)``, ``b (NH, G_b, DH)``,
    ``states (N_s, B, NH, DH)`` -> new states ``(N_s, B, NH, DH)``."""
    if cell == "elman":
        return torch.tanh(wx[:, :, 0] + ry[:, :, 0] + b[:, 0]).unsqueeze(0)
    if cell == "lstm":
        i, f, z, o = (wx + ry + b).unbind(dim=2)
        c = torch.sigmoid(f) * states[1] + torch.sigmoid(i) * torch.tanh(z)
        return torch.stack([torch.sigmoid(o) * torch.tanh(c), c])
    if cell == "gru":
        g = ry[:, :, 0] + b[:, 0]
        r = wx[:, :, 0] + ry[:, :, 1] + b[:, 1]
        z = torch.sigmoid(wx[:, :, 1] + ry[:, :, 2] + b[:, 2])
        n = wx[:, :, 2] + b[:, 3]
        return (z * states[0] + (1 - z) * torch.tanh(n + torch.sigmoid(r) * g)).unsqueeze(0)
    if cell == "slstm":
        i, f, z, o = (wx + ry + b).unbind(dim=2)
        _, c, n, m = states.unbind(0)
        log_f = F.logsigmoid(f)
        m_new = torch.where(n == 0, i, torch.maximum(log_f + m, i))
        f_gate = torch.exp(log_f + m - m_new)
        i_gate = torch.exp(i - m_new)
        c_new = f_gate * c + i_gate * torch.tanh(z)
        n_new = f_gate * n + i_gate
        return torch.stack([torch.sigmoid(o) * c_new / n_new, c_new, n_new, m_new])
    raise ValueError(f"unknown cell {cell!r}; known cells: {', '.join(CELLS)}")


def check_inputs(
    cell: str, wx: torch.Tensor, R: torch.Tensor, b: torch.Tensor, states0: torch.Tensor | None
) -> CellSpec:
    """Validate shapes against ``cell``; raises ``ValueError`` naming the mismatch."""
    spec = cell_spec(cell)
    if wx.dim() != 5:
        raise ValueError(f"wx must be (B, T, NH, G_x, DH), got shape {tuple(wx.shape)}")
    bsz, _, nh, _, dh = wx.shape
    expected = {
        "wx": ((bsz, wx.shape[1], nh, spec.input_gates, dh), tuple(wx.shape)),
        "R": ((nh, dh, spec.recurrent_gates, dh), tuple(R.shape)),
        "b": ((nh, spec.bias_gates, dh), tuple(b.shape)),
    }
    if states0 is not None:
        expected["states0"] = ((spec.num_states, bsz, nh, dh), tuple(states0.shape))
    for name, (want, got) in expected.items():
        if want != got:
            raise ValueError(f"{cell}: {name} must have shape {want}, got {got}")
    return spec


def fused_rnn_reference(
    cell: str,
    wx: torch.Tensor,
    R: torch.Tensor,
    b: torch.Tensor,
    states0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``cell`` over time. Returns ``(h (B, T, NH, DH), last_states (N_s, B, NH, DH))``.

    ``states0`` defaults to zeros. Differentiable by autograd in every input.
    """
    spec = check_inputs(cell, wx, R, b, states0)
    bsz, length, nh, _, dh = wx.shape
    states = states0 if states0 is not None else wx.new_zeros(spec.num_states, bsz, nh, dh)
    outputs = []
    for t in range(length):
        ry = torch.einsum("bhi,higj->bhgj", states[0], R)
        states = pointwise(cell, wx[:, t], ry, b, states)
        outputs.append(states[0])
    h = torch.stack(outputs, dim=1) if outputs else wx.new_zeros(bsz, 0, nh, dh)
    return h, states
