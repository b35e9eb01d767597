"""``RNNCell``: a recurrent cell defined by its recurrence step; everything else is derived.

A user writes, for ONE head::

    class MyCell(RNNCell):
        jacobian = "diag"                       # "diag" | "block2" | "dense"
        def __init__(self, d_in, d_state):
            super().__init__()
            self.w = nn.Parameter(torch.rand(d_state))
            self.W = nn.Parameter(torch.randn(d_in, d_state) / d_in ** 0.5)
        def recurrence_step(self, h, x):        # h (..., d_state), x (..., d_in) -> (..., d_state)
            return torch.tanh(self.w * h + x @ self.W)

``recurrence_step`` must act position-wise for any leading dims (one step, or all ``L`` steps at
once given the shifted states). Optional overrides:

- ``input_projection(x) -> u`` and ``state_update(h, u) -> h'``: split the input-only part (a matmul,
  computed once over all ``L``) from the recurrent part, so Newton iterations do not redo it.
  A cell defines either ``recurrence_step`` or ``state_update`` (then ``recurrence_step(h, x) =
  state_update(h, input_projection(x))``).
- ``jacobian_fn(h_prev, u)``: the closed-form ``d state_update / d h`` in the declared structure
  (``u`` = the output of ``input_projection``); default: autograd.
- ``state_size``: the size of ``h`` when it differs from ``d_state`` (FlashLSTM: ``2 d_state``,
  the state ``[c, h]``); ``output(h)``: what the mixer outputs from the state (default ``h``).
- ``project_parameters_()``: in-place parameter constraint applied (under ``no_grad``) before each
  mixer forward, e.g. the norm clipping of FlashGRU/FlashLSTM.
- ``fused_apply``: a classmethod unlocking ``mode="fused"`` (see ``mixers/cells/mixer.py``).

Jacobian structures (state ``h`` of size ``S``): ``diag``: ``(..., S)``; ``block2``: the state split
in two halves, each of the 4 blocks diagonal: ``(..., 2, 2, S/2)`` with ``[i, j]`` = d half_i / d
half_j; ``dense``: ``(..., S, S)`` with ``[i, j] = d h'_i / d h_j``.
"""

from __future__ import annotations

import copy
import functools
import dataclasses
from typing import ClassVar, Optional

import torch
from torch import nn
from torch.func import jacrev, vmap

from kernels.newton import STRUCTURES, autograd_jacobian, jacobian_shape


@dataclasses.dataclass
class JacobianCheck:
    """Result of ``RNNCell.verify_jacobian``: relative sizes in the probed states."""

    ok: bool
    structure: str
    off_structure: float  # max |J_ij| outside the declared structure / max |J|
    closed_form_error: Optional[float]  # max |jacobian_fn - autograd| / max |J|, None without jacobian_fn
    message: str


