"""What every Triton path shares: can Triton run here, integer tile arithmetic, output allocation.

- ``triton_available(tensor)``: on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``.
- ``cdiv`` / ``next_pow2``: plain-Python integer helpers for launch code (``triton.cdiv`` is a
  ``ConstexprFunction`` on recent Triton, several microseconds per host call).
- ``FEW_PROGRAMS``: below this many programs a launch leaves much of the GPU idle; small launches
  take narrower tiles (the SSD's ``chunk_attn`` rows, the fused Newton's channels per program).
- ``empty(shape, device, dtype)`` / ``empty_like(tensor)``: every kernel output is allocated here;
  inside ``poisoned()`` (tests and benchmark checks) it is NaN-filled instead, so an element a kernel
  never writes shows.
- ``LaunchCache``: launches one kernel at fixed constexprs without the JIT's per-call binding, for
  host-bound eager paths.
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


@functools.cache
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


_knobs = None


def _launch_hooks_set() -> bool:
    """Is a Triton launch hook set (a profiler such as proton)? Triton keeps them as ``None`` or as
    chains of calls (``HookChain``, empty unless something registered)."""
    global _knobs
    if _knobs is None:
        from triton import knobs as _knobs
    enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
    # on every launch: two attribute tests, no generator
    return bool(
        (enter is not None and getattr(enter, "calls", True)) or (leave is not None and getattr(leave, "calls", True))
    )


class LaunchCache:
    """One Triton kernel at fixed constexprs and launch options, launched on CUDA without the JIT's
    per-call work.

    ``kernel[grid](*args, **meta)`` binds and specializes every argument on every call (on an H200's
    host about 9 of the 19 µs a scan launch takes). Here the first launch of each specialization goes
    through the JIT and keeps the compiled kernel it returns; later launches call that kernel's
    launcher with the arguments' addresses, as Inductor's generated launchers do. The caller names the
    specialization: ``key`` (with the CUDA device) must fix everything Triton specializes on besides
    the constexprs in ``meta`` (the same dict for every launch of one cache) and the tensors' 16-byte
    alignment, which ``launch`` checks: the tensors' dtypes, the ints' values and which arguments are
    ``None``. A misaligned tensor (a view at an odd offset), a launch hook, the CPU interpreter or a
    Triton whose compiled kernel lacks that launcher take the JIT every time.
    """

    __slots__ = ("_compiled", "_broken")

    def __init__(self):
        self._compiled: dict[tuple, tuple] = {}
        self._broken = False

    def launch(self, kernel, grid: tuple[int], args: tuple, meta: dict, key) -> None:
        """``kernel[grid](*args, **meta)``; ``grid``: one dimension; ``args``: the runtime arguments
        (tensors, ints, ``None``) in the kernel's order, all of them before its constexprs; ``key``:
        hashable, see the class doc."""
        first = args[0]
        if self._broken or not first.is_cuda:
            kernel[grid](*args, **meta)
            return
        device = first.get_device()
        entry = self._compiled.get((device, key))
        if entry is not None and device == torch._C._cuda_getDevice() and not _launch_hooks_set():
            compiled, function, metadata, constexprs, tensors = entry
            addresses = list(args)
            low_bits = 0
            for i in tensors:
                addresses[i] = address = args[i].data_ptr()
                low_bits |= address
            if not low_bits & 15:
                try:
                    compiled.run(
                        grid[0],
                        1,
                        1,
                        torch._C._cuda_getCurrentRawStream(device),
                        function,
                        metadata,
                        None,
                        None,
                        None,
                        *addresses,
                        *constexprs,
                    )
                    return
                except TypeError:  # a Triton whose launcher takes other arguments (it checks before launching)
                    self._broken = True
        compiled = kernel[grid](*args, **meta)
        if entry is not None or device != torch._C._cuda_getDevice():
            return
        tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        if any(args[i].data_ptr() % 16 for i in tensors):
            return  # compiled for a misaligned tensor: not the specialization the fast path assumes
        try:
            constexprs = tuple(meta[name] for name in kernel.arg_names[len(args) :])
            self._compiled[(device, key)] = (compiled, compiled.function, compiled.packed_metadata, constexprs, tensors)
        except (AttributeError, KeyError):  # another Triton's compiled kernel, or constexprs not in meta
            self._broken = True
