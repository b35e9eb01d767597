"""Reference PD scan: the recurrence ``y_t = P_t D_t y_{t-1} + x_t`` step by step, float64-capable.

``P_t`` is column one-hot (column ``n`` has its single 1 in row ``index_t[n]``) and ``D_t`` diagonal,
so one step moves lane ``n`` of the state, scaled by ``d_t[n]``, into lane ``index_t[n]`` (lanes sent
to the same row add up)::

    y_t[m] = sum_{n : index_t[n] = m} d_t[n] * y_{t-1}[n] + x_t[m],        y_{-1} = 0

Shapes: ``index (B, L, N)`` int64 in ``[0, N)``; ``d, x (B, L, N, C)`` with ``C = 1`` (real numbers)
or ``C = 2`` (complex numbers as (real, imaginary) pairs); returns ``y (B, L, N, C)``.
"""

from __future__ import annotations

import torch


def check(index: torch.Tensor, d: torch.Tensor, x: torch.Tensor, name: str) -> None:
    """One-line ``TypeError`` / ``ValueError`` for inputs the PD scan does not take."""
    if not all(isinstance(t, torch.Tensor) for t in (index, d, x)):
        raise TypeError(f"{name}: index, d and x must be tensors")
    if index.dtype != torch.int64:
        raise TypeError(f"{name}: index must be int64, got {index.dtype}")
    if not d.is_floating_point() or d.dtype != x.dtype:
        raise TypeError(f"{name}: d and x must be floating point of one dtype, got {d.dtype} and {x.dtype}")
    if x.dim() != 4 or x.shape[-1] not in (1, 2) or d.shape != x.shape or index.shape != x.shape[:3]:
        raise ValueError(
            f"{name}: expected index (B, L, N), d and x (B, L, N, C) with C 1 (real) or 2 (complex), "
            f"got index {tuple(index.shape)}, d {tuple(d.shape)}, x {tuple(x.shape)}"
        )
    if not index.device == d.device == x.device:
        raise ValueError(f"{name}: index, d and x must be on one device")


def multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise product of real (``C = 1``) or complex (``C = 2``, (re, im) pairs) numbers."""
    if a.shape[-1] == 1:
        return a * b
    ar, ai, br, bi = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    return torch.stack([ar * br - ai * bi, ar * bi + ai * br], dim=-1)


def pd_scan_reference(index: torch.Tensor, d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The PD recurrence by a loop over time; see the module docstring."""
    check(index, d, x, "pd_scan_reference")
    L = x.shape[1]
    y = torch.zeros_like(x[:, 0])
    out = []
    for t in range(L):
        moved = multiply(d[:, t], y)  # lane n scaled by d_t[n]
        target = index[:, t, :, None].expand_as(moved)
        y = torch.zeros_like(moved).scatter_add(1, target, moved) + x[:, t]  # ... sent to row index_t[n]
        out.append(y)
    return torch.stack(out, dim=1) if out else x.clone()
