"""Captured steps: the ``graph`` and ``compiled`` engines' LightningModule.

``CapturedLitSequenceModel`` trains as the eager ``experiments.trial.lit.LitSequenceModel`` does (the same
model, loss, schedule, metrics and checkpoints) with each optimizer step a replay of one CUDA graph: the
trial's Trainer gets the ``CUDAGraphPrecision`` plugin (``experiments.engines.cuda_graph``), which
captures the step's closure and ``optimizer.step()``. What a captured step needs is the ``CapturedSteps``
mixin (stacked trials use it too, ``experiments.trial.stack``):

- manual optimisation over chunks: one Lightning training step runs a ``tasks.datamodule.Chunk`` of
  optimizer steps (Lightning's host time per step would outweigh a replay).
- ``static_batch``: each batch is copied into static buffers that the step closure reads, one set per
  batch width (length bucketing cuts batches to a few widths: each gets a graph of its own); a batch of
  another size (an epoch's smaller last batch) runs eagerly on its own tensors (``graph=False``).
- the learning rate is a device tensor that the fused, capturable AdamW reads, written inside the step:
  a lookup in a device table of the schedule (``LR_TABLE_MAX_STEPS``) at a device step counter.
- ``train_loss``: the ``compiled`` engine's ``torch.compile``d model and loss (``cuda_graph.compiled_loss``:
  one Inductor graph), built when training starts.
- ``record_step``: besides the loss, a Newton mixer whose result did not pass its residual check inside
  a CUDA graph (``step_ok``) makes the fused AdamW skip this step's update (``found_inf``), as a gradient
  scaler does.
- ``on_validation_end``: captured forwards skip the mixers' run-time Jacobian check, so it runs on a
  validation sample after each validation (a mixer that switches its structure makes the captured step
  stale: captured again at the next step); and a trial whose captured steps keep skipping their updates
  (more than ``MAX_SKIPPED_SHARE`` between two validations) goes on with eager steps (``eager_from_step``
  records where), so a reported accuracy never comes from a model that silently stopped training.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from experiments.engines.cuda_graph import CUDAGraphPrecision, compiled_loss, set_graph_policy
from experiments.trial.lit import LitSequenceModel

#: the largest share of the captured steps between two validations that may skip their update (a Newton
#: solve failed its check) before the trial continues with eager steps
MAX_SKIPPED_SHARE = 0.05
#: schedules up to this many steps are a device table of learning rates (float32: 64 MiB at most), looked
#: up in one kernel per step; longer ones compute each step's lr from the step counter
LR_TABLE_MAX_STEPS = 2**24


def newton_mixers(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that solve by Newton's method (those with a ``step_ok`` flag)."""
    return [m for m in model.modules() if hasattr(m, "step_ok")]


def _keep_input_sample(module: nn.Module, args: tuple) -> None:
    """Forward pre-hook: keep a few sequences of the module's input of an evaluation forward (``input_sample``)."""
    if not module.training:
        module.input_sample = args[0][:4].detach()


