"""FlashRNN-style recurrent cells (LSTM, GRU, Elman, sLSTM) with block-diagonal recurrent matrices.

``fused_rnn(cell, wx, R, b, states0=None, backend="auto")`` returns ``(h, last_states)``; see
``reference.py`` for shapes and the cell equations. Backends: ``"reference"`` (a PyTorch loop).
"""

from __future__ import annotations

import torch

from kernels.fused_rnn.reference import CELLS, CellSpec, cell_spec, fused_rnn_reference

BACKENDS = {"reference": fused_rnn_reference}


def fused_rnn(
    cell: str,
    wx: torch.Tensor,
    R: torch.Tensor,
    b: torch.Tensor,
    states0: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply ``cell`` over time with the chosen backend (``"auto"``: the fastest for the device)."""
    if backend == "auto":
        backend = "reference"
    if backend not in BACKENDS:
        raise ValueError(f"unknown fused_rnn backend {backend!r}; known: auto, {', '.join(BACKENDS)}")
    return BACKENDS[backend](cell, wx, R, b, states0)


__all__ = ["BACKENDS", "CELLS", "CellSpec", "cell_spec", "fused_rnn", "fused_rnn_reference"]