def _structure_mask(structure: str, S: int) -> torch.Tensor:
    """Boolean ``(S, S)``: where the declared structure allows nonzero ``J[i, j]``."""
    eye = torch.eye(S, dtype=torch.bool)
    if structure == "diag":
        return eye
    if structure == "block2":
        half = torch.eye(S // 2, dtype=torch.bool)
        return half.repeat(2, 2)
    return torch.ones(S, S, dtype=torch.bool)


def _to_structure(J: torch.Tensor, structure: str) -> torch.Tensor:
    """Extract ``structure`` from dense ``J (..., S, S)``."""
    S = J.shape[-1]
    if structure == "diag":
        return torch.diagonal(J, dim1=-2, dim2=-1)
    if structure == "block2":
        h = S // 2
        blocks = [[torch.diagonal(J[..., i * h:(i + 1) * h, j * h:(j + 1) * h], dim1=-2, dim2=-1) for j in range(2)] for i in range(2)]
        return torch.stack([torch.stack(row, dim=-2) for row in blocks], dim=-3)
    return J


class RNNCell(nn.Module):
    """Base class of recurrent cells; see the module docstring."""

    jacobian: ClassVar[str] = "dense"
    fused_apply: ClassVar = None  # classmethod fused_apply(params, u, *, iters, tol) -> h; see mixer.py

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.jacobian not in STRUCTURES:
            raise ValueError(
                f"{cls.__name__}.jacobian = {cls.jacobian!r} is not a Jacobian structure; "
                f"use one of {', '.join(map(repr, STRUCTURES))}"
            )
        if "__init__" in cls.__dict__:  # remember the sizes without asking the user to store them
            init = cls.__dict__["__init__"]

            @functools.wraps(init)
            def __init__(self, d_in, d_state, *args, **kwargs):
                init(self, d_in, d_state, *args, **kwargs)
                if getattr(self, "d_in", None) is None:
                    self.d_in = d_in
                if getattr(self, "d_state", None) is None:
                    self.d_state = d_state

            cls.__init__ = __init__

    def forward(self, method: str, *args):
        """Dispatch to ``method`` (lets ``torch.func.functional_call`` run any method with stacked heads)."""
        return getattr(self, method)(*args)

    # --- what a cell defines -------------------------------------------------------------------
    def recurrence_step(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``h (..., S)``, ``x (..., d_in)`` -> the next state ``(..., S)``."""
        return self.state_update(h, self.input_projection(x))

    def input_projection(self, x: torch.Tensor) -> torch.Tensor:
        """The input-only part of the step, computed once for all positions (default: ``x``)."""
        return x

    def state_update(self, h: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The recurrent part: ``state_update(h, input_projection(x)) == recurrence_step(h, x)``."""
        if type(self).recurrence_step is RNNCell.recurrence_step:
            raise TypeError(f"{type(self).__name__} must define recurrence_step(self, h, x) (or state_update(self, h, u))")
        return self.recurrence_step(h, u)

    jacobian_fn = None  # optional: def jacobian_fn(self, h_prev, u) -> structured d state_update / d h

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """What the mixer outputs from the state ``h (..., S)`` (default: ``h``)."""
        return h

    def project_parameters_(self) -> None:
        """In-place parameter constraint, applied before each mixer forward (default: none)."""

    # --- derived ---------------------------------------------------------------------------------
    def sizes(self) -> tuple[int, int]:
        """``(d_in, state_size)``: ``d_in``/``d_state`` as stored by ``__init__``, ``state_size`` if set."""
        d_in, d_state = getattr(self, "d_in", None), getattr(self, "d_state", None)
        if d_in is None or d_state is None:
            raise TypeError(f"{type(self).__name__}.__init__ must take (d_in, d_state) and call super().__init__()")
        return d_in, getattr(self, "state_size", d_state)

    def structured_jacobian(self, h_prev: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``d state_update(h, u) / d h`` at ``h_prev`` in the declared structure (closed form if any)."""
        if self.jacobian_fn is not None:
            return self.jacobian_fn(h_prev, u)
        return autograd_jacobian(lambda h: self.state_update(h, u), h_prev, self.jacobian)

    def verify_jacobian(self, probes: int = 8, rtol: float = 1e-6, raise_on_error: bool = True, seed: int = 0) -> JacobianCheck:
        """Check the declared ``jacobian`` structure (and ``jacobian_fn``, if any) at random states.

        Computes the dense Jacobian by reverse-mode autograd in float64 at ``probes`` random
        ``(h, x)`` (standard normal) and measures the largest entry outside the declared structure
        relative to the largest entry. Raises ``ValueError`` (or returns ``ok=False`` when
        ``raise_on_error=False``) if it exceeds ``rtol``, or if ``jacobian_fn`` disagrees with autograd.
        """
        d_in, S = self.sizes()
        if self.jacobian == "block2" and S % 2:
            raise ValueError(f"{type(self).__name__} declares jacobian='block2' but its state size {S} is odd")
        cell = copy.deepcopy(self).double()
        gen = torch.Generator().manual_seed(seed)
        h = torch.randn(probes, S, generator=gen, dtype=torch.float64)
        x = torch.randn(probes, d_in, generator=gen, dtype=torch.float64)
        with torch.no_grad():
            u = cell.input_projection(x)
        dense = vmap(jacrev(lambda hh, uu: cell.state_update(hh, uu)))(h, u).detach()  # (P, S, S)
        scale = dense.abs().max().clamp_min(1e-300)
        mask = _structure_mask(self.jacobian, S)
        off = float(dense.masked_fill(mask, 0).abs().max() / scale)
        name = type(self).__name__
        problems = []
        if off > rtol:
            rel = lambda st: float(dense.masked_fill(_structure_mask(st, S), 0).abs().max() / scale)  # noqa: E731
            fits = next(st for st in STRUCTURES if (st != "block2" or S % 2 == 0) and rel(st) <= rtol)
            problems.append(
                f"{name} declares jacobian={self.jacobian!r} but d h'/d h has entries outside that structure "
                f"(up to {off:.2g} of the largest); declare jacobian={fits!r}"
            )
        closed = None
        if self.jacobian_fn is not None:
            with torch.no_grad():
                got = cell.jacobian_fn(h, u)
            want = _to_structure(dense, self.jacobian)
            if tuple(got.shape) != tuple(want.shape):
                problems.append(f"{name}.jacobian_fn returned shape {tuple(got.shape)}, expected {tuple(want.shape)}")
            else:
                closed = float((got - want).abs().max() / scale)
                if closed > 1e-8:
                    problems.append(f"{name}.jacobian_fn differs from autograd by {closed:.2g} (relative)")
        message = "; ".join(problems) or f"{name}: jacobian={self.jacobian!r} verified at {probes} random states"
        if problems and raise_on_error:
            raise ValueError(message)
        return JacobianCheck(not problems, self.jacobian, off, closed, message)

    def check_shapes(self) -> None:
        """One-line ``ValueError`` if the step, projection, Jacobian or output have wrong shapes."""
        d_in, S = self.sizes()
        name = type(self).__name__
        p = next(self.parameters(), None)
        kw = {"dtype": p.dtype if p is not None else torch.float32, "device": p.device if p is not None else "cpu"}
        if self.jacobian == "block2" and S % 2:
            raise ValueError(f"{name} declares jacobian='block2' but its state size {S} is odd")
        with torch.no_grad():
            h, x = torch.zeros(2, 3, S, **kw), torch.zeros(2, 3, d_in, **kw)
            try:
                out = self.recurrence_step(h, x)
            except Exception as err:  # surface the user's error with the shapes we passed
                raise ValueError(f"{name}.recurrence_step(h {tuple(h.shape)}, x {tuple(x.shape)}) failed: {err}") from err
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, 3, S):
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(
                    f"{name}.recurrence_step returned shape {got} for h {tuple(h.shape)}, x {tuple(x.shape)}; "
                    f"expected {(2, 3, S)} (same shape as h: leading dims kept, state size {S})"
                )
            if self.jacobian_fn is not None:
                J = self.jacobian_fn(h, self.input_projection(x))
                want = jacobian_shape(self.jacobian, (2, 3), S)
                if tuple(J.shape) != want:
                    raise ValueError(f"{name}.jacobian_fn returned shape {tuple(J.shape)}, expected {want} for jacobian={self.jacobian!r}")
            y = self.output(h)
            if y.dim() != 3 or tuple(y.shape[:2]) != (2, 3):
                raise ValueError(f"{name}.output returned shape {tuple(y.shape)} for h {tuple(h.shape)}; expected (2, 3, d_out)")
