"""Structured Jacobians of a recurrence step by forward-mode autograd (``torch.func.jvp``).

``step(h_prev, u) -> h`` acts position-wise on ``h_prev (*lead, S)``, so one Jacobian-vector
product with the same tangent ``v`` at every position returns ``J v`` at every position at once:

- diag: ``v = 1`` gives the diagonal (valid only if ``J`` is diagonal): 1 JVP;
- block2: ``v = [1, 0]`` and ``[0, 1]`` (state halves) give the two block columns: 2 JVPs;
- dense: ``v = e_j`` for every ``j`` gives column ``j``: ``S`` JVPs (vectorized with ``vmap``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import jvp, vmap

from seqkernels.newton.reduction import check_structure


def autograd_jacobian(
    step: Callable[[torch.Tensor], torch.Tensor], h_prev: torch.Tensor, structure: str
) -> torch.Tensor:
    """``d step(h) / d h`` at ``h_prev (*lead, S)`` in ``structure`` (see ``seqkernels.newton.reduction``).

    ``step`` maps ``(*lead, S) -> (*lead, S)`` position-wise (close over the inputs and parameters).
    """
    check_structure(structure)
    S = h_prev.shape[-1]

    def column(v: torch.Tensor) -> torch.Tensor:
        return jvp(step, (h_prev,), (v.expand_as(h_prev),))[1]

    if structure == "diag":
        return column(torch.ones_like(h_prev[..., :1]).expand_as(h_prev).contiguous())
    if structure == "block2":
        if S % 2:
            raise ValueError(f"block2 Jacobians need an even state size, got {S}")
        half = S // 2
        ones, zeros = (
            torch.ones(half, dtype=h_prev.dtype, device=h_prev.device),
            torch.zeros(half, dtype=h_prev.dtype, device=h_prev.device),
        )
        col0 = column(torch.cat([ones, zeros]))  # (*lead, S): [J00, J10]
        col1 = column(torch.cat([zeros, ones]))  # [J01, J11]
        col0, col1 = col0.unflatten(-1, (2, half)), col1.unflatten(-1, (2, half))
        return torch.stack([col0, col1], dim=-2)  # [..., i, j, :]
    eye = torch.eye(S, dtype=h_prev.dtype, device=h_prev.device)
    cols = vmap(column)(eye)  # (S_j, *lead, S_i)
    return cols.movedim(0, -1)
