"""What every Triton path shares: can Triton run here, integer tile arithmetic, output allocation.

- ``triton_available(tensor)``: on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``.
- ``cdiv`` / ``next_pow2``: plain-Python integer helpers for launch code (``triton.cdiv`` is a
  ``ConstexprFunction`` on recent Triton, several microseconds per host call).
- ``FEW_PROGRAMS``: below this many programs a launch leaves much of the GPU idle; small launches
  take narrower tiles (the SSD's ``chunk_attn`` rows, the fused Newton's channels per program).
- ``empty(shape, device, dtype)`` / ``empty_like(tensor)``: every kernel output is allocated here;
  inside ``poisoned()`` (tests and benchmark checks) it is NaN-filled instead, so an element a kernel
  never writes shows.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterator

import torch


#: programs per launch below which a launch is small: about two per SM of an H100 / H200 (132 SMs)
FEW_PROGRAMS = 256


@functools.lru_cache(maxsize=None)
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # triton missing or broken (e.g. macOS)
        return False
    return True


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available(tensor: torch.Tensor) -> bool:
    """Can a Triton kernel run on ``tensor``'s device right now?"""
    if not triton_importable():
        return False
    return tensor.is_cuda or (tensor.device.type == "cpu" and interpreting())


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


_POISON = False


def empty(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized kernel output, or a NaN-filled one inside ``poisoned()``."""
    if _POISON:
        return torch.full(shape, math.nan, device=device, dtype=dtype)
    return torch.empty(shape, device=device, dtype=dtype)


def empty_like(tensor: torch.Tensor) -> torch.Tensor:
    """``empty(tensor.shape, tensor.device, tensor.dtype)`` (contiguous) at less than half its host
    time: no shape, device and dtype arguments to parse."""
    if _POISON:
        return torch.full_like(tensor, math.nan, memory_format=torch.contiguous_format)
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Inside the block every kernel output starts as NaN (``empty``)."""
    global _POISON
    old, _POISON = _POISON, True
    try:
        yield
    finally:
        _POISON = old


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` inside the block, the old setting after."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)
