"""First-order linear recurrences (scans), diagonal, 2x2-block and dense, forward and reverse.

``linear_scan(c, x, reverse=False, backend="auto")``: ``y_t = c_t * y_{t-1} + x_t`` with
``c, x (B, L, D)`` -> ``y (B, L, D)`` (reverse: ``y_t = c_t * y_{t+1} + x_t``, same-index
coefficient). ``linear_scan_block2(C, x, reverse=False, backend="auto")``: ``C (B, L, 2, 2, D)``,
``x (B, L, 2, D)``, ``y_t[i] = sum_j C_t[i, j] y_{t-1}[j] + x_t[i]``.
``linear_scan_dense(C, x, reverse=False, backend="auto")``: ``C (B, L, D, D)``, ``x (B, L, D)``,
``y_t = C_t @ y_{t-1} + x_t`` (reference and torch only; used for dense Jacobians).

Backends (``seqkernels/README.md``): ``"reference"`` (a loop, ``reference.py``), ``"torch"`` (log-step
doubling, ``pytorch.py``), ``"triton"`` (single-pass chunked scans with a fused backward,
``triton_ops.py``); ``"auto"``: ``triton`` for CUDA tensors of float32/bfloat16/float16, else ``torch``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from seqkernels._dispatch import AUTO, resolve
from seqkernels.scan.pytorch import linear_scan_block2_torch, linear_scan_dense_torch, linear_scan_torch
from seqkernels.scan.reference import (
    linear_scan_block2_reference,
    linear_scan_dense_reference,
    linear_scan_reference,
)

# backend name -> (diagonal scan, 2x2-block scan)
SCAN_BACKENDS: dict[str, tuple[Callable, Callable]] = {
    "reference": (linear_scan_reference, linear_scan_block2_reference),
    "torch": (linear_scan_torch, linear_scan_block2_torch),
}

try:  # Triton is optional (e.g. macOS)
    from seqkernels.scan.triton_ops import linear_scan_block2_triton, linear_scan_triton
    from seqkernels.scan.triton_ops import supports as _triton_supports

    SCAN_BACKENDS["triton"] = (linear_scan_triton, linear_scan_block2_triton)
except ImportError:  # pragma: no cover
    _triton_supports = None

DENSE_SCAN_BACKENDS: dict[str, Callable] = {
    "reference": linear_scan_dense_reference,
    "torch": linear_scan_dense_torch,
}


def resolve_backend(backend: str, c: torch.Tensor, x: torch.Tensor) -> str:
    """The backend ``backend`` (``"auto"`` included) stands for on these inputs."""
    ok = backend == AUTO and _triton_supports is not None and x.is_cuda and _triton_supports(c, x)
    return resolve("scan", backend, SCAN_BACKENDS, x, ok)


def linear_scan(c: torch.Tensor, x: torch.Tensor, reverse: bool = False, backend: str = "auto") -> torch.Tensor:
    """Diagonal linear recurrence; see the module docstring."""
    return SCAN_BACKENDS[resolve_backend(backend, c, x)][0](c, x, reverse=reverse)


def linear_scan_block2(C: torch.Tensor, x: torch.Tensor, reverse: bool = False, backend: str = "auto") -> torch.Tensor:
    """2x2-block linear recurrence; see the module docstring."""
    return SCAN_BACKENDS[resolve_backend(backend, C, x)][1](C, x, reverse=reverse)


def linear_scan_dense(C: torch.Tensor, x: torch.Tensor, reverse: bool = False, backend: str = "auto") -> torch.Tensor:
    """Dense (matrix) linear recurrence; see the module docstring."""
    return DENSE_SCAN_BACKENDS[resolve("dense scan", backend, DENSE_SCAN_BACKENDS, x, False)](C, x, reverse=reverse)


__all__ = [
    "DENSE_SCAN_BACKENDS",
    "SCAN_BACKENDS",
    "linear_scan",
    "linear_scan_block2",
    "linear_scan_block2_reference",
    "linear_scan_block2_torch",
    "linear_scan_dense",
    "linear_scan_dense_reference",
    "linear_scan_dense_torch",
    "linear_scan_reference",
    "linear_scan_torch",
    "resolve_backend",
]
