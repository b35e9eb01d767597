"""Causal depthwise convolution along the sequence, the short conv of the Mamba2 mixer and the gated block.

    y[b, t, c] = bias[c] + sum_{k=0}^{K-1} w[c, k] x[b, t - (K - 1) + k, c]      (x = 0 before t = 0)

The parameters live in a depthwise ``nn.Conv1d(C, C, K, groups=C, padding=K - 1)`` (its weight is
``(C, 1, K)``), so checkpoints and ``mixers.stacking`` see an ordinary conv. Eagerly the conv runs as
that module; under ``torch.compile`` the same sum is written as ``K`` shifted multiply-adds, which
Inductor fuses with the neighbouring elementwise ops (the SiLU after it, the split before it) and, in
the backward, into one reduction for the weight, instead of PyTorch's three ``conv_depthwise2d``
kernels (forward, input and weight gradients), which held 17-45% of the warp-time of the compiled
Table 6 step in the recurrent mixers (``docs/performance.md``). Both forms agree to float rounding
(``tests/mixers/test_compiled_forms.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def causal_depthwise_conv(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """``conv`` applied causally along the length of ``x (B, L, C)`` -> ``(B, L, C)`` (see the module docstring).

    ``conv``: a depthwise ``nn.Conv1d`` of ``C`` channels, kernel ``K``, ``padding=K - 1``."""
    length = x.shape[1]
    if not torch.compiler.is_compiling():
        return conv(x.transpose(1, 2))[..., :length].transpose(1, 2)
    kernel = conv.weight.shape[-1]
    padded = F.pad(x, (0, 0, kernel - 1, 0))  # K - 1 zeros before t = 0
    weight = conv.weight[:, 0, :]  # (C, K)
    y = padded[:, :length] * weight[:, 0]
    for k in range(1, kernel):
        y = y + padded[:, k : k + length] * weight[:, k]
    return y if conv.bias is None else y + conv.bias
