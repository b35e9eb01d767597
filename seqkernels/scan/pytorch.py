"""Log-step parallel linear scans in plain PyTorch (any length, autograd through plain ops).

Same signatures and semantics as ``seqkernels.scan.reference``. Hillis--Steele doubling (paper 003):
after the step with offset ``s`` every ``y_t`` holds the recurrence folded over the last ``2s``
inputs, with the composed coefficient ``c_t * c_{t-1} * ... * c_{t-2s+1}``; ``ceil(log2 L)`` steps,
``O(L log L)`` work, each step a handful of elementwise ops over the whole sequence. ``reverse=True``
flips time, scans, and flips back (the coefficient stays at the same index).
"""

from __future__ import annotations

import torch

from seqkernels.scan.reference import _check, check_dense


def _shift(t: torch.Tensor, s: int, fill: float) -> torch.Tensor:
    """``t`` shifted right by ``s`` along dim 1, the first ``s`` positions filled with ``fill``."""
    pad = torch.full_like(t[:, :s], fill)
    return torch.cat([pad, t[:, : t.shape[1] - s]], dim=1)


def linear_scan_torch(c: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Diagonal ``y_t = c_t * y_{t-1} + x_t``. ``c, x (B, L, D)`` -> ``y (B, L, D)``."""
    _check(c, x, (), (), "linear_scan_torch")
    if reverse:
        return linear_scan_torch(c.flip(1), x.flip(1)).flip(1)
    L, s = x.shape[1], 1
    while s < L:
        x = x + c * _shift(x, s, 0.0)
        if 2 * s < L:  # the composed coefficient is not needed after the last step
            c = c * _shift(c, s, 1.0)
        s *= 2
    return x.clone() if L <= 1 else x


def linear_scan_block2_torch(C: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """2x2-block ``y_t = C_t y_{t-1} + x_t`` per channel. ``C (B, L, 2, 2, D)``, ``x (B, L, 2, D)``.

    The 2x2 products are written out entrywise (much faster than ``einsum`` on tiny blocks).
    """
    _check(C, x, (2, 2), (2,), "linear_scan_block2_torch")
    if reverse:
        return linear_scan_block2_torch(C.flip(1), x.flip(1)).flip(1)
    L, s = x.shape[1], 1
    a, b, c, d = (C[:, :, i, j].contiguous() for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
    x0, x1 = x[:, :, 0].contiguous(), x[:, :, 1].contiguous()
    while s < L:
        p0, p1 = _shift(x0, s, 0.0), _shift(x1, s, 0.0)
        x0, x1 = x0 + a * p0 + b * p1, x1 + c * p0 + d * p1
        if 2 * s < L:  # C_t <- C_t @ C_{t-s} (identity before the start)
            pa, pb, pc, pd = _shift(a, s, 1.0), _shift(b, s, 0.0), _shift(c, s, 0.0), _shift(d, s, 1.0)
            a, b, c, d = a * pa + b * pc, a * pb + b * pd, c * pa + d * pc, c * pb + d * pd
        s *= 2
    return torch.stack([x0, x1], dim=2)


def linear_scan_dense_torch(C: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Dense ``y_t = C_t @ y_{t-1} + x_t``. ``C (B, L, D, D)``, ``x (B, L, D)``; ``O(L log L D^3)`` work."""
    check_dense(C, x, "linear_scan_dense_torch")
    if reverse:
        return linear_scan_dense_torch(C.flip(1), x.flip(1)).flip(1)
    L, s = x.shape[1], 1
    while s < L:
        x = x + torch.einsum("blij,blj->bli", C, _shift(x, s, 0.0))
        if 2 * s < L:
            eye = torch.eye(C.shape[-1], dtype=C.dtype, device=C.device).expand(C.shape[0], s, -1, -1)
            C = C @ torch.cat([eye, C[:, : L - s]], dim=1)
        s *= 2
    return x.clone() if L <= 1 else x
