"""Captured steps: the ``graph`` and ``compiled`` engines' hook into the eager ``LitSequenceModel``.

``LitSequenceModel`` runs plain eager optimizer steps. A trial of a graph engine sets
``module.step_engine = CapturedSteps(compiled=...)`` (``experiments.trial.train.engine_hook``) and gives
its Trainer the ``CUDAGraphPrecision`` plugin (``experiments.engines.cuda_graph``), which replays each
optimizer step from one CUDA graph. The module calls the hook where its name says (the
``experiments.trial.lit.StepEngine`` protocol):

- ``batch``: each batch is copied into static buffers that the step closure reads, so the step can be a
  CUDA-graph replay; a batch of another shape (an epoch's smaller last batch) runs eagerly on its own
  tensors (``optimizer.step(graph=False)``).
- ``loss``: the ``compiled`` engine's ``torch.compile``d model and loss (``cuda_graph.compiled_loss``: one
  Inductor graph), built when training starts.
- ``record``: a Newton mixer whose result did not pass its residual check inside a CUDA graph
  (``step_ok``) makes the fused AdamW skip this step's update (``found_inf``), as a gradient scaler does.
- ``on_train_start``, ``on_validation_end``: captured forwards skip the mixers' run-time Jacobian check,
  so it runs on a validation sample after each validation (a mixer that switches its structure makes
  the captured step stale: captured again at the next step); and a trial whose captured steps keep
  skipping their updates (more than ``MAX_SKIPPED_SHARE`` between two validations) goes on with eager
  steps (``eager_from_step`` records where), so a reported accuracy never comes from a model that
  silently stopped training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from experiments.engines.cuda_graph import compiled_loss, set_graph_policy

#: the largest share of the captured steps between two validations that may skip their update (a Newton
#: solve failed its check) before the trial continues with eager steps
MAX_SKIPPED_SHARE = 0.05


def newton_mixers(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that solve by Newton's method (those with a ``step_ok`` flag)."""
    return [m for m in model.modules() if hasattr(m, "step_ok")]


def _keep_input_sample(module: nn.Module, args: tuple) -> None:
    """Forward pre-hook: keep a few sequences of the module's input of an evaluation forward (``input_sample``)."""
    if not module.training:
        module.input_sample = args[0][:4].detach()


class CapturedSteps:
    """The hook of the ``graph`` engine (``compiled=False``) or the ``compiled`` engine (``compiled=True``)
    into one ``LitSequenceModel`` (see the module docstring); one per trial (it keeps the trial's static
    batch buffers and counters)."""

    def __init__(self, compiled: bool = False) -> None:
        self.compiled = compiled
        #: the ``compiled`` engine's ``(tokens, targets) -> loss`` (``compile``), else None: the module's own
        self.loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        #: the step from which the trial ran eagerly because captured steps skipped their updates (None: never)
        self.eager_from_step: int | None = None
        self._static: tuple[torch.Tensor, torch.Tensor] | None = None
        #: the fused AdamW's ``found_inf``: 1.0 when a Newton solve of this step failed its check
        self._skip_update: torch.Tensor | None = None
        #: the Newton mixers' device counters at the last validation
        self._graph_counts_seen: dict[int, list[int]] = {}

    def compile(self, module) -> None:
        """Compile ``module``'s model and loss into ``loss`` (``cuda_graph.compiled_loss``)."""
        self.loss = compiled_loss(module.model, module._loss)

    def batch(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """``(tokens, targets, step options)``: the batch copied into the static buffers (allocated at the
        first batch) and ``graph=True``, or a batch of another shape as it is and ``graph=False``."""
        if self._static is None:
            self._static = (torch.empty_like(tokens), torch.empty_like(targets))
        if self._static[0].shape != tokens.shape:
            return tokens, targets, {"graph": False}
        self._static[0].copy_(tokens)
        self._static[1].copy_(targets)
        return self._static[0], self._static[1], {"graph": True}

    @torch.no_grad()
    def record(self, module, optimizer: torch.optim.Optimizer) -> None:
        """Inside the step, after backward (capturable): the update's skip flag of the Newton mixers' checks."""
        flags = [m.step_ok for m in newton_mixers(module.model) if m.step_ok is not None]
        if flags:
            if self._skip_update is None:
                self._skip_update = torch.zeros((), device=flags[0].device)
            torch.eq(flags[0] if len(flags) == 1 else torch.stack(flags).all(), False, out=self._skip_update)
        optimizer.found_inf = self._skip_update if flags else None

    def on_train_start(self, module) -> None:
        """The compiled loss (``compiled``, once), and the input samples the Jacobian check runs on."""
        if self._skip_update is None:
            self._skip_update = torch.zeros((), device=module.device)
        if self.compiled and self.loss is None:
            self.compile(module)
        for m in newton_mixers(module.model):
            if getattr(m, "jacobian_check_every", 0):
                m.register_forward_pre_hook(_keep_input_sample)

    def on_validation_end(self, module) -> None:
        """While fitting: the skipped-update check (``_stop_graphs_if_skipping``), then the run-time Jacobian
        check of Newton mixers on a validation sample; a mixer that switches its structure makes the
        captured step stale (captured again at the next step)."""
        trainer = module.trainer
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._stop_graphs_if_skipping(module)
        for m in newton_mixers(module.model):
            sample = getattr(m, "input_sample", None)
            if getattr(m, "jacobian_check_every", 0) and sample is not None and m.check_jacobian(sample, adapt=True):
                trainer.precision_plugin.reset()

    def _stop_graphs_if_skipping(self, module) -> None:
        """A captured step whose Newton solve fails its check skips its update (``record``). When more than
        ``MAX_SKIPPED_SHARE`` of the steps since the last validation did, the trial goes on with eager
        steps, where a failed solve is re-solved or falls back to the sequential loop, so every step
        updates (``eager_from_step`` records where; one read of the device counters per validation)."""
        plugin = module.trainer.precision_plugin
        if plugin.stopped:
            return
        for m in newton_mixers(module.model):
            counts = m.graph_counts.tolist()
            seen = self._graph_counts_seen.get(id(m), [0, 0, 0])
            forwards, skipped = counts[0] - seen[0], counts[2] - seen[2]
            self._graph_counts_seen[id(m)] = counts
            if forwards and skipped > MAX_SKIPPED_SHARE * forwards:
                plugin.stop_graphs()
                self.eager_from_step = module.global_step
                if self.loss is not None:  # eager steps: the plain model, with the sequential fallback
                    self.loss = None
                    set_graph_policy(module.model, False)
                rank_zero_info(
                    f"step {module.global_step}: {skipped} of {forwards} captured steps since the last validation "
                    "skipped their update (Newton solve failed its check): continuing with eager steps"
                )
                return
