"""The host side of the fused Newton kernels (``gru_kernels.py``, ``lstm_kernels.py``; the algorithm and
the shared device functions: ``common_kernels.py``): the tile (``NewtonTiles``), input checks, and
``FusedNewton``, one cell's forward and backward kernels as ``torch.library`` custom ops with
``register_autograd`` and as an eager ``autograd.Function``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.autograd.function import once_differentiable

from seqkernels._triton import FEW_PROGRAMS, cdiv, empty, next_pow2, triton_available
from seqkernels._validate import is_int, non_negative_int


@dataclasses.dataclass(frozen=True)
class NewtonTiles:
    """Tile of one fused Newton launch: ``ch`` steps per chunk (a power of two), ``bd`` state
    channels per program (a power of two), ``warps`` per program."""

    ch: int
    bd: int
    warps: int = 4


def check_fused_inputs(name: str, u: torch.Tensor, params: dict, want: dict, iters, tol) -> tuple[int, int, int, int]:
    """Validate ``u (H, B, L, 3, Ds)`` and parameters ``{name: (H, k, Ds)}``; returns ``(H, B, L, Ds)``."""
    if not isinstance(u, torch.Tensor) or u.dim() != 5 or u.shape[3] != 3:
        shape = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
        raise ValueError(f"{name}: expected u (H, B, L, 3, Ds), got {shape}")
    H, B, L, _, Ds = u.shape
    if u.dtype != torch.float32:
        raise TypeError(f"{name}: u must be float32, got {u.dtype}")
    if not u.is_contiguous():
        raise ValueError(f"{name}: u must be contiguous (call .contiguous() first)")
    if not triton_available(u):
        raise ValueError(f"{name}: Triton needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU), got {u.device}")
    for key, k in want.items():
        p = params[key]
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != (H, k, Ds):
            got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"{name}: {key} must be (H, {k}, Ds) = {(H, k, Ds)}, got {got}")
        if p.dtype != torch.float32 or p.device != u.device or not p.is_contiguous():
            raise ValueError(
                f"{name}: {key} must be a contiguous float32 tensor on {u.device}, got {p.dtype} on {p.device}"
            )
    non_negative_int(f"{name}: iters", iters)
    if tol is not None and not tol >= 0:
        raise ValueError(f"{name}: tol must be None or >= 0, got {tol!r}")
    return H, B, L, Ds


def check_skip(name: str, skip: torch.Tensor | None, u: torch.Tensor) -> None:
    """One-line ``ValueError`` unless ``skip`` is ``None`` or a one-element bool tensor on ``u``'s device."""
    if skip is not None and (
        not isinstance(skip, torch.Tensor) or skip.dtype != torch.bool or skip.numel() != 1 or skip.device != u.device
    ):
        got = (
            f"{skip.dtype} of shape {tuple(skip.shape)} on {skip.device}"
            if isinstance(skip, torch.Tensor)
            else type(skip).__name__
        )
        raise ValueError(f"{name}: skip must be None or a one-element bool tensor on {u.device}, got {got}")


def check_chunk(name: str, chunk) -> None:
    """One-line ``ValueError`` unless ``chunk`` is 0 (the default chunk) or a power of two."""
    if not is_int(chunk) or chunk < 0 or (chunk & (chunk - 1)):
        raise ValueError(f"{name}: chunk must be 0 (the default) or a power of two, got {chunk!r}")