def cosine_with_warmup_tensor(
    step: torch.Tensor, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> torch.Tensor:
    """``experiments.trial.lit.cosine_with_warmup`` of steps held in a tensor (float32, on its device):
    computable inside a CUDA graph."""
    t = step.float()
    progress = ((t - warmup_steps) / max(1, total_steps - warmup_steps)).clamp(0.0, 1.0)
    decay = min_ratio + (1 - min_ratio) * 0.5 * (1 + torch.cos(math.pi * progress))
    return torch.where(t < warmup_steps, (t + 1) / warmup_steps, decay)


class CapturedSteps:
    """What the graph engines add to a ``LitSequenceModel`` (or a subclass): see the module docstring.
    ``compiled``: the ``compiled`` engine (the model and loss ``torch.compile``d), else ``graph``."""

    def __init__(self, *args: Any, compiled: bool = False, static_shapes: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False  # training_step runs a chunk of optimizer steps
        #: ``static_shapes``: the compiled loss specializes to each batch shape (length-bucketed batches)
        self.compiled, self.static_shapes = compiled, static_shapes
        #: the ``compiled`` engine's ``(tokens, targets) -> loss`` (``compile_loss``), else None: the module's own
        self.compiled_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        #: the step from which the trial ran eagerly because captured steps skipped their updates (None: never)
        self.eager_from_step: int | None = None
        #: the optimizer's lr is a view of ``_lr_now``, written inside the step from ``_lr_table`` (or
        #: computed) at ``_step_counter``
        self.register_buffer("_step_counter", torch.zeros(1, dtype=torch.long), persistent=False)
        self.register_buffer("_lr_now", torch.zeros(1), persistent=False)
        self._lr_table: torch.Tensor | None = None
        #: the static batch buffers of each batch width (``static_batch``)
        self._static: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        #: the fused AdamW's ``found_inf``: 1.0 when a Newton solve of this step failed its check
        self.register_buffer("_skip_update", torch.zeros(()), persistent=False)
        #: the Newton mixers' device counters at the last validation
        self._graph_counts_seen: dict[int, list[int]] = {}

    def configure_optimizers(self):
        """AdamW with the lr a device tensor (set each step by ``set_learning_rate``); on CUDA the fused,
        capturable one, so a whole step can be captured in a CUDA graph. No scheduler: the step sets the lr."""
        cuda = self.device.type == "cuda"
        lr = torch.tensor(self.lr * self.lr_factor(0), device=self.device)
        return torch.optim.AdamW(
            self.parameters(), lr=lr, betas=self.betas, weight_decay=self.weight_decay, fused=cuda, capturable=cuda
        )

    def training_step(self, chunk, batch_idx: int) -> None:
        """Runs one optimizer step per batch ``(tokens (B, L), targets (B, L))`` of ``chunk`` (a
        ``tasks.datamodule.Chunk``: the batches of the training stream from this step on, so the batch
        of optimizer step ``t`` is the stream's batch ``t``, also after a resume), each a graph replay
        (without the ``CUDAGraphPrecision`` plugin, as in tests on the CPU, each an eager step)."""
        opt, replays = self.optimizers(), self.replays_graphs
        for tokens, targets in chunk.batches(self.global_step, batch_idx):
            tokens, targets, graph = self.static_batch(tokens, targets)
            closure = lambda t=tokens, y=targets: self.training_closure(  # noqa: E731
                opt.optimizer, t, y, self.manual_backward
            )
            opt.step(closure=closure, **({"graph": graph, "key": tokens.shape[-1]} if replays else {}))

    @property
    def replays_graphs(self) -> bool:
        """Whether the Trainer replays the steps as CUDA graphs (its precision plugin is ``CUDAGraphPrecision``)."""
        return isinstance(self.trainer.precision_plugin, CUDAGraphPrecision)

    def static_batch(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """``(tokens, targets, graph)``: the batch copied into the static buffers of its width (allocated at
        the first batch of that width) and ``True``, or a batch of another size than the first as it is and
        ``False`` (an eager step)."""
        first = next(iter(self._static.values()), None)
        if first is not None and first[0].shape[:-1] != tokens.shape[:-1]:
            return tokens, targets, False
        width = tokens.shape[-1]
        if width not in self._static:
            self._static[width] = (torch.empty_like(tokens), torch.empty_like(targets))
        static_tokens, static_targets = self._static[width]
        static_tokens.copy_(tokens)
        static_targets.copy_(targets)
        return static_tokens, static_targets, True

    def training_closure(
        self,
        optimizer: torch.optim.Optimizer,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        backward: Callable[[torch.Tensor], Any] = torch.Tensor.backward,
    ) -> torch.Tensor:
        """The optimizer step's closure: forward, loss, backward, clipping and the step's bookkeeping
        (``record_step``) of one batch; reads nothing on the host (capturable). ``backward``: Lightning's
        ``manual_backward`` in training; a plain ``loss.backward()`` without a trainer
        (``benchmarks.training.step_profile`` captures this same closure)."""
        optimizer.zero_grad(set_to_none=True)
        loss = self.train_loss(tokens, targets)
        backward(loss)
        if self.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.parameters(), self.grad_clip, foreach=True)
        self.record_step(loss, optimizer)
        return loss

    def train_loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training loss of one batch: the ``compiled`` engine's compiled model and loss (one Inductor
        graph), else the model and ``loss``."""
        if self.compiled_loss is not None:
            return self.compiled_loss(tokens, targets)
        return self.loss(self(tokens), targets)

    def compile_loss(self) -> None:
        """Compile the model and loss into ``compiled_loss`` (``cuda_graph.compiled_loss``; ``static_shapes``:
        a graph per batch shape)."""
        self.compiled_loss = compiled_loss(self.model, self.loss, self.static_shapes)

    @torch.no_grad()
    def record_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """What a step keeps besides its update, on the device only (capturable): the loss (``keep_loss``),
        the update's skip flag of the Newton mixers' checks and the next step's learning rate. About 5
        kernels, a share of a small model's step worth keeping low."""
        self.keep_loss(loss)
        flags = [m.step_ok for m in newton_mixers(self.model) if m.step_ok is not None]
        if flags:
            torch.eq(flags[0] if len(flags) == 1 else torch.stack(flags).all(), False, out=self._skip_update)
        optimizer.found_inf = self._skip_update if flags else None
        self.set_learning_rate()

    def set_learning_rate(self) -> None:
        """Write the lr of the step at ``_step_counter`` into ``_lr_now`` (a lookup in ``_lr_table``, or
        computed) and advance the counter; it stops at ``max_steps``, where the schedule ends."""
        step = self._step_counter
        if self._lr_table is not None:
            torch.index_select(self._lr_table, 0, step, out=self._lr_now)
        else:
            self._lr_now.copy_(
                self.lr * cosine_with_warmup_tensor(step, self.warmup_steps, self.max_steps, self.min_ratio)
            )
        torch.clamp(step + 1, max=self.max_steps, out=step)

    def bind_learning_rate(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the optimizer's lr a view of ``_lr_now`` (also after a restore, which brings an lr of its
        own), set to the lr of ``global_step``, and build the schedule's table when it is short enough."""
        self._lr_table = None
        if self.max_steps <= LR_TABLE_MAX_STEPS:
            steps = torch.arange(self.max_steps + 1, device=self.device)
            self._lr_table = self.lr * cosine_with_warmup_tensor(
                steps, self.warmup_steps, self.max_steps, self.min_ratio
            )
        self._lr_now.fill_(self.lr * self.lr_factor(self.global_step))
        for group in optimizer.param_groups:
            group["lr"] = self._lr_now[0]

    def on_train_start(self) -> None:
        """The schedule where the run stands (after a resume), the compiled loss (``compiled``, once), and
        the input samples the Jacobian check runs on."""
        self._step_counter.fill_(self.global_step)
        self.bind_learning_rate(self.optimizers().optimizer)
        if self.compiled and self.compiled_loss is None:
            self.compile_loss()
        for m in newton_mixers(self.model):
            if getattr(m, "jacobian_check_every", 0):
                m.register_forward_pre_hook(_keep_input_sample)

    def on_validation_end(self) -> None:
        """While fitting: the skipped-update check (``_stop_graphs_if_skipping``), then the run-time Jacobian
        check of Newton mixers on a validation sample; a mixer that switches its structure makes the
        captured step stale (captured again at the next step)."""
        trainer = self.trainer
        if trainer.sanity_checking or trainer.state.fn != "fit" or not self.replays_graphs:
            return
        self._stop_graphs_if_skipping()
        for m in newton_mixers(self.model):
            sample = getattr(m, "input_sample", None)
            if getattr(m, "jacobian_check_every", 0) and sample is not None and m.check_jacobian(sample, adapt=True):
                trainer.precision_plugin.reset()

    def _stop_graphs_if_skipping(self) -> None:
        """A captured step whose Newton solve fails its check skips its update (``record``). When more than
        ``MAX_SKIPPED_SHARE`` of the steps since the last validation did, the trial goes on with eager
        steps, where a failed solve is re-solved or falls back to the sequential loop, so every step
        updates (``eager_from_step`` records where; one read of the device counters per validation)."""
        plugin = self.trainer.precision_plugin
        if plugin.stopped:
            return
        for m in newton_mixers(self.model):
            counts = m.graph_counts.tolist()
            seen = self._graph_counts_seen.get(id(m), [0, 0, 0])
            forwards, skipped = counts[0] - seen[0], counts[2] - seen[2]
            self._graph_counts_seen[id(m)] = counts
            if forwards and skipped > MAX_SKIPPED_SHARE * forwards:
                plugin.stop_graphs()
                self.eager_from_step = self.global_step
                if self.compiled_loss is not None:  # eager steps: the plain model, with the sequential fallback
                    self.compiled_loss = None
                    set_graph_policy(self.model, False)
                rank_zero_info(
                    f"step {self.global_step}: {skipped} of {forwards} captured steps since the last validation "
                    "skipped their update (Newton solve failed its check): continuing with eager steps"
                )
                return


class CapturedLitSequenceModel(CapturedSteps, LitSequenceModel):
    """``LitSequenceModel`` trained with captured steps (the ``graph`` and ``compiled`` engines)."""
