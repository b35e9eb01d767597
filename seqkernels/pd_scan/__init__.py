"""PD scan: the linear recurrence of PD-SSM, transitions a column one-hot matrix times a diagonal.

``pd_scan(index, d, x, backend="auto")``: ``y_t = P_t D_t y_{t-1} + x_t``, ``y_{-1} = 0``, where
``P_t`` has one 1 per column (column ``n`` in row ``index_t[n]``) and ``D_t = diag(d_t)``::

    y_t[m] = sum_{n : index_t[n] = m} d_t[n] y_{t-1}[n] + x_t[m]

Shapes: ``index (B, L, N)`` int64 in ``[0, N)``, ``d, x (B, L, N, C)`` with ``C = 1`` (real) or
``C = 2`` (complex as (real, imaginary) pairs) -> ``y (B, L, N, C)``. Gradients flow to ``d`` and
``x`` (``index`` is discrete).

Backends (vocabulary: ``seqkernels/README.md``): ``"reference"`` (the loop, ``reference.py``),
``"torch"`` (log-step parallel scan over the P·D form, ``O(N)`` per combine, ``pytorch.py``);
``"auto"``: ``"torch"``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from seqkernels._dispatch import resolve
from seqkernels.pd_scan.pytorch import pd_scan_torch
from seqkernels.pd_scan.reference import multiply, pd_scan_reference

PD_SCAN_BACKENDS: dict[str, Callable] = {"reference": pd_scan_reference, "torch": pd_scan_torch}


def pd_scan(index: torch.Tensor, d: torch.Tensor, x: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """The PD recurrence; see the module docstring."""
    return PD_SCAN_BACKENDS[resolve("pd_scan", backend, PD_SCAN_BACKENDS, x)](index, d, x)


__all__ = ["PD_SCAN_BACKENDS", "multiply", "pd_scan", "pd_scan_reference", "pd_scan_torch"]
