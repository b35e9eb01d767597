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
- ``fused_apply``: a classmethod unlocking ``mode="fused"`` (see ``mixers/cells/mixer.py``);
- ``fused_sequential``: a classmethod ``(params, u) -> h``, the loop's exact states in a kernel; the
  ``sequential`` mode runs it on CUDA float32 inputs instead of the Python loop.

Jacobian structures (state ``h`` of size ``S``): ``diag``: ``(..., S)``; ``block2``: the state split
in two halves, each of the 4 blocks diagonal: ``(..., 2, 2, S/2)`` with ``[i, j]`` = d half_i / d
half_j; ``dense``: ``(..., S, S)`` with ``[i, j] = d h'_i / d h_j``.

Checks (each raises a one-line ``ValueError``, or returns a report with ``raise_on_error=False``):
``check_shapes``; ``verify_position_wise`` (the step gives the same result for the same positions
laid out differently); ``verify_jacobian`` (the declared structure, and ``jacobian_fn``, against
autograd's dense Jacobian). The last two run at random states for the parameters as built *and*
for random moves of every trainable parameter (``_parameter_draws``), so a coupling that starts at
zero is caught before training moves it. ``CellMixer`` runs all three at construction (a few ms);
``experiments.probe`` runs them with more states and draws.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from seqkernels.newton import STRUCTURES, autograd_jacobian, jacobian_shape

#: relative size (of the largest entry) above which an entry outside a structure counts as nonzero
JACOBIAN_RTOL = 1e-6


@dataclasses.dataclass
class JacobianCheck:
    """Result of ``RNNCell.verify_jacobian``: relative sizes, worst over the probed states and parameters."""

    ok: bool
    structure: str
    off_structure: float  # max |J_ij| outside the declared structure / max |J|
    closed_form_error: float | None  # max |jacobian_fn - autograd| / max |J|, None without jacobian_fn
    message: str
    fits: str = "dense"  # the first of STRUCTURES that holds every probed Jacobian
    param_draws: int = 0  # perturbed parameter draws with finite Jacobians (besides the built parameters)


@dataclasses.dataclass
class PositionWiseCheck:
    """Result of ``RNNCell.verify_position_wise``."""

    ok: bool
    error: float  # max |step(layout A) - step(layout B)| / max |step|
    message: str


def _structure_mask(structure: str, S: int, device=None) -> torch.Tensor:
    """Boolean ``(S, S)``: where the declared structure allows nonzero ``J[i, j]``."""
    eye = torch.eye(S, dtype=torch.bool, device=device)
    if structure == "diag":
        return eye
    if structure == "block2":
        half = torch.eye(S // 2, dtype=torch.bool, device=device)
        return half.repeat(2, 2)
    return torch.ones(S, S, dtype=torch.bool, device=device)


def _to_structure(J: torch.Tensor, structure: str) -> torch.Tensor:
    """Extract ``structure`` from dense ``J (..., S, S)``."""
    S = J.shape[-1]
    if structure == "diag":
        return torch.diagonal(J, dim1=-2, dim2=-1)
    if structure == "block2":
        h = S // 2
        blocks = [
            [torch.diagonal(J[..., i * h : (i + 1) * h, j * h : (j + 1) * h], dim1=-2, dim2=-1) for j in range(2)]
            for i in range(2)
        ]
        return torch.stack([torch.stack(row, dim=-2) for row in blocks], dim=-3)
    return J


def structure_to_dense(J: torch.Tensor, structure: str) -> torch.Tensor:
    """The dense ``(..., S, S)`` matrix of a structured Jacobian (inverse of extracting ``structure``)."""
    if structure == "diag":
        return torch.diag_embed(J)
    if structure == "block2":  # (..., 2, 2, S/2): [i, j] = the diagonal of block (i, j)
        rows = [torch.cat([torch.diag_embed(J[..., i, j, :]) for j in range(2)], dim=-1) for i in range(2)]
        return torch.cat(rows, dim=-2)
    return J


def off_structure(dense: torch.Tensor, structure: str, dim: tuple[int, ...] | None = None) -> torch.Tensor:
    """``max |J_ij|`` outside ``structure`` / ``max |J|`` over dense ``J (..., S, S)``, reduced over ``dim`` (default: all)."""
    S = dense.shape[-1]
    dim = tuple(range(dense.dim())) if dim is None else dim
    scale = dense.abs().amax(dim=dim).clamp_min(1e-300)
    if structure == "block2" and S % 2:
        return torch.full_like(scale, math.inf)
    return dense.masked_fill(_structure_mask(structure, S, dense.device), 0).abs().amax(dim=dim) / scale


def fitting_structure(offs: dict[str, float], rtol: float = JACOBIAN_RTOL) -> str:
    """The first of ``STRUCTURES`` whose ``off_structure`` (``offs[structure]``) is within ``rtol``."""
    return next((st for st in STRUCTURES if offs[st] <= rtol), "dense")


def _parameter_draws(cell: nn.Module, draws: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``cell``'s parameters and buffers in float64 for ``1 + draws`` draws: ``{name: (1 + draws, ...)}``.

    Draw 0 is the parameters as built. Draw ``k >= 1`` sets each trainable parameter ``p`` (as built:
    ``p0``) to ``p0 + sigma * N(0, 1)`` with ``sigma = max(rms(p0) / 2, 0.05)`` and applies
    ``project_parameters_``: values training can reach. A parameter that starts at zero (a gate, a
    coupling) gets random values of that scale; buffers and frozen parameters keep their values.
    Run the cell's methods on the draws with ``_on_draws``; ``cell`` itself is not changed.
    """
    trainable = {n for n, p in cell.named_parameters() if p.requires_grad}
    built = {
        n: t.detach().double() if t.is_floating_point() else t.detach()
        for n, t in (dict(cell.named_parameters()) | dict(cell.named_buffers())).items()
    }
    stacked = {n: [t] for n, t in built.items()}
    with torch.no_grad():
        for _ in range(draws):
            moved = {n: t.clone() for n, t in built.items()}
            for n in trainable:
                b = built[n]
                sigma = max(0.5 * float(b.square().mean().sqrt()) if b.numel() else 0.0, 0.05)
                moved[n] += sigma * torch.randn(b.shape, generator=gen, dtype=b.dtype).to(b.device)
            functional_call(cell, moved, ("project_parameters_",))  # in place, on the moved tensors
            for n, t in moved.items():
                stacked[n].append(t)
    return {n: torch.stack(v) for n, v in stacked.items()}


def _on_draws(cell: nn.Module, params: dict[str, torch.Tensor], method: str, *args: torch.Tensor) -> torch.Tensor:
    """``cell.method(*args)`` for every draw of ``params`` at once; ``args`` have the draw dim first."""
    return vmap(lambda p, *a: functional_call(cell, p, (method, *a)))(params, *args)


class RNNCell(nn.Module):
    """Base class of recurrent cells; see the module docstring."""

    jacobian: ClassVar[str] = "dense"
    fused_apply: ClassVar = None  # classmethod fused_apply(params, u, *, iters, tol[, skip]) -> h; see mixer.py
    fused_sequential: ClassVar = None  # classmethod fused_sequential(params, u) -> h, the loop's states; see mixer.py
    #: optional classmethod heads_input_projection(params, x) -> u: every head's input_projection at once
    #: (``x (B, L, H * d_in)`` -> ``u (H, B, L, *feat)``); see mixer.py
    heads_input_projection: ClassVar = None

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
            raise TypeError(
                f"{type(self).__name__} must define recurrence_step(self, h, x) (or state_update(self, h, u))"
            )
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

    def verify_jacobian(
        self,
        probes: int = 8,
        rtol: float = JACOBIAN_RTOL,
        raise_on_error: bool = True,
        seed: int = 0,
        param_draws: int = 2,
    ) -> JacobianCheck:
        """Check the declared ``jacobian`` structure (and ``jacobian_fn``, if any) at random states and parameters.

        Computes the dense ``d state_update / d h`` by reverse-mode autograd in float64, one position
        at a time (``vmap`` over positions), at ``probes`` random ``(h, x)`` (standard normal) for the
        parameters as built and for ``param_draws`` random moves of every trainable parameter
        (``_parameter_draws``: a coupling initialized to zero is caught although it is zero now), and
        measures the largest entry outside the declared structure relative to the largest entry of the
        same draw. Probes with non-finite Jacobians are left out. Raises ``ValueError`` (or returns
        ``ok=False`` when ``raise_on_error=False``) if it exceeds ``rtol`` in any draw -- the message
        names the structure that fits -- if ``jacobian_fn`` disagrees with autograd, or if the
        derivative cannot be taken one position at a time.
        """
        d_in, S = self.sizes()
        name = type(self).__name__
        if self.jacobian == "block2" and S % 2:
            raise ValueError(f"{name} declares jacobian='block2' but its state size {S} is odd")
        gen = torch.Generator().manual_seed(seed)
        params = _parameter_draws(self, param_draws, gen)
        D, dev = 1 + param_draws, next(iter(params.values()), torch.empty(0)).device
        h = torch.randn(D, probes, S, generator=gen, dtype=torch.float64).to(dev)
        x = torch.randn(D, probes, d_in, generator=gen, dtype=torch.float64).to(dev)

        def jac_one_draw(p, hh, uu):
            return vmap(jacrev(lambda h1, u1: functional_call(self, p, ("state_update", h1, u1))))(hh, uu)

        try:
            with torch.no_grad():
                u = _on_draws(self, params, "input_projection", x)
            dense = vmap(jac_one_draw)(params, h, u).detach()  # (D, P, S, S)
        except Exception as err:  # the user's step: say what we asked of it
            message = (
                f"{name}: d state_update / d h cannot be taken one position at a time (torch.func vmap + "
                f"jacrev on h ({S},), x ({d_in},)): {type(err).__name__}: {err}; the step must act "
                "position-wise for any leading dims, including none"
            )
            if raise_on_error:
                raise ValueError(message) from err
            return JacobianCheck(False, self.jacobian, math.nan, None, message, "dense", 0)
        finite = dense.flatten(2).isfinite().all(2)  # (D, P)
        dense = dense.masked_fill(~finite[..., None, None], 0.0)
        usable = finite.any(1)  # draws with a finite Jacobian somewhere
        per_draw = torch.stack([off_structure(dense, st, dim=(1, 2, 3)) for st in STRUCTURES], 1)  # (D, structures)
        per_draw = per_draw.masked_fill(~usable[:, None], 0.0).tolist()
        offs = {st: max(row[i] for row in per_draw) for i, st in enumerate(STRUCTURES)}
        k = STRUCTURES.index(self.jacobian)
        off, off_built = offs[self.jacobian], per_draw[0][k]
        fits = fitting_structure(offs, rtol)
        finite_draws = int(usable[1:].sum())
        where = f"{probes} random states x (built + {finite_draws} randomly moved) parameters"
        problems, closed = [], None
        if off > rtol:
            at = (
                "at randomly moved parameters, not at the built ones (a coupling that starts at zero mixes the "
                "channels once training moves it)"
                if off_built <= rtol
                else "at random states"
            )
            problems.append(
                f"{name} declares jacobian={self.jacobian!r} but d h'/d h has entries outside that "
                f"structure (up to {off:.2g} of the largest) {at}; declare jacobian={fits!r}"
            )
        if self.jacobian_fn is not None:
            with torch.no_grad():
                got = _on_draws(self, params, "jacobian_fn", h, u)
            want = _to_structure(dense, self.jacobian)
            if tuple(got.shape) != tuple(want.shape):
                problems.append(
                    f"{name}.jacobian_fn returned shape {tuple(got.shape[1:])}, expected {tuple(want.shape[1:])}"
                )
            else:
                scale = dense.abs().amax(dim=(1, 2, 3)).clamp_min(1e-300)
                mask = finite.view(*finite.shape, *[1] * (got.dim() - 2))
                diff = (got - want).masked_fill(~mask, 0.0).abs().flatten(1).amax(1) / scale
                closed = float(diff.amax())
                if closed > 1e-8:
                    problems.append(f"{name}.jacobian_fn differs from autograd by {closed:.2g} (relative) at {where}")
        if not problems and not bool(usable.any()):
            message = f"{name}: jacobian={self.jacobian!r} not checked: d h'/d h is non-finite at every probed state"
        else:
            message = "; ".join(problems) or f"{name}: jacobian={self.jacobian!r} verified at {where}"
        if problems and raise_on_error:
            raise ValueError(message)
        return JacobianCheck(not problems, self.jacobian, off, closed, message, fits, finite_draws)

    def verify_position_wise(
        self, rtol: float = 1e-9, raise_on_error: bool = True, seed: int = 0, param_draws: int = 2
    ) -> PositionWiseCheck:
        """Check that the step (``recurrence_step``, i.e. ``state_update(h, input_projection(x))``) acts on each position on its own.

        The mixer calls the step on one step's states ``(B, S)`` (sequential) and on all ``(B, L, S)``
        at once (parallel); a step that mixes positions (a cumulative op or a mean over a leading dim,
        a branch on ``h.dim()``) gives different results in the two. Evaluates it in float64 at random
        ``(h, x)`` with leading dims ``(3, 5)`` and compares with the same positions laid out as
        ``(5, 3)`` and as 15 shuffled positions ``(15,)``, for the built
        parameters and ``param_draws`` random moves of them (as ``verify_jacobian``). Raises
        ``ValueError`` (or returns ``ok=False``) if they differ by more than ``rtol`` (relative).
        """
        d_in, S = self.sizes()
        name = type(self).__name__
        gen = torch.Generator().manual_seed(seed)
        params = _parameter_draws(self, param_draws, gen)
        D, dev = 1 + param_draws, next(iter(params.values()), torch.empty(0)).device
        h = torch.randn(D, 3, 5, S, generator=gen, dtype=torch.float64).to(dev)
        x = torch.randn(D, 3, 5, d_in, generator=gen, dtype=torch.float64).to(dev)
        perm = torch.randperm(15, generator=gen).to(dev)

        def step(hh, xx):
            return _on_draws(self, params, "recurrence_step", hh, xx)

        try:
            with torch.no_grad():
                ref = step(h, x)
                layouts = {
                    "(L, B) = (5, 3)": (step(h.transpose(1, 2), x.transpose(1, 2)).transpose(1, 2), ref),
                    "(B*L,) = (15,) shuffled": (
                        step(h.flatten(1, 2)[:, perm], x.flatten(1, 2)[:, perm]),
                        ref.flatten(1, 2)[:, perm],
                    ),
                }
        except Exception as err:
            message = (
                f"{name}: the step failed on positions laid out differently (leading dims (5, 3), (15,)): "
                f"{type(err).__name__}: {err}; the step must act position-wise for any leading dims"
            )
            if raise_on_error:
                raise ValueError(message) from err
            return PositionWiseCheck(False, math.inf, message)
        scale = float(ref.abs().nan_to_num(0.0, 0.0, 0.0).amax().clamp_min(1e-300))
        worst, bad = 0.0, None
        for layout, (got, want) in layouts.items():
            same = (got == want) | (got.isnan() & want.isnan())
            err = float(torch.where(same, 0.0, (got - want).abs()).nan_to_num(math.inf).amax()) / scale
            if err > worst:
                worst, bad = err, layout
        if worst > rtol:
            message = (
                f"{name} breaks the position-wise rule: state_update gives results that differ by up to "
                f"{worst:.2g} (relative) when the same positions are laid out as {bad} instead of (B, L) = "
                "(3, 5) (it mixes positions: a cumulative op, a mean or a branch over the leading dims); the "
                "step must act on each position on its own, for any leading dims"
            )
            if raise_on_error:
                raise ValueError(message)
            return PositionWiseCheck(False, worst, message)
        return PositionWiseCheck(True, worst, f"{name}: position-wise (relative difference {worst:.1g} across layouts)")

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
                raise ValueError(
                    f"{name}.recurrence_step(h {tuple(h.shape)}, x {tuple(x.shape)}) failed: {err}"
                ) from err
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
                    raise ValueError(
                        f"{name}.jacobian_fn returned shape {tuple(J.shape)}, expected {want} for jacobian={self.jacobian!r}"
                    )
            y = self.output(h)
            if y.dim() != 3 or tuple(y.shape[:2]) != (2, 3):
                raise ValueError(
                    f"{name}.output returned shape {tuple(y.shape)} for h {tuple(h.shape)}; expected (2, 3, d_out)"
                )
