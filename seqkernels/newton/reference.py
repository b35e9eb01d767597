"""The sequential definition of a nonlinear recurrence (paper 000 eq. 1): a loop over time.

``sequential_apply(step, u, params, state_size=, time_dim=1)``: ``h_t = step(h_{t-1}, u_t, *params)``
from ``h_{-1} = 0`` for any pure, position-wise step; autograd flows through the loop, any dtype.

``flashgru_reference(u, a, iters=3, tol=None)`` / ``flashlstm_reference(u, a, p, iters=3, tol=None)``:
the FlashGRU / FlashLSTM recurrences (``seqkernels.newton.cells``) with the signature of the fast
paths (``seqkernels.newton.flashgru``): ``u (H, B, L, 3, Ds)`` input pre-activations, ``a (H, 3, Ds)``
diagonal state weights, ``p (H, 2, Ds)`` peepholes; states ``(H, B, L, Ds)`` / ``[c, h] (H, B, L,
2 Ds)``. ``iters`` and ``tol`` (Newton's) are accepted and unused: the loop is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from seqkernels.newton.cells import flashgru_step, flashlstm_step

StepFn = Callable[..., torch.Tensor]  # step(h_prev, u, *params) -> h


def sequential_apply(
    step: StepFn, u: torch.Tensor, params: Sequence[torch.Tensor], *, state_size: int, time_dim: int = 1
) -> torch.Tensor:
    """``h_t = step(h_{t-1}, u_t, *params)`` in a loop; ``u (*lead, L, *feat)`` with time at
    ``time_dim``. Returns the states ``(*lead, L, S)``."""
    if u.shape[time_dim] == 0:
        return u.new_zeros((*u.shape[: time_dim + 1], state_size))
    h = u.new_zeros((*u.shape[:time_dim], state_size))
    out = []
    for u_t in u.unbind(time_dim):  # one unbind: its backward is O(L), L selects' would be O(L^2)
        h = step(h, u_t, *params)
        out.append(h)
    return torch.stack(out, dim=time_dim)


def flashgru_reference(u: torch.Tensor, a: torch.Tensor, iters: int = 3, tol: float | None = None) -> torch.Tensor:
    """FlashGRU states ``h (H, B, L, Ds)`` by the loop."""
    return sequential_apply(flashgru_step, u, (a[:, None],), state_size=u.shape[-1], time_dim=2)


def flashlstm_reference(
    u: torch.Tensor, a: torch.Tensor, p: torch.Tensor, iters: int = 3, tol: float | None = None
) -> torch.Tensor:
    """FlashLSTM states ``[c, h] (H, B, L, 2 Ds)`` by the loop."""
    return sequential_apply(flashlstm_step, u, (a[:, None], p[:, None]), state_size=2 * u.shape[-1], time_dim=2)
