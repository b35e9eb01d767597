"""Reference SSD (Mamba2's state space dual layer): the recurrence, one step at a time.

Per head ``h`` (with group ``g = h // (H / G)`` supplying ``B`` and ``C``) and time ``t``:

    state_t = exp(dt_t * A) * state_{t-1} + dt_t * x_t B_t^T        state (P, N)
    y_t     = state_t C_t                                            y (P,)

``x (batch, L, H, P)``, ``dt (batch, L, H)`` (already positive, e.g. ``softplus`` of a projection),
``A (H,)`` (negative), ``B, C (batch, L, G, N)``, ``initial_state (batch, H, P, N)`` or ``None``
(zeros). Returns ``(y (batch, L, H, P), final_state (batch, H, P, N))`` in the dtype of ``x``; run
it on float64 inputs for a ground truth. The skip term ``D * x`` is added by ``seqkernels.ssd.ssd``.
"""

from __future__ import annotations

import torch


def ssd_reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_size``: accepted for the chunked forms' signature; a step loop has no chunks."""
    batch, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    B = B.repeat_interleave(H // G, dim=2)  # (batch, L, H, N): each head reads its group's B, C
    C = C.repeat_interleave(H // G, dim=2)
    dt, A = dt.to(x.dtype), A.to(x.dtype)
    state = x.new_zeros(batch, H, P, N) if initial_state is None else initial_state.to(x.dtype)
    ys = []
    for t in range(L):
        decay = torch.exp(dt[:, t] * A)  # (batch, H)
        state = decay[:, :, None, None] * state + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, t]))
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(batch, 0, H, P)
    return y, state
