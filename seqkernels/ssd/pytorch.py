"""SSD in chunks, plain PyTorch: quadratic within a chunk, recurrent across chunks.

The same function as ``reference.ssd_reference`` (same arguments), computed as Mamba2's state
space duality decomposes it. Cut the sequence into chunks of ``Q`` steps, let
``a_t = dt_t * A`` and ``Acum_t`` its cumulative sum inside the chunk. Then

1. inside a chunk (the "attention-like" quadratic form)
       y_t  = sum_{s <= t} (C_t . B_s) exp(Acum_t - Acum_s) dt_s x_s
2. the state each chunk adds
       S_c  = sum_s exp(Acum_last - Acum_s) dt_s x_s B_s^T                       (P, N)
3. the states entering each chunk, a diagonal linear recurrence over chunks (``seqkernels.scan``)
       prev_{c+1} = exp(Acum_last_c) prev_c + S_c,       prev_0 = initial_state
4. what the entering state contributes
       y_t += exp(Acum_t) prev_c C_t

The length is padded to a multiple of ``Q`` with ``dt = 0`` steps (decay 1, no input), which leave
the final state unchanged. Autograd differentiates through plain ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqkernels.scan import linear_scan


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    Q = chunk_size
    pad = (-L) % Q
    nc = (L + pad) // Q
    dt = dt.to(x.dtype)

    def chunks(t: torch.Tensor) -> torch.Tensor:  # (batch, L, ...) -> (batch, nc, Q, ...)
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(batch, nc, Q, *t.shape[2:])

    xc, dtc = chunks(x), chunks(dt)
    Bc = chunks(B).repeat_interleave(H // G, dim=3)  # (batch, nc, Q, H, N)
    Cc = chunks(C).repeat_interleave(H // G, dim=3)
    acum = torch.cumsum(dtc * A.to(x.dtype), dim=2)  # (batch, nc, Q, H)

    # 1. intra-chunk: decay[t, s] = exp(Acum_t - Acum_s) for s <= t, else 0
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    seg = (acum[:, :, :, None, :] - acum[:, :, None, :, :]).masked_fill(~causal[:, :, None], -torch.inf)
    scores = torch.einsum("bcthn,bcshn->bctsh", Cc, Bc) * torch.exp(seg)
    y = torch.einsum("bctsh,bcshp->bcthp", scores, xc * dtc[..., None])

    # 2. chunk states
    to_end = torch.exp(acum[:, :, -1:] - acum) * dtc  # (batch, nc, Q, H)
    states = torch.einsum("bcsh,bcshp,bcshn->bchpn", to_end, xc, Bc)

    # 3. inter-chunk recurrence over [initial, S_0, ..., S_{nc-1}]: element k is prev_k
    init = states.new_zeros(batch, 1, H, P, N) if initial_state is None else initial_state.to(x.dtype)[:, None]
    inputs = torch.cat([init, states], dim=1)
    decay = torch.cat([torch.ones_like(acum[:, :1, 0]), torch.exp(acum[:, :, -1])], dim=1)  # (batch, nc+1, H)
    coeff = decay[..., None, None].expand_as(inputs)
    # the chunk axis is short: the log-step torch scan suffices on any device
    prev = linear_scan(coeff.reshape(batch, nc + 1, -1), inputs.reshape(batch, nc + 1, -1), backend="torch")
    prev = prev.reshape(batch, nc + 1, H, P, N)

    # 4. entering state -> outputs
    y = y + torch.einsum("bchpn,bcthn,bcth->bcthp", prev[:, :-1], Cc, torch.exp(acum))
    return y.reshape(batch, nc * Q, H, P)[:, :L], prev[:, -1]
