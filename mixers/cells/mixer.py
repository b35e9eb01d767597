"""``cell_mixer``: turn a one-head ``RNNCell`` class into a multi-head sequence mixer.

``x (B, L, d_model)`` is split into ``num_heads`` heads of ``d_in = d_model / H`` channels; head
``k`` runs its own cell (own parameters, own input matrices: paper 000 App. C.1) with
``d_state / H`` state channels. The heads' outputs are concatenated; if that width is not
``d_model``, a linear ``out_proj`` maps it back. Heads run together through ``torch.func.vmap``
over the heads' stacked parameters (``CellMixer.stacked_parameters()``: ``{name: (H, ...)}``). A
cell class may also give ``heads_input_projection(params, x) -> u (H, B, L, *feat)``, every head's
``input_projection`` in one call (the Flash cells: one GEMM with a block-diagonal weight).

Modes (``mode=`` or, as for every mixer, ``backend=``):

- ``sequential``: the loop ``h_t = f(h_{t-1}, x_t)``; the ground truth. On CUDA float32 inputs a cell
  with ``fused_sequential`` (FlashGRU, FlashLSTM) runs it in one Triton launch per direction, the same
  states to rounding; elsewhere the Python loop (``seqkernels.newton.sequential_apply``).
- ``parallel``: Newton (``seqkernels.newton.newton_apply``) with the torch log-step reduction.
- ``parallel-triton``: the same with the reduction in the ``"triton"`` scan backend (diag/block2).
- ``fused``: the cell class's ``fused_apply`` (all Newton iterations in one kernel)::

      @classmethod
      def fused_apply(cls, params: dict[str, Tensor], u: Tensor, *, iters: int, tol: float | None,
                      skip: Tensor | None = None) -> Tensor

  ``params``: the heads' stacked parameters ``{name: (H, ...)}`` (after ``project_parameters_``);
  ``u (H, B, L, *feat)``: the per-head ``input_projection`` of the input; returns the states
  ``h (H, B, L, state_size)``, differentiable w.r.t. ``u`` and ``params``. ``skip`` (optional in the
  signature): a one-element bool tensor on the device; where true, run no iteration (the result is
  then unused: the in-graph re-solve, ``_solve_in_graph``, costs little when the first solve passed).
- ``auto``: on CUDA ``fused`` if the cell has ``fused_apply``, else ``parallel-triton`` when the
  Triton scan is available and the Jacobian
  is not dense, else ``parallel``; on the CPU ``parallel``.

With ``check=True`` every parallel result's residual ``max |f(h_{t-1}, x_t) - h_t|`` is checked:
non-finite or above ``divergence_tol * max(1, max |h|)`` -> in ``fused`` mode the solve is first
run again with ``retry_iters`` iterations (default ``max(4 * iters, 8)``; ``0`` skips it;
``retry_count`` counts these), which costs little next to the sequential loop; if that fails too, or
in the other modes, the sequential result is returned and ``fallback_count`` incremented
(``on_divergence="fallback"``) or ``NewtonDivergenceError`` is raised (``"raise"``).
``newton_forwards`` counts the forwards in a Newton mode, so ``fallback_count / newton_forwards``
is the fallback rate. ``last_newton_stats`` holds the max residuals of the last forward.

The residual check cannot see a wrong Jacobian: Newton may still converge (more slowly) to the right
states, but the backward pass solves the adjoint with the declared structure, so the gradients are
wrong. ``verify=True`` (default) checks the cell at construction (``RNNCell.verify_position_wise``
and ``RNNCell.verify_jacobian``, at random states and random moves of the parameters); training can
still move a parameter into a coupling the declaration rules out. So with ``jacobian_check_every =
N`` (default 100; ``0`` disables) the first and then every ``N``-th forward in a Newton mode that
builds an autograd graph (a training forward) also compares, in float64 at ``JACOBIAN_CHECK_POSITIONS``
sampled positions of its batch, the structured Jacobian the solve uses with autograd's dense one
(``check_jacobian``). The other forwards do nothing extra; a checking forward reads one number on
the host (a device sync), so it must not be captured in a CUDA graph (capture with
``jacobian_check_every=0`` and call ``check_jacobian(x)`` outside the graph instead). If the
relative difference exceeds ``JACOBIAN_RTOL``, ``on_divergence="raise"`` raises
``JacobianMismatchError``, a ``ValueError`` naming the declared and the fitting structure; with
``"fallback"`` the mixer warns once with the same line and from then on solves with the structure
that fits and autograd Jacobians (``structure``, ``closed_form`` and ``jacobian_fallback`` record
it; ``fused`` runs as ``parallel``), including the checking forward itself; a step that cannot be
differentiated one position at a time breaks the position-wise rule, and the mixer then runs
sequentially.
"""

