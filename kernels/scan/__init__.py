"""First-order linear recurrences (scans), diagonal and 2x2-block, forward and reverse.

``linear_scan(c, x, reverse=False, backend="auto")``: ``y_t = c_t * y_{t-1} + x_t`` with
``c, x (B, L, D)`` -> ``y (B, L, D)`` (reverse: ``y_t = c_t * y_{t+1} + x_t``, same-index
coefficient). ``linear_scan_block2(C, x, reverse=False, backend="auto")``: ``C (B, L, 2, 2, D)``,
``x (B, L, 2, D)``, ``y_t[i] = sum_j C_t[i, j] y_{t-1}[j] + x_t[i]``.
``linear_scan_dense(C, x, reverse=False, backend="auto")``: ``C (B, L, D, D)``, ``x (B, L, D)``,
``y_t = C_t @ y_{t-1} + x_t`` (reference and torch backends only; used for dense Jacobians).

Backends: ``"reference"`` (a loop, ``reference.py``), ``"torch"`` (log-step doubling,
``torch_scan.py``), ``"triton"`` (single-pass chunked scan with decoupled look-back, custom ops with
a fused backward, ``triton_scan.py``; strided inputs are made contiguous first); ``"auto"`` picks
``triton`` for CUDA tensors of float32/bfloat16/float16 (when ``AUTO_TRITON`` is on, as it is) and
``torch`` otherwise.
"""

from __future__ import annotations

from typing import Callable

import torch

from kernels.scan.reference import (
    linear_scan_block2_reference,
    linear_scan_dense_reference,
    linear_scan_reference,
)
from kernels.scan.torch_scan import linear_scan_block2_torch, linear_scan_dense_torch, linear_scan_torch

# backend name -> (diagonal scan, 2x2-block scan); add fast backends here.
SCAN_BACKENDS: dict[str, tuple[Callable, Callable]] = {
    "reference": (linear_scan_reference, linear_scan_block2_reference),
    "torch": (linear_scan_torch, linear_scan_block2_torch),
}

try:  # Triton is optional (e.g. macOS)
    from kernels.scan.triton_scan import linear_scan_block2_triton_any, linear_scan_triton_any
    from kernels.scan.triton_scan import supports as _triton_supports

    SCAN_BACKENDS["triton"] = (linear_scan_triton_any, linear_scan_block2_triton_any)
except ImportError:  # pragma: no cover
    _triton_supports = None


#: Whether ``backend="auto"`` picks the Triton scan on CUDA. Off from 06:53 to 07:50 on 2026-11-21 after a
#: GPU failure (5e-3 error at L=129: threads sharing a lane could leave the look-back with different,
#: incomplete carries); on again after the fix (``_lookback.py``) passed the GPU tests on an H200.
AUTO_TRITON = True


def _auto(x: torch.Tensor, c: torch.Tensor | None = None) -> str:
    """The backend ``"auto"`` resolves to for these inputs (see ``AUTO_TRITON``)."""
    if AUTO_TRITON and _triton_supports is not None and x.is_cuda and (c is None or _triton_supports(c, x)):
        return "triton"
    return "torch"


def _pick(backend: str, x: torch.Tensor, c: torch.Tensor | None = None) -> tuple[Callable, Callable]:
    name = _auto(x, c) if backend == "auto" else backend
    if name not in SCAN_BACKENDS:
        valid = ", ".join(["auto", *SCAN_BACKENDS])
        raise ValueError(f"unknown scan backend {backend!r}; valid: {valid}")
    return SCAN_BACKENDS[name]


def linear_scan(c: torch.Tensor, x: torch.Tensor, reverse: bool = False, backend: str = "auto") -> torch.Tensor:
    """Diagonal linear recurrence; see the module docstring."""
    return _pick(backend, x, c)[0](c, x, reverse=reverse)


def linear_scan_block2(C: torch.Tensor, x: torch.Tensor, reverse: bool = False, backend: str = "auto") -> torch.Tensor:
    """2x2-block linear recurrence; see the module docstring."""
    return _pick(backend, x, C)[1](C, x, reverse=reverse)


DENSE_SCAN_BACKENDS: dict[str, Callable] = {
    "reference": linear_scan_dense_reference,
    "torch": linear_scan_dense_torch,
}


def linear_scan_dense(C: torch.Tensor, x: torch.Tensor, reverse: bool = False, backend: str = "auto") -> torch.Tensor:
    """Dense (matrix) linear recurrence; see the module docstring."""
    name = "torch" if backend == "auto" else backend
    if name not in DENSE_SCAN_BACKENDS:
        valid = ", ".join(["auto", *DENSE_SCAN_BACKENDS])
        raise ValueError(f"unknown dense scan backend {backend!r}; valid: {valid}")
    return DENSE_SCAN_BACKENDS[name](C, x, reverse=reverse)


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
]
