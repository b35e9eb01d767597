"""Mamba2's SSD layer: a linear recurrence with a scalar decay per head and a (P x N) state.

``ssd(x, dt, A, B, C, *, D=None, chunk_size=64, initial_state=None, return_final_state=False,
backend="auto")`` computes, per head ``h`` (group ``g = h // (H / G)`` for ``B``, ``C``):

    state_t = exp(dt_t A_h) state_{t-1} + dt_t x_t B_t^T,     y_t = state_t C_t + D_h x_t

Shapes (batch-first, heads split): ``x (batch, L, H, P)``, ``dt (batch, L, H)`` positive step
sizes (apply ``softplus`` and any bias before), ``A (H,)`` negative log-decay rates, ``B, C
(batch, L, G, N)`` with ``H % G == 0``, ``D (H,)`` or ``None``, ``initial_state (batch, H, P, N)``
or ``None`` (zeros). Returns ``y (batch, L, H, P)`` in the dtype of ``x``, and with
``return_final_state=True`` also the state after the last step ``(batch, H, P, N)``.

Backends (same function, tested against each other; vocabulary: ``seqkernels/README.md``):
- ``"reference"``: the recurrence step by step (``reference.py``), any dtype including float64;
- ``"torch"``: the chunked PyTorch form (``pytorch.py``), quadratic within chunks of ``chunk_size``
  steps and a ``seqkernels.scan`` recurrence across chunks;
- ``"triton"``: Triton kernels for the chunk states (the recurrence across chunks fused in) and
  the chunk outputs, forward and backward (``triton_ops.py``); float32/bfloat16/float16, CUDA or the
  interpreter. ``chunk_size`` must be a power of two in [16, 256].
- ``"auto"``: ``"triton"`` on CUDA float32/bfloat16/float16 inputs, else ``"torch"``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from seqkernels._dispatch import resolve
from seqkernels._validate import positive_int
from seqkernels.ssd.pytorch import ssd_chunked
from seqkernels.ssd.reference import ssd_reference

# name -> core(x, dt, A, B, C, initial_state, chunk_size) -> (y without D, final state)
SSD_BACKENDS: dict[str, Callable] = {"reference": ssd_reference, "torch": ssd_chunked}
_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

try:  # the Triton path needs triton importable (not on every platform)
    from seqkernels.ssd.triton_ops import ssd_triton

    SSD_BACKENDS["triton"] = ssd_triton
except ImportError:  # pragma: no cover - platforms without triton
    pass


def _check(x, dt, A, B, C, D, initial_state, chunk_size) -> None:
    for name, t, dims in (("x", x, 4), ("dt", dt, 3), ("A", A, 1), ("B", B, 4), ("C", C, 4)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ssd: {name} must be a tensor, got {type(t).__name__}")
        if t.dim() != dims:
            raise ValueError(f"ssd: {name} must have {dims} dims, got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"ssd: {name} must be floating point, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"ssd: {name} is on {t.device} but x is on {x.device}")
    batch, L, H, P = x.shape
    if tuple(dt.shape) != (batch, L, H):
        raise ValueError(f"ssd: dt has shape {tuple(dt.shape)}, expected (batch, L, H) = {(batch, L, H)}")
    if tuple(A.shape) != (H,):
        raise ValueError(f"ssd: A has shape {tuple(A.shape)}, expected (H,) = ({H},)")
    G, N = B.shape[2], B.shape[3]
    if B.shape[:2] != (batch, L) or tuple(C.shape) != tuple(B.shape):
        raise ValueError(
            f"ssd: B {tuple(B.shape)} and C {tuple(C.shape)} must both be (batch, L, G, N) with (batch, L) = {(batch, L)}"
        )
    if G == 0 or H % G != 0:
        raise ValueError(f"ssd: the number of heads H={H} must be a multiple of the number of B/C groups G={G}")
    if D is not None and (not isinstance(D, torch.Tensor) or tuple(D.shape) != (H,)):
        raise ValueError(f"ssd: D must be a tensor of shape (H,) = ({H},) or None")
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != (batch, H, P, N):
            got = tuple(initial_state.shape) if isinstance(initial_state, torch.Tensor) else type(initial_state)
            raise ValueError(f"ssd: initial_state must be (batch, H, P, N) = {(batch, H, P, N)}, got {got}")
    positive_int("ssd: chunk_size", chunk_size)


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """The backend ``backend`` (``"auto"`` included) stands for on inputs like ``x``."""
    return resolve("ssd", backend, SSD_BACKENDS, x, x.dtype in _TRITON_DTYPES)


def ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    backend: str = "auto",
):
    """The SSD layer; see the module docstring for shapes and backends."""
    _check(x, dt, A, B, C, D, initial_state, chunk_size)
    y, final = SSD_BACKENDS[resolve_backend(backend, x)](x, dt, A, B, C, initial_state, chunk_size)
    if D is not None:
        y = y + x * D.to(x.dtype)[:, None]
    return (y, final) if return_final_state else y


__all__ = ["SSD_BACKENDS", "resolve_backend", "ssd", "ssd_chunked", "ssd_reference"]
