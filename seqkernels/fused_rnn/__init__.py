"""FlashRNN-style recurrent cells (LSTM, GRU, Elman, sLSTM) with block-diagonal recurrent matrices.

``fused_rnn(cell, wx, R, b, states0=None, backend="auto")`` returns ``(h, last_states)``; see
``reference.py`` for shapes and the cell equations. Backends (all compute the same function;
vocabulary: ``seqkernels/README.md``):

- ``"reference"``: a PyTorch loop (``reference.py``), any device and dtype, autograd backward.
- ``"triton"``: ``"fused"`` where the head's R fits on chip, else ``"alternating"``; the extras:
- ``"fused"``: the persistent Triton kernel (``fused.py``): the time loop inside the kernel, R on
  chip, forward and backward; needs the head's R to fit on chip (``fused.fits_on_chip``);
- ``"alternating"``: per step a batched matmul + a fused Triton pointwise kernel (``alternating.py``);
  any head dimension.
- ``"auto"``: ``"triton"`` on CUDA tensors of float32 / bfloat16, else ``"reference"`` (float64 runs
  the Triton backends only in the interpreter, for tests).
"""

from __future__ import annotations

import torch

from seqkernels._dispatch import resolve
from seqkernels.fused_rnn.alternating import fused_rnn_alternating
from seqkernels.fused_rnn.fused import fits_on_chip, fused_rnn_fused
from seqkernels.fused_rnn.reference import CELLS, CellSpec, cell_spec, fused_rnn_reference
from seqkernels.fused_rnn.triton_ops import CUDA_DTYPES


def fused_rnn_triton(
    cell: str, wx: torch.Tensor, R: torch.Tensor, b: torch.Tensor, states0: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel where the head's R fits on chip, else the alternating one."""
    cell_spec(cell)  # unknown cells fail here with the list of known ones
    if wx.dim() == 5 and fits_on_chip(cell, wx.shape[-1], wx.dtype):
        return fused_rnn_fused(cell, wx, R, b, states0)
    return fused_rnn_alternating(cell, wx, R, b, states0)


BACKENDS = {
    "reference": fused_rnn_reference,
    "fused": fused_rnn_fused,
    "alternating": fused_rnn_alternating,
    "triton": fused_rnn_triton,
}


def fused_rnn(
    cell: str,
    wx: torch.Tensor,
    R: torch.Tensor,
    b: torch.Tensor,
    states0: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply ``cell`` over time with the chosen backend; see the module docstring."""
    name = resolve("fused_rnn", backend, BACKENDS, wx, wx.dtype in CUDA_DTYPES)
    return BACKENDS[name](cell, wx, R, b, states0)


__all__ = [
    "BACKENDS",
    "CELLS",
    "CellSpec",
    "cell_spec",
    "fused_rnn",
    "fused_rnn_alternating",
    "fused_rnn_fused",
    "fused_rnn_reference",
    "fused_rnn_triton",
]
