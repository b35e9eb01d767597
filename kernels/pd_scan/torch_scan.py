"""The PD scan as a log-step parallel scan in plain PyTorch (any length, autograd through plain ops).

Same signature and result as ``reference.pd_scan_reference``. A step ``y -> P D y + x`` is held as
``(index, d, x)``; two steps compose into one of the same form in ``O(N)``:

    (P2 D2)(P1 D1) = (P2 P1) diag(d2[index1]) D1,   i.e.
    index = index2[index1],   d = d2[index1] * d1,   x = scatter_add(index2, d2 * x1) + x2

(``index2[index1]``: the composed column map; ``d2[index1]``: the later diagonal gathered where the
earlier step sent each lane). Hillis--Steele doubling: after the step with offset ``s`` position ``t``
holds the steps ``t - 2s + 1 .. t`` composed (identity before the start): ``ceil(log2 L)`` rounds of
gathers and scatter-adds, ``O(L N log L)`` work, no host reads (CUDA-graph capturable).
"""

from __future__ import annotations

import torch

from kernels.pd_scan.reference import check, multiply


def _shift(t: torch.Tensor, s: int, fill: torch.Tensor) -> torch.Tensor:
    """``t`` shifted right by ``s`` along dim 1, the first ``s`` positions ``fill`` (broadcast)."""
    pad = fill.expand_as(t[:, :s])
    return torch.cat([pad, t[:, : t.shape[1] - s]], dim=1)


def pd_scan_torch(index: torch.Tensor, d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The PD recurrence by log-step doubling; see the module docstring."""
    check(index, d, x, "pd_scan_torch")
    L, N, C = x.shape[1], x.shape[2], x.shape[3]
    identity_index = torch.arange(N, device=x.device)
    one = torch.zeros(C, dtype=x.dtype, device=x.device)
    one[0] = 1.0
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    s = 1
    while s < L:
        index_prev, x_prev = _shift(index, s, identity_index), _shift(x, s, zero)
        spread = index[..., None].expand_as(x)
        x = x.scatter_add(2, spread, multiply(d, x_prev))  # x2 + P2 D2 x1
        if 2 * s < L:  # the composed transition is not needed after the last round
            d_prev = _shift(d, s, one)
            gathered = torch.gather(d, 2, index_prev[..., None].expand_as(d))  # d2[index1]
            d = multiply(gathered, d_prev)
            index = torch.gather(index, 2, index_prev)  # index2[index1]
        s *= 2
    return x.clone() if L <= 1 else x
