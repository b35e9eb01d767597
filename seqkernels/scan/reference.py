"""Reference first-order linear recurrences: a plain loop over time, float64-capable.

Diagonal:   ``y_t = c_t * y_{t-1} + x_t``            with ``c, x, y (B, L, D)``, ``y_{-1} = 0``.
2x2 block:  ``y_t[i] = sum_j C_t[i, j] * y_{t-1}[j] + x_t[i]`` per channel ``d``, with
            ``C (B, L, 2, 2, D)``, ``x, y (B, L, 2, D)``.
Reverse (``reverse=True``): ``y_t = c_t * y_{t+1} + x_t`` with ``y_L = 0`` -- the coefficient at
the *same* index ``t``, scanning from the end.
"""

from __future__ import annotations

import torch


def _check(c: torch.Tensor, x: torch.Tensor, c_extra: tuple, x_extra: tuple, name: str) -> None:
    if not isinstance(c, torch.Tensor) or not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: c and x must be tensors, got {type(c).__name__} and {type(x).__name__}")
    if x.dim() != 2 + len(x_extra) + 1 or c.dim() != 2 + len(c_extra) + 1:
        raise ValueError(
            f"{name}: expected c (B, L{''.join(', ' + str(e) for e in c_extra)}, D) and "
            f"x (B, L{''.join(', ' + str(e) for e in x_extra)}, D), got c {tuple(c.shape)} and x {tuple(x.shape)}"
        )
    B, L, D = x.shape[0], x.shape[1], x.shape[-1]
    want_c = (B, L, *c_extra, D)
    if tuple(c.shape) != want_c or tuple(x.shape[2:-1]) != x_extra:
        raise ValueError(f"{name}: c has shape {tuple(c.shape)}, expected {want_c} to match x {tuple(x.shape)}")
    if c.device != x.device:
        raise ValueError(f"{name}: c is on {c.device} but x is on {x.device}")


def _loop(step, x: torch.Tensor, reverse: bool) -> torch.Tensor:
    """``y_t = step(t, y_{t -/+ 1})`` from ``y = 0``, stacked along dim 1 (``x`` gives shapes)."""
    L = x.shape[1]
    if L == 0:
        return x.clone()
    y = torch.zeros_like(x[:, 0])
    out = [None] * L
    for t in reversed(range(L)) if reverse else range(L):
        y = out[t] = step(t, y)
    return torch.stack(out, dim=1)


def linear_scan_reference(c: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Diagonal recurrence by a loop. ``c, x (B, L, D)`` -> ``y (B, L, D)`` (dtype of ``x``)."""
    _check(c, x, (), (), "linear_scan_reference")
    return _loop(lambda t, y: c[:, t] * y + x[:, t], x, reverse)


def linear_scan_block2_reference(C: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """2x2-block recurrence by a loop. ``C (B, L, 2, 2, D)``, ``x (B, L, 2, D)`` -> ``y (B, L, 2, D)``."""
    _check(C, x, (2, 2), (2,), "linear_scan_block2_reference")
    # y_new[i] = sum_j C[i, j] * y[j] + x[i]
    return _loop(lambda t, y: (C[:, t] * y.unsqueeze(1)).sum(dim=2) + x[:, t], x, reverse)


def linear_scan_dense_reference(C: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Dense recurrence by a loop: ``y_t = C_t @ y_{t-1} + x_t``.

    ``C (B, L, D, D)`` with ``C_t[i, j]`` multiplying ``y_{t-1}[j]`` into ``y_t[i]``; ``x (B, L, D)``.
    """
    check_dense(C, x, "linear_scan_dense_reference")
    return _loop(lambda t, y: torch.einsum("bij,bj->bi", C[:, t], y) + x[:, t], x, reverse)


def check_dense(C: torch.Tensor, x: torch.Tensor, name: str) -> None:
    if not isinstance(C, torch.Tensor) or not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: C and x must be tensors")
    if x.dim() != 3 or tuple(C.shape) != (*x.shape, x.shape[-1]):
        raise ValueError(
            f"{name}: expected C (B, L, D, D) and x (B, L, D), got C {tuple(C.shape)} and x {tuple(x.shape)}"
        )
