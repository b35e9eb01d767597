"""Classical recurrent mixers with multi-head block-diagonal recurrent matrices (paper 001):
``lstm``, ``gru``, ``elman``, ``slstm``.

    x (B, L, d) --W--> wx (B, L, NH, G_x, DH) --cell over time--> h (B, L, NH, DH) -> (B, L, d)

The recurrence itself is ``seqkernels.fused_rnn.fused_rnn``; the mixer's ``backend`` is its backend
(``"reference"``, the PyTorch loop; ``"triton"``, the fused / alternating Triton kernels; ``"fused"``,
``"alternating"``; ``"auto"``: ``seqkernels/README.md``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mixers.registry import register_mixer
from mixers.validate import check_backend
from seqkernels.fused_rnn import BACKENDS as KERNEL_BACKENDS
from seqkernels.fused_rnn import cell_spec, fused_rnn

#: the forget gate's index in the bias, and its initial value (opens the memory at the start)
FORGET_BIAS = {"lstm": (1, 1.0), "slstm": (1, 1.0)}


class ClassicalRNN(nn.Module):
    """A multi-head classical RNN cell as a mixer.

    Args:
        cell: ``"lstm" | "gru" | "elman" | "slstm"``.
        d_model: input and output width; split into ``num_heads`` heads of ``d_model // num_heads``.
        backend: ``"reference"`` (PyTorch loop), ``"triton"`` (the fused persistent kernel, or the
            alternating one where a head's R does not fit on chip), ``"fused"``, ``"alternating"`` or
            ``"auto"`` (``"triton"`` on CUDA, ``"reference"`` on the CPU).
    """

    BACKENDS = ("auto", *KERNEL_BACKENDS)

    def __init__(self, cell: str, d_model: int, num_heads: int = 4, backend: str = "auto") -> None:
        super().__init__()
        spec = cell_spec(cell)
        if num_heads < 1 or d_model % num_heads:
            raise ValueError(f"{cell}: d_model={d_model} must be divisible by num_heads={num_heads}")
        check_backend(cell, backend, self.BACKENDS)
        self.cell, self.backend, self.num_heads, self.head_dim = cell, backend, num_heads, d_model // num_heads
        self.W = nn.Linear(d_model, spec.input_gates * d_model, bias=False)
        self.R = nn.Parameter(torch.empty(num_heads, self.head_dim, spec.recurrent_gates, self.head_dim))
        self.b = nn.Parameter(torch.zeros(num_heads, spec.bias_gates, self.head_dim))
        bound = 1.0 / math.sqrt(self.head_dim)  # uniform(±1/sqrt(DH)), as nn.LSTM / nn.GRU
        nn.init.uniform_(self.R, -bound, bound)
        if cell in FORGET_BIAS:
            gate, value = FORGET_BIAS[cell]
            with torch.no_grad():
                self.b[:, gate] = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, length, d = x.shape
        wx = self.W(x).view(bsz, length, self.num_heads, -1, self.head_dim)
        # the Triton kernels take one dtype (e.g. bfloat16 wx under autocast): cast the parameters
        R, b = self.R.to(wx.dtype), self.b.to(wx.dtype)
        h, _ = fused_rnn(self.cell, wx, R, b, backend=self.backend)
        return h.reshape(bsz, length, d)

    def extra_repr(self) -> str:
        return f"cell={self.cell}, heads={self.num_heads}x{self.head_dim}, backend={self.backend}"


def _factory(cell: str):
    def build(d_model: int, num_heads: int = 4, backend: str = "auto") -> ClassicalRNN:
        return ClassicalRNN(cell, d_model, num_heads=num_heads, backend=backend)

    build.__name__ = f"build_{cell}"
    build.__doc__ = f"The multi-head {cell} mixer (see ``ClassicalRNN``)."
    return build


for _cell in ("lstm", "gru", "elman", "slstm"):
    register_mixer(_cell)(_factory(_cell))
