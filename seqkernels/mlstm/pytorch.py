"""Chunkwise-parallel mLSTM in plain PyTorch (paper 002 §2.2, App. B.2 and C.1); forward only,
gradients by autograd. Same signature and result as ``reference.mlstm_parallel``.

The sequence is split into ``NC = ceil(S / L)`` chunks of ``L = chunk_size`` steps (the last one
padded with no-op steps: forget gate 1, input gate 0). Per chunk ``c`` with log forget gates
``f~``, log input gates ``i~``:
  b = cumsum(f~)          (eq. 37)   g = sum(f~)  (eq. 36)   a = g - b + i~  (eq. 38)
the inter-chunk recurrence carries the stabilized states (eq. 12-13, max state ``M``),
  M_c = max(g + M_{c-1}, max(a)),  C_c = exp(g + M_{c-1} - M_c) C_{c-1} + (K * exp(a - M_c))^T V,
and each chunk's output combines the intra-chunk part (eq. 14-16, 18) with the inter-chunk part
(eq. 17) under the combined max state (App. C.1 eq. 99-100).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from seqkernels._validate import positive_int
from seqkernels.mlstm.reference import _finish, _initial, check_args, compute_dtype, log_gates


def mlstm_chunkwise(
    q, k, v, i_pre, f_pre, *, input_gate="exp", chunk_size=64, initial_state=None, return_last_state=False, eps=1e-6
):
    """Chunkwise mLSTM; shapes and states as in ``seqkernels.mlstm.mlstm``."""
    B, NH, S, DQK, DV = check_args(q, k, v, i_pre, f_pre, input_gate, initial_state)
    positive_int("chunk_size", chunk_size)
    out_dtype = q.dtype
    dt = compute_dtype(q.dtype)
    L = chunk_size
    NC = -(-S // L)
    pad = NC * L - S
    q, k, v = (F.pad(x.to(dt), (0, 0, 0, pad)).reshape(B, NH, NC, L, -1) for x in (q, k, v))
    log_i, log_f = log_gates(i_pre.to(dt), f_pre.to(dt), input_gate)
    log_i = F.pad(log_i, (0, pad), value=-math.inf).reshape(B, NH, NC, L)  # padded steps: no input
    log_f = F.pad(log_f, (0, pad), value=0.0).reshape(B, NH, NC, L)  # ... and no forgetting
    b = torch.cumsum(log_f, dim=-1)
    g = b[..., -1]
    a = g[..., None] - b + log_i
    exp_gate = input_gate == "exp"

    # inter-chunk recurrence: the states entering every chunk
    C, n, M = _initial(initial_state, input_gate, B, NH, DQK, DV, dt, q.device)
    Cs, ns, Ms = [], [], []
    for c in range(NC):
        Cs.append(C), ns.append(n), Ms.append(M)
        M_new = torch.maximum(g[..., c] + M, a[..., c, :].amax(-1)).detach() if exp_gate else M
        decay = torch.exp(g[..., c] + M - M_new)
        ka = k[:, :, c] * torch.exp(a[..., c, :] - M_new[..., None])[..., None]
        C = decay[..., None, None] * C + ka.transpose(-1, -2) @ v[:, :, c]
        n = decay[..., None] * n + ka.sum(-2)
        M = M_new
    C_prev, n_prev, M_prev = torch.stack(Cs, 2), torch.stack(ns, 2), torch.stack(Ms, 2)

    # intra-chunk parallel part, combined with the inter-chunk part
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    log_D = (b[..., :, None] - b[..., None, :] + log_i[..., None, :]).masked_fill(~causal, -math.inf)
    if exp_gate:
        m = torch.maximum(b + M_prev[..., None], log_D.amax(-1)).detach()  # eq. 99
    else:
        m = torch.zeros_like(b)
    D = torch.exp(log_D - m[..., None])
    w_inter = torch.exp(b + M_prev[..., None] - m)
    qs = q / math.sqrt(DQK)
    Sm = (qs @ k.transpose(-1, -2)) * D
    num = Sm @ v + w_inter[..., None] * (qs @ C_prev)
    if exp_gate:
        dot = Sm.sum(-1) + w_inter * (qs @ n_prev[..., None])[..., 0]
        h = num / (torch.maximum(dot.abs(), torch.exp(-m)) + eps)[..., None]  # eq. 100
    else:
        h = num
    h = h.reshape(B, NH, NC * L, DV)[:, :, :S]
    return _finish(h, (C, n, M), out_dtype, return_last_state, input_gate)