from __future__ import annotations

import copy
import inspect
import warnings

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from mixers.cells.base import JACOBIAN_RTOL, RNNCell, fitting_structure, off_structure, structure_to_dense
from mixers.validate import is_int, non_negative_int, positive_int
from seqkernels._triton import triton_available
from seqkernels.newton import (
    STRUCTURES,
    NewtonDivergenceError,
    NewtonStats,
    autograd_jacobian,
    check_residual,
    newton_apply,
    residual,
    sequential_apply,
    shift_states,
)
from seqkernels.scan import SCAN_BACKENDS

MODES = ("auto", "sequential", "parallel", "parallel-triton", "fused")
#: positions (batch element, time step) per head sampled by the run-time Jacobian check
JACOBIAN_CHECK_POSITIONS = 8


class JacobianMismatchError(ValueError):
    """The structured Jacobian a Newton solve uses differs from autograd's at the current parameters."""


class CellMixer(nn.Module):
    """A multi-head mixer running one ``RNNCell`` per head; see the module docstring.

    Attributes: ``cells`` (one per head), ``last_newton_stats`` (``NewtonStats`` or ``None``),
    ``fallback_count`` (parallel results replaced by the sequential one since construction),
    ``retry_count`` (fused solves re-run with ``retry_iters`` iterations), ``newton_forwards``
    (forwards in a parallel or fused mode since construction), ``jacobian_checks`` (run-time Jacobian
    checks run), ``structure`` / ``closed_form`` (the Jacobian structure the solve uses and whether
    it uses the cell's ``jacobian_fn``: the cell's declaration unless a run-time check fell back) and
    ``jacobian_fallback`` (the check's message when it fell back, else ``None``).
    """

    BACKENDS = MODES

    def __init__(
        self,
        cell_class: type,
        d_model: int,
        num_heads: int = 4,
        d_state: int | None = None,
        mode: str = "auto",
        iters: int = 3,
        tol: float | None = None,
        damping: float | None = None,
        check: bool = True,
        divergence_tol: float = 1e-4,
        on_divergence: str = "fallback",
        verify: bool = True,
        retry_iters: int | None = None,
        jacobian_check_every: int = 100,
        cell_kwargs: dict | None = None,
    ):
        super().__init__()
        if not (isinstance(cell_class, type) and issubclass(cell_class, RNNCell)):
            raise TypeError(f"cell_class must be an RNNCell subclass, got {cell_class!r}")
        d_model, H = positive_int("d_model", d_model), positive_int("num_heads", num_heads)
        d_state = d_model if d_state is None else positive_int("d_state", d_state)
        if d_model % H or d_state % H:
            raise ValueError(f"d_model ({d_model}) and d_state ({d_state}) must be divisible by num_heads ({H})")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        non_negative_int("iters", iters)
        if tol is not None and not tol >= 0:
            raise ValueError(f"tol must be None or >= 0, got {tol!r}")
        if damping is not None and not 0.0 <= damping <= 1.0:
            raise ValueError(f"damping must be None or in [0, 1], got {damping!r}")
        if on_divergence not in ("fallback", "raise"):
            raise ValueError(f"on_divergence must be 'fallback' or 'raise', got {on_divergence!r}")
        if not divergence_tol > 0:
            raise ValueError(f"divergence_tol must be > 0, got {divergence_tol!r}")
        non_negative_int("jacobian_check_every", jacobian_check_every, " (0: no run-time check)")
        if mode == "fused" and cell_class.fused_apply is None:
            raise ValueError(
                f"mode='fused' needs {cell_class.__name__}.fused_apply; use mode='parallel' or 'parallel-triton'"
            )
        if mode == "parallel-triton" and cell_class.jacobian == "dense":
            raise ValueError(
                f"mode='parallel-triton' supports diag and block2 Jacobians; {cell_class.__name__} is dense: use mode='parallel'"
            )
        cell_kwargs = dict(cell_kwargs or {})
        self.cells = nn.ModuleList([cell_class(d_model // H, d_state // H, **cell_kwargs) for _ in range(H)])
        cell = self.cells[0]
        cell.check_shapes()
        if verify:
            cell.verify_position_wise()
            cell.verify_jacobian()
        self.d_model, self.num_heads, self.d_state, self.mode = d_model, H, d_state, mode
        self.d_in, self.state_size = cell.sizes()
        self.iters, self.tol, self.damping, self.check = iters, tol, damping, check
        self.divergence_tol, self.on_divergence = divergence_tol, on_divergence
        if retry_iters is not None and (not is_int(retry_iters) or retry_iters < 0):
            raise ValueError(f"retry_iters must be None or an int >= 0, got {retry_iters!r}")
        self.retry_iters = max(4 * iters, 8) if retry_iters is None else retry_iters
        with torch.no_grad():
            self.d_out = cell.output(torch.zeros(1, self.state_size)).shape[-1]
        width = H * self.d_out
        self.out_proj = nn.Linear(width, d_model, bias=False) if width != d_model else None
        self.last_newton_stats: NewtonStats | None = None
        self.fallback_count = 0
        self.newton_forwards = 0
        self.retry_count = 0
        self.jacobian_check_every, self.jacobian_checks = jacobian_check_every, 0
        self.structure, self.closed_form = cell.jacobian, cell.jacobian_fn is not None
        self._fused_takes_skip = (
            cell_class.fused_apply is not None and "skip" in inspect.signature(cell_class.fused_apply).parameters
        )
        self.jacobian_fallback: str | None = None
        self._graph_forwards = 0
        #: whether the last forward's result is checked (a bool tensor on the device), set only while a
        #: CUDA graph is captured (``_solve_in_graph``); ``None`` otherwise
        self.step_ok: torch.Tensor | None = None
        #: (forwards, re-solved, unchecked) counted on the device by captured forwards
        self.register_buffer("graph_counts", torch.zeros(3, dtype=torch.long), persistent=False)
        #: run the in-graph policy (``_solve_in_graph``) on CUDA while training also outside a capture, so
        #: the warm-up steps before a capture run the code that is captured (a ``torch.compile``d step then
        #: compiles nothing new inside the capture; ``experiments.engines.cuda_graph.compiled_loss``)
        self.graph_policy = False

    # --- stacked trials (``mixers.stacking``) --------------------------------------------------------
    trials = 1

    @classmethod
    def stack_trials(cls, mixers: list[CellMixer]) -> CellMixer:
        """The trials' heads side by side: ``S * H`` heads on wide inputs ``(B, L, S * d_model)``.

        Each trial's heads keep their own cells, so the stack computes what each mixer computes, with
        one difference: a Newton result is checked, re-solved or replaced by the sequential one for all
        heads of the stack at once, and inside a CUDA graph a failed check skips every trial's update.
        """
        from mixers.stacking import stack_trials

        first = mixers[0]
        config = (
            "d_model",
            "num_heads",
            "d_state",
            "mode",
            "iters",
            "tol",
            "damping",
            "check",
            "divergence_tol",
            "on_divergence",
            "retry_iters",
            "jacobian_check_every",
            "structure",
            "closed_form",
        )
        for m in mixers[1:]:
            if any(getattr(m, k) != getattr(first, k) for k in config) or type(m.cells[0]) is not type(first.cells[0]):
                raise ValueError("stacking: the trials' cell mixers have different configurations")
        S = len(mixers)
        stacked = copy.copy(first)
        stacked.__dict__ = dict(first.__dict__)
        stacked._parameters, stacked._modules = {}, {}
        stacked._buffers = {"graph_counts": torch.zeros_like(first.graph_counts)}
        stacked.cells = nn.ModuleList([copy.deepcopy(c) for m in mixers for c in m.cells])
        stacked.out_proj = stack_trials([m.out_proj for m in mixers]) if first.out_proj is not None else None
        stacked.trials, stacked.num_heads = S, S * first.num_heads
        stacked.d_model, stacked.d_state = S * first.d_model, S * first.d_state
        stacked.fallback_count = stacked.newton_forwards = stacked.retry_count = stacked.jacobian_checks = 0
        stacked._graph_forwards, stacked.last_newton_stats, stacked.step_ok = 0, None, None
        return stacked

    def trial_state(self, s: int) -> dict[str, torch.Tensor]:
        """Trial ``s``'s parameters under an ordinary mixer's names (``mixers.stacking.trial_state_dict``)."""
        H = self.num_heads // self.trials
        out = {f"cells.{h}.{n}": p for h in range(H) for n, p in self.cells[s * H + h].named_parameters()}
        if self.out_proj is not None:
            proj = self.out_proj.trial_state(s) if self.trials > 1 else dict(self.out_proj.named_parameters())
            out |= {f"out_proj.{n}": p for n, p in proj.items()}
        return out

    # --- parameters and per-head calls -------------------------------------------------------------
    def stacked_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: (H, ...)}``: every head's parameters and buffers stacked (differentiable)."""
        per_head = [dict(c.named_parameters()) | dict(c.named_buffers()) for c in self.cells]
        return {name: torch.stack([p[name] for p in per_head]) for name in per_head[0]}

    def _input_projection(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """``u (H, B, L, *feat)`` of ``x (B, L, H * d_in)``: the cell class's ``heads_input_projection``
        when it has one (all heads in one call), else its ``input_projection`` per head."""
        project = type(self.cells[0]).heads_input_projection
        if project is not None:
            return project(params, x)
        B, L, _ = x.shape
        return self._heads("input_projection", params, x.reshape(B, L, self.num_heads, self.d_in).permute(2, 0, 1, 3))

    def _heads(self, method: str, params: dict, *args: torch.Tensor) -> torch.Tensor:
        """Run ``cell.method(*args)`` for every head at once; ``args`` have the head dim first."""
        return vmap(lambda p, *a: functional_call(self.cells[0], p, (method, *a)))(params, *args)

    def _functions(self, params: dict):
        names = list(params)

        def step(h_prev, u, *values):
            return self._heads("state_update", dict(zip(names, values)), h_prev, u)

        jac = None
        if self.closed_form:

            def jac(h_prev, u, *values):
                return self._heads("jacobian_fn", dict(zip(names, values)), h_prev, u)

        return step, jac, [params[n] for n in names]

    # --- modes ---------------------------------------------------------------------------------------
    def resolve_mode(self, x: torch.Tensor) -> str:
        """The mode a forward on ``x`` uses (``auto`` resolved; after a run-time Jacobian fallback,
        ``fused`` -> ``parallel``, ``parallel-triton`` with a dense structure -> ``parallel``, and
        ``sequential`` if the step cannot be differentiated one position at a time)."""
        mode = self.mode
        cls = type(self.cells[0])
        if mode == "auto":
            mode = "parallel"
            if x.is_cuda and cls.fused_apply is not None:
                mode = "fused"
            elif x.is_cuda and "triton" in SCAN_BACKENDS and self.structure != "dense":
                mode = "parallel-triton"
        if self.jacobian_fallback is not None:
            if self.structure is None:
                return "sequential"
            if mode == "fused" or (mode == "parallel-triton" and self.structure == "dense"):
                return "parallel"
        return mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, L, d_model)`` -> ``(B, L, d_model)``."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"expected x of shape (B, L, d_model={self.d_model}), got {shape}")
        with torch.no_grad():
            for c in self.cells:
                c.project_parameters_()
        params = self.stacked_parameters()
        dtype = next(iter(params.values())).dtype if params else x.dtype
        if x.dtype != dtype:
            raise TypeError(f"x has dtype {x.dtype} but the cell parameters are {dtype}; convert one of them")
        B, L, _ = x.shape
        H = self.num_heads
        u = self._input_projection(params, x)  # (H, B, L, *feat)
        h = self._run(self.resolve_mode(x), u, params, x)  # (H, B, L, S)
        y = self._heads("output", params, h)  # (H, B, L, d_out)
        y = y.permute(1, 2, 0, 3).reshape(B, L, H * self.d_out)
        return self.out_proj(y) if self.out_proj is not None else y

    def _run(self, mode: str, u: torch.Tensor, params: dict, x: torch.Tensor) -> torch.Tensor:
        if (
            mode != "sequential"
            and u.is_cuda
            and ((self.graph_policy and self.training) or torch.cuda.is_current_stream_capturing())
        ):
            return self._solve_in_graph(mode, u, params, x)
        self.step_ok = None
        if mode == "sequential":
            self.last_newton_stats = NewtonStats(residuals=[], mode="sequential")
            fused_sequential = type(self.cells[0]).fused_sequential
            if (
                fused_sequential is not None
                and u.is_cuda
                and u.dtype == torch.float32
                and self.jacobian_fallback is None
            ):
                return fused_sequential(params, u)
            step, _, values = self._functions(params)
            return sequential_apply(step, u, values, state_size=self.state_size, time_dim=2)
        self.newton_forwards += 1
        h = self._solve(mode, u, params, x)
        if self.jacobian_check_every and h.requires_grad and (self.structure != "dense" or self.closed_form):
            due = self._graph_forwards % self.jacobian_check_every == 0
            self._graph_forwards += 1
            if due and self._jacobian_check(h, u, params):  # again, with the structure that fits (or sequentially)
                mode = self.resolve_mode(x)
                h = self._run(mode, u, params, x) if mode == "sequential" else self._solve(mode, u, params, x)
        return h

    def _solve(self, mode: str, u: torch.Tensor, params: dict, x: torch.Tensor) -> torch.Tensor:
        step, jac, values = self._functions(params)
        S = self.state_size
        if mode == "fused":
            fused_apply = type(self.cells[0]).fused_apply
            h = fused_apply(params, u, iters=self.iters, tol=self.tol)
            stats = NewtonStats(residuals=[], mode="fused")
            if self.check and not self._converged(stats, h, step, u, values):
                if self.retry_iters > self.iters:  # more iterations cost little next to the sequential loop
                    stats.retried = True
                    self.retry_count += 1
                    h = fused_apply(params, u, iters=self.retry_iters, tol=self.tol)
                if not (stats.retried and self._converged(stats, h, step, u, values)):
                    h = self._diverged(stats, step, u, values)
            self.last_newton_stats = stats
            return h
        backend = "torch"
        if mode == "parallel-triton":
            if "triton" not in SCAN_BACKENDS:
                raise ValueError(
                    "mode='parallel-triton' needs the 'triton' scan backend, which seqkernels.scan does not have yet; use mode='parallel'"
                )
            if not triton_available(x):
                raise ValueError(
                    f"mode='parallel-triton' cannot run Triton on {x.device} (needs CUDA, or TRITON_INTERPRET=1 on the CPU)"
                )
            backend = "triton"
        h, stats = newton_apply(
            step,
            u,
            values,
            state_size=S,
            structure=self.structure,
            jac=jac,
            time_dim=2,
            iters=self.iters,
            tol=self.tol,
            damping=self.damping,
            backend=backend,
            check=self.check,
            divergence_tol=self.divergence_tol,
            on_divergence=self.on_divergence,
        )
        stats.mode = mode
        self.fallback_count += int(stats.fell_back)
        self.last_newton_stats = stats
        return h

    def _solve_in_graph(self, mode: str, u: torch.Tensor, params: dict, x: torch.Tensor) -> torch.Tensor:
        """The Newton solve inside a CUDA graph being captured: no host reads, a fixed policy.

        ``fused``: the solve with ``iters``, then the re-solve with ``retry_iters``, predicated on the
        device (``fused_apply``'s ``skip``: it runs no iteration when the first solve passed its check;
        a ``fused_apply`` without ``skip`` runs it in full); the result is the first where its residual
        passes the check, else the re-solve. Other modes: the solve
        with ``iters``. ``step_ok`` (a bool tensor) says whether the result passed the check; the
        training step skips its parameter update when it did not (``experiments.trial.captured``), so an
        unchecked trajectory is never trained on. ``graph_counts`` counts (forwards, re-solves,
        unchecked results) on the device. The sequential fallback happens outside graphs only.
        """
        step, jac, values = self._functions(params)
        if mode == "fused":
            fused_apply = type(self.cells[0]).fused_apply
            h = fused_apply(params, u, iters=self.iters, tol=self.tol)
            ok = self._converged_on_device(h, step, u, values)
            retried = torch.zeros_like(ok)
            if self.check and self.retry_iters > self.iters:
                # predicated on the device: with a skip-aware fused_apply no iteration runs when ``ok``
                skip = {"skip": ok} if self._fused_takes_skip else {}
                h_retry = fused_apply(params, u, iters=self.retry_iters, tol=self.tol, **skip)
                h, retried = torch.where(ok, h, h_retry), ~ok
                ok = ok | self._converged_on_device(h_retry, step, u, values)
        else:
            backend = "triton" if mode == "parallel-triton" else "torch"
            h, _ = newton_apply(
                step,
                u,
                values,
                state_size=self.state_size,
                structure=self.structure,
                jac=jac,
                time_dim=2,
                iters=self.iters,
                tol=None,
                damping=self.damping,
                backend=backend,
                check=False,
            )
            ok, retried = self._converged_on_device(h, step, u, values), None
        if not self.check:
            ok = torch.ones_like(ok)
        with torch.no_grad():
            self.graph_counts += torch.stack(
                [torch.ones_like(ok), retried if retried is not None else torch.zeros_like(ok), ~ok]
            ).long()
        self.step_ok = ok
        self.last_newton_stats = NewtonStats(residuals=[], mode=f"{mode} (CUDA graph)")
        return h

    def _converged_on_device(self, h: torch.Tensor, step, u: torch.Tensor, values) -> torch.Tensor:
        """``check_residual`` as a bool tensor: the max residual is finite and ``<= divergence_tol * max(1, max |h|)``."""
        with torch.no_grad():
            r = residual(step, h.detach(), u.detach(), [v.detach() for v in values], time_dim=2).abs().amax()
            h_max = h.detach().abs().amax()
            return torch.isfinite(r) & torch.isfinite(h_max) & (r <= self.divergence_tol * h_max.clamp_min(1.0))

    def _converged(self, stats: NewtonStats, h: torch.Tensor, step, u: torch.Tensor, values) -> bool:
        """Record the max residual of ``h`` in ``stats``; is it within ``divergence_tol``? (One device sync.)"""
        with torch.no_grad():
            r = residual(step, h.detach(), u.detach(), [v.detach() for v in values], time_dim=2)
            final, h_max = torch.stack([r.abs().amax(), h.detach().abs().amax()]).tolist() if h.numel() else (0.0, 0.0)
        stats.residuals.append(final)
        return check_residual(final, h_max, self.divergence_tol)

    def _diverged(self, stats: NewtonStats, step, u, values) -> torch.Tensor:
        message = (
            f"{stats.mode} Newton result has max residual {stats.final_residual:.3g} "
            f"(divergence_tol {self.divergence_tol:g})"
        )
        if self.on_divergence == "raise":
            raise NewtonDivergenceError(message, stats.residuals)
        stats.fell_back = True
        self.fallback_count += 1
        return sequential_apply(step, u, values, state_size=self.state_size, time_dim=2)

    # --- the run-time Jacobian check ---------------------------------------------------------------
    def jacobian_mismatch(
        self, h: torch.Tensor, u: torch.Tensor, params: dict, positions: int = JACOBIAN_CHECK_POSITIONS, seed: int = 0
    ) -> tuple[str, str | None] | None:
        """Compare the structured Jacobian the solve uses with autograd's dense one at sampled positions.

        ``h (H, B, L, S)``: states, ``u (H, B, L, *feat)``: the heads' input projections, ``params``:
        ``stacked_parameters()``. At ``positions`` positions ``(b, t)`` drawn with ``seed``, in float64:
        ``J = d state_update / d h`` at ``(h_{t-1}, u_t)`` by reverse-mode autograd (dense), against
        the Jacobian in ``structure`` (the closed form if ``closed_form``, else autograd in
        ``structure``) written out densely. Returns ``None`` if they agree within ``JACOBIAN_RTOL``
        of ``max |J|`` (or nothing is finite to compare), else ``(message, fitting structure)``, the
        structure ``None`` if the derivative cannot be taken one position at a time. One host read.
        """
        B, L = h.shape[1:3]
        if B * L == 0:
            return None
        gen = torch.Generator().manual_seed(seed)
        flat = torch.randint(B * L, (min(positions, B * L),), generator=gen).to(h.device)
        b, t = flat // L, flat % L
        cell = self.cells[0]
        with torch.no_grad():
            hp = shift_states(h.detach(), 2)[:, b, t].double()  # (H, k, S)
            uk = u.detach()[:, b, t].double()  # (H, k, *feat)
            p64 = {n: v.detach().double() if v.is_floating_point() else v.detach() for n, v in params.items()}

        def dense_one_head(p, hh, uu):
            return vmap(jacrev(lambda h1, u1: functional_call(cell, p, ("state_update", h1, u1))))(hh, uu)

        def structured_one_head(p, hh, uu):
            if self.closed_form:
                return functional_call(cell, p, ("jacobian_fn", hh, uu))
            return autograd_jacobian(lambda h1: functional_call(cell, p, ("state_update", h1, uu)), hh, self.structure)

        name = type(cell).__name__
        try:
            dense = vmap(dense_one_head)(p64, hp, uk).detach()  # (H, k, S, S)
            used = structure_to_dense(vmap(structured_one_head)(p64, hp, uk).detach(), self.structure)
        except Exception as err:  # noqa: BLE001 -- the user's step, one position at a time
            message = (
                f"{name}: d state_update / d h cannot be taken one position at a time ({type(err).__name__}: "
                f"{err}): the step breaks the position-wise rule, so no Jacobian structure makes the Newton "
                "solve right"
            )
            return message, None
        scale = dense.abs().amax().clamp_min(1e-300)
        numbers = torch.stack([(used - dense).abs().amax() / scale, *[off_structure(dense, st) for st in STRUCTURES]])
        err, *offs = numbers.tolist()
        offs = dict(zip(STRUCTURES, offs))
        if not err > JACOBIAN_RTOL:  # also False for NaN: nothing finite to compare
            return None
        fits = fitting_structure(offs)
        where = f"at {len(flat)} positions of the batch, current parameters"
        if offs[self.structure] > JACOBIAN_RTOL:
            message = (
                f"{name} declares jacobian={self.structure!r} but d h'/d h has entries outside that structure "
                f"(up to {offs[self.structure]:.2g} of the largest) {where}: the Newton gradients would be off "
                f"by that order; declare jacobian={fits!r}"
            )
            return message, fits
        if not self.closed_form:  # autograd in the declared structure sums what lies outside it
            fits = fits if fits != self.structure else "dense"
            message = (
                f"{name} declares jacobian={self.structure!r}: d h'/d h has entries outside that structure, "
                f"each at most {offs[self.structure]:.2g} of the largest, that add up to {err:.2g} in the "
                f"Jacobian taken by autograd in that structure {where}: the Newton gradients would be off by "
                f"that order; declare jacobian={fits!r}"
            )
            return message, fits
        message = (
            f"{name}.jacobian_fn differs from autograd by {err:.2g} (relative) {where}: the Newton gradients "
            f"would be off by that order; fix jacobian_fn or delete it (autograd in jacobian={self.structure!r})"
        )
        return message, self.structure

    def check_jacobian(self, x: torch.Tensor, adapt: bool = False) -> str | None:
        """The run-time Jacobian check on input ``x (B, L, d_model)``, states from the sequential loop.

        Returns ``None`` if the structured Jacobian the solve uses matches autograd's, else the
        one-line message. With ``adapt=False`` it changes nothing (the probe); with ``adapt=True`` it
        acts as the check during training does (raise, or switch to the structure that fits): what
        runs outside a captured CUDA graph, whose forwards skip the check.
        """
        with torch.no_grad():
            for c in self.cells:
                c.project_parameters_()
            params = self.stacked_parameters()
            u = self._input_projection(params, x)
            h = self._run("sequential", u, params, x)
        if adapt:
            return self.jacobian_fallback if self._jacobian_check(h, u, params) else None
        found = self.jacobian_mismatch(h, u, params)
        return None if found is None else found[0]

    def _jacobian_check(self, h: torch.Tensor, u: torch.Tensor, params: dict) -> bool:
        """Run the check; on a mismatch raise, or switch to the fitting structure (none: sequential). True if it switched."""
        found = self.jacobian_mismatch(h, u, params, seed=self.jacobian_checks)
        self.jacobian_checks += 1
        if found is None:
            return False
        message, fits = found
        if self.on_divergence == "raise":
            raise JacobianMismatchError(message)
        message += (
            f"; this mixer now solves with jacobian={fits!r} by autograd"
            if fits is not None
            else "; this mixer now runs sequentially"
        )
        warnings.warn(message, RuntimeWarning, stacklevel=6)
        self.structure, self.closed_form, self.jacobian_fallback = fits, False, message
        return True

    def extra_repr(self) -> str:
        return (
            f"cell={type(self.cells[0]).__name__}, d_model={self.d_model}, num_heads={self.num_heads}, "
            f"d_state={self.d_state}, mode={self.mode!r}, iters={self.iters}, tol={self.tol}, damping={self.damping}, "
            f"jacobian_check_every={self.jacobian_check_every}"
            + (f", structure={self.structure!r} (run-time fallback)" if self.jacobian_fallback else "")
        )


_MIXER_KEYS = (
    "d_state",
    "mode",
    "iters",
    "tol",
    "damping",
    "check",
    "divergence_tol",
    "on_divergence",
    "verify",
    "retry_iters",
    "jacobian_check_every",
)


def cell_mixer(
    cell_class: type, d_model: int, num_heads: int = 4, *, backend: str | None = None, **config
) -> CellMixer:
    """Build a ``CellMixer`` from ``cell_class``; keys not of the mixer go to the cell's ``__init__``.

    Mixer keys: ``d_state, mode (or backend), iters, tol, damping, check, divergence_tol,
    on_divergence, verify, retry_iters, jacobian_check_every``; e.g. ``cell_mixer(FlashGRUCell, 64, clip_norm=None)`` passes
    ``clip_norm`` to every head's ``FlashGRUCell(d_in, d_state, clip_norm=None)``.
    """
    if backend is not None:
        if "mode" in config and config["mode"] != backend:
            raise ValueError(f"backend={backend!r} and mode={config['mode']!r} disagree; give one of them")
        config["mode"] = backend
    mixer_cfg = {k: config.pop(k) for k in list(config) if k in _MIXER_KEYS}
    if config:
        try:
            cell_params = inspect.signature(cell_class.__init__).parameters
        except (TypeError, ValueError):
            cell_params = {}
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in cell_params.values())
        cell_keys = [k for k in cell_params if k not in ("self", "d_in", "d_state")]
        unknown = [k for k in config if k not in cell_keys]
        if unknown and not accepts_any:
            raise TypeError(
                f"unknown config key(s) {', '.join(map(repr, unknown))} for a {cell_class.__name__} mixer; "
                f"mixer keys: num_heads, backend, {', '.join(_MIXER_KEYS)}; cell keys: {', '.join(cell_keys) or '(none)'}"
            )
    return CellMixer(cell_class, d_model, num_heads, cell_kwargs=config, **mixer_cfg)
