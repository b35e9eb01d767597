"""Whether Triton can run here: on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch


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


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` inside the block, the old setting after."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)
