"""The PD scan as a log-step parallel scan in plain PyTorch, with its adjoint written out.

Same signature and result as ``reference.pd_scan_reference``. A step ``y -> P D y + x`` is held as
``(index, d, x)``; two steps compose into one of the same form in ``O(N)``:

    (P2 D2)(P1 D1) = (P2 P1) diag(d2[index1]) D1,   i.e.
    index = index2[index1],   d = d2[index1] * d1,   x = scatter_add(index2, d2 * x1) + x2

(``index2[index1]``: the composed column map; ``d2[index1]``: the later diagonal gathered where the
earlier step sent each lane). Hillis--Steele doubling: after the round with offset ``s`` position ``t``
holds the steps ``t - 2s + 1 .. t`` composed (identity before the start): ``ceil(log2 L)`` rounds of
gathers and scatter-adds, ``O(L N log L)`` work, no host reads (CUDA-graph capturable).

The backward is the adjoint recurrence, run backwards in time with the transposed transitions, which
have one entry per *row* (a gather)::

    lam_t[n] = dy_t[n] + conj(d_{t+1}[n]) lam_{t+1}[index_{t+1}[n]]          (lam_L = 0)
    dx_t = lam_t,        dd_t[n] = lam_t[index_t[n]] conj(y_{t-1}[n])

(``conj`` for complex lanes; real lanes as they are), the same doubling over gather-form steps
(``lam -> e * lam[j] + g`` composes into ``e1 * e2[j1]``, ``j2[j1]``, ``g1 + e1 * g2[j1]``): one scan
forward, one backward, no per-round tensors kept for autograd.
"""

from __future__ import annotations

import torch

from seqkernels.pd_scan.reference import check, multiply


def _shift(t: torch.Tensor, s: int, fill: torch.Tensor) -> torch.Tensor:
    """``t`` shifted right by ``s`` along dim 1, the first ``s`` positions ``fill`` (broadcast)."""
    pad = fill.expand_as(t[:, :s])
    return torch.cat([pad, t[:, : t.shape[1] - s]], dim=1)


def _one(x: torch.Tensor) -> torch.Tensor:
    """The number 1 in ``x``'s lane format (``C = 1``: real, ``C = 2``: (1, 0))."""
    return (torch.arange(x.shape[-1], device=x.device) == 0).to(x.dtype)  # no host copy: capturable


def _conj(d: torch.Tensor) -> torch.Tensor:
    return d if d.shape[-1] == 1 else torch.stack([d[..., 0], -d[..., 1]], dim=-1)


def scatter_scan(index: torch.Tensor, d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y_t = P_t D_t y_{t-1} + x_t`` by doubling (the module docstring's composition)."""
    L, N = x.shape[1], x.shape[2]
    identity, one, zero = torch.arange(N, device=x.device), _one(x), x.new_zeros(())
    s = 1
    while s < L:
        index_prev, x_prev = _shift(index, s, identity), _shift(x, s, zero)
        x = x.scatter_add(2, index[..., None].expand_as(x), multiply(d, x_prev))  # x2 + P2 D2 x1
        if 2 * s < L:  # the composed transition is not needed after the last round
            d = multiply(torch.gather(d, 2, index_prev[..., None].expand_as(d)), _shift(d, s, one))  # d2[i1] d1
            index = torch.gather(index, 2, index_prev)  # index2[index1]
        s *= 2
    return x.clone() if L <= 1 else x


def gather_scan(index: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``y_t = e_t * y_{t-1}[index_t] + g_t`` (``y_{-1} = 0``; one source lane per lane) by doubling."""
    L, N = g.shape[1], g.shape[2]
    identity, one, zero = torch.arange(N, device=g.device), _one(g), g.new_zeros(())
    s = 1
    while s < L:
        g = g + multiply(e, torch.gather(_shift(g, s, zero), 2, index[..., None].expand_as(g)))
        if 2 * s < L:
            e = multiply(e, torch.gather(_shift(e, s, one), 2, index[..., None].expand_as(e)))
            index = torch.gather(_shift(index, s, identity), 2, index)
        s *= 2
    return g.clone() if L <= 1 else g


class _PDScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, index, d, x):
        y = scatter_scan(index, d, x)
        ctx.save_for_backward(index, d, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        index, d, y = ctx.saved_tensors
        N = index.shape[2]
        identity = torch.arange(N, device=index.device)
        # lam_t = dy_t + conj(d_{t+1}) * lam_{t+1}[index_{t+1}]: a gather-form scan, backwards in time
        e_next = torch.cat([_conj(d[:, 1:]), torch.zeros_like(d[:, :1])], dim=1)
        index_next = torch.cat([index[:, 1:], identity.expand_as(index[:, :1])], dim=1)
        lam = gather_scan(index_next.flip(1), e_next.flip(1), dy.flip(1)).flip(1)
        y_prev = torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)
        dd = multiply(torch.gather(lam, 2, index[..., None].expand_as(lam)), _conj(y_prev))
        return None, dd, lam


def pd_scan_torch(index: torch.Tensor, d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The PD recurrence by log-step doubling, forward and backward; see the module docstring."""
    check(index, d, x, "pd_scan_torch")
    return _PDScan.apply(index, d, x)