class FusedNewton:
    """The forward and backward Triton kernels of one cell's fused Newton, as custom ops and as an
    eager ``autograd.Function`` (the same launches without the dispatcher round trips).

    ``params``: name -> gate count ``k`` of each diagonal weight ``(H, k, Ds)`` the kernels take after
    ``u``; ``states``: state channels per ``Ds`` (1: ``h``; 2: ``[c, h]``); ``ch``: default chunk.
    ``chunk=1`` with ``iters=1`` is the exact loop ``s_t = f(s_{t-1}, u_t)`` (``sequential``): each chunk
    starts from the exact previous state, and one Newton iteration from it is ``f`` itself.
    Kernel arguments: forward ``(u, *params, s, res, skip, B, L, Ds, n_st, iters, tol, HAS_TOL, STATS,
    HAS_SKIP, CH, BD)`` (``skip``: a bool scalar on the device, read only with ``HAS_SKIP``: where true
    the kernel runs no Newton iteration), backward ``(u, *params, s, gs, du, *dparams, B, L, Ds, n_st, CH, BD)`` with ``dparams`` per
    (head, batch row) ``(H, B, k, Ds)``, summed over batch rows here.
    """

    def __init__(self, name: str, fwd_kernel, bwd_kernel, params: dict[str, int], states: int, ch: int):
        self.name, self.fwd_kernel, self.bwd_kernel = name, fwd_kernel, bwd_kernel
        self.params, self.states, self.ch = params, states, ch
        names = ", ".join(f"Tensor {p}" for p in params)
        self.fwd_op = torch.library.custom_op(
            f"expressivity::{name}",
            self._fwd_impl,
            mutates_args=(),
            schema=f"(Tensor u, {names}, int iters, float? tol, bool stats, Tensor? skip, int chunk) -> (Tensor, Tensor)",
        )
        self.bwd_op = torch.library.custom_op(
            f"expressivity::{name}_bwd",
            self._bwd_impl,
            mutates_args=(),
            schema=f"(Tensor u, {names}, Tensor s, Tensor gs) -> ({', '.join(['Tensor'] * (1 + len(params)))})",
        )
        n = len(params)

        def fake_fwd(u, *rest):
            H, B, L, _, Ds = u.shape
            return u.new_empty((H, B, L, states * Ds)), u.new_empty((rest[n] + 1,))

        self.fwd_op.register_fake(fake_fwd)
        self.bwd_op.register_fake(lambda u, *rest: (torch.empty_like(u), *(torch.empty_like(p) for p in rest[:n])))

        def setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0], output[0], *inputs[1 : 1 + n])

        def grad(ctx, gs, _gres):
            u, s, *ps = ctx.saved_tensors
            return (*self.bwd_op(u, *ps, s, gs.contiguous()), None, None, None, None, None)

        self.fwd_op.register_autograd(grad, setup_context=setup)

    def default_tiles(self, H: int, B: int, Ds: int, chunk: int = 0) -> NewtonTiles:
        """``chunk`` (default ``ch``) steps per chunk, 4 warps (1 for one-step chunks, whose tiles are one
        row), 8 state channels per program (fewer when ``Ds < 8``), or 4 when
        8 would give fewer than ``FEW_PROGRAMS`` programs (``H * B * Ds / 8``; Table 6's 4 heads of 16
        channels at batch 16 then run 256 programs of 4 channels instead of 128 of 8, faster: the timing is
        in seqkernels/newton/README.md; the chunks, and so the results, are the same)."""
        bd = 8 if Ds >= 8 else next_pow2(Ds)
        if bd == 8 and H * B * cdiv(Ds, 8) < FEW_PROGRAMS:
            bd = 4
        ch = chunk or self.ch
        return NewtonTiles(ch, bd, 4 if ch > 1 else 1)

    def forward(
        self,
        u,
        params,
        iters: int,
        tol: float | None,
        stats: bool,
        tiles: NewtonTiles | None,
        skip: torch.Tensor | None = None,
        chunk: int = 0,
    ):
        H, B, L, _, Ds = u.shape
        s = empty((H, B, L, self.states * Ds), u.device, torch.float32)
        res = torch.full((iters + 1,), -1.0, dtype=torch.float32, device=u.device)
        if s.numel():
            t = tiles or self.default_tiles(H, B, Ds, chunk)
            n_st = cdiv(Ds, t.bd)
            self.fwd_kernel[(H * B * n_st,)](
                u,
                *params,
                s,
                res,
                res if skip is None else skip,
                B,
                L,
                Ds,
                n_st,
                iters,
                float(tol or 0.0),
                HAS_TOL=tol is not None,
                STATS=stats,
                HAS_SKIP=skip is not None,
                CH=t.ch,
                BD=t.bd,
                num_warps=t.warps,
            )
        return s, res

    def backward(self, u, params, s, gs, tiles: NewtonTiles | None):
        H, B, L, _, Ds = u.shape
        du = empty(u.shape, u.device, torch.float32)
        parts = [empty((H, B, k, Ds), u.device, torch.float32) for k in self.params.values()]
        if s.numel():
            t = tiles or self.default_tiles(H, B, Ds)
            n_st = cdiv(Ds, t.bd)
            self.bwd_kernel[(H * B * n_st,)](
                u, *params, s, gs, du, *parts, B, L, Ds, n_st, CH=t.ch, BD=t.bd, num_warps=t.warps
            )
            return (du, *(p.sum(dim=1) for p in parts))
        return (du.zero_(), *(torch.zeros_like(p) for p in params))

    def _fwd_impl(self, u, *rest):
        params, (iters, tol, stats, skip, chunk) = rest[: len(self.params)], rest[len(self.params) :]
        check_fused_inputs(f"{self.name}", u, dict(zip(self.params, params)), self.params, iters, tol)
        check_skip(self.name, skip, u)
        check_chunk(self.name, chunk)
        return self.forward(u, params, iters, tol, stats, None, skip, chunk)

    def _bwd_impl(self, u, *rest):
        n = len(self.params)
        return self.backward(u, rest[:n], rest[n], rest[n + 1], None)

    def __call__(
        self,
        u,
        *params,
        iters: int = 3,
        tol: float | None = None,
        stats: bool = False,
        tiles: NewtonTiles | None = None,
        skip: torch.Tensor | None = None,
        chunk: int = 0,
    ):
        """``(s, residuals)``; ``tiles`` overrides the forward's and backward's tile, ``chunk`` only the
        forward's chunk (0: ``ch``; the backward's adjoint scan does not depend on it)."""
        tol = None if tol is None else float(tol)
        if torch.compiler.is_compiling():
            return self.fwd_op(u, *params, iters, tol, bool(stats), skip, chunk)
        check_fused_inputs(self.name, u, dict(zip(self.params, params)), self.params, iters, tol)
        check_skip(self.name, skip, u)
        check_chunk(self.name, chunk)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (u, *params)):
            return _FusedFunction.apply(self, tiles, skip, chunk, u, iters, tol, bool(stats), *params)
        return self.forward(u, params, iters, tol, bool(stats), tiles, skip, chunk)

    def sequential(self, u, *params) -> torch.Tensor:
        """The exact states ``s_t = f(s_{t-1}, u_t)`` (the loop's, to rounding) in one forward launch:
        one-step chunks, one iteration. Differentiable; the backward is the usual adjoint pass."""
        return self(u, *params, iters=1, tol=None, chunk=1)[0]


class _FusedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cell: FusedNewton, tiles, skip, chunk, u, iters, tol, stats, *params):
        s, res = cell.forward(u, params, iters, tol, stats, tiles, skip, chunk)
        ctx.save_for_backward(u, s, *params)
        ctx.cell, ctx.tiles = cell, tiles
        ctx.mark_non_differentiable(res)
        return s, res

    @staticmethod
    @once_differentiable
    def backward(ctx, gs, _gres):
        u, s, *params = ctx.saved_tensors
        grads = ctx.cell.backward(u, params, s, gs.contiguous(), ctx.tiles)
        return (None, None, None, None, grads[0], None, None, None, *grads[1:])
