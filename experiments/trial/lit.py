"""The LightningModule: cross-entropy over scored positions, AdamW with a cosine schedule and linear
warmup, torchmetrics token accuracy (micro), exact match and final-position accuracy on the
validation and test sets.

Metric names: ``val/acc``, ``val/exact``, ``val/last_acc``, and for each test set ``<name>/acc``,
``<name>/exact``, ``<name>/last_acc``, ``<name>/top_pred`` (the share of the most often predicted class:
1.0 for a model collapsed to a constant output) (``test``, then ``len<L>`` per extrapolation length and
``range<a>-<b>`` for a test set of lengths drawn from ``a..b``).
``acc`` averages over every scored position, ``last_acc`` scores only the last scored position of
each sequence (where a single-label task puts its label), so one run gives both readings.

The hyperparameters are plain data (``save_hyperparameters``), so a checkpoint rebuilds its model:
``LitSequenceModel.load_from_checkpoint(path)``.

Optimizer steps run eagerly. A step engine that runs them otherwise (CUDA-graph replays:
``experiments.engines.captured.CapturedSteps``) hooks in through ``step_engine`` (a ``StepEngine``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassExactMatch

from experiments.trial.model import ModelConfig, SequenceModel
from mixers.stacking import stack_trials
from tasks import IGNORE_INDEX

#: on a GPU, schedules up to this many steps are a device table of learning rates (float32: 64 MiB at
#: most), looked up in one kernel per step; longer ones compute each step's lr from the step counter
LR_TABLE_MAX_STEPS = 2**24


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


def last_scored(preds: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``preds``, ``targets (N, L)`` -> ``(N',)`` each: the last scored position of every sequence that has one."""
    positions = torch.arange(targets.shape[1], device=targets.device).expand_as(targets)
    last = torch.where(targets != IGNORE_INDEX, positions, -1).amax(dim=1)
    rows = (last >= 0).nonzero().squeeze(1)
    return preds[rows, last[rows]], targets[rows, last[rows]]


class LastPositionAccuracy(Metric):
    """Accuracy at the last scored position of each sequence (``update(preds (N, L), targets (N, L))``)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        p, t = last_scored(preds, targets)
        self.correct += (p == t).sum()
        self.total += t.numel()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp_min(1)


class TopPredictionShare(Metric):
    """Share of the scored positions whose prediction is the most often predicted class: 1.0 for a model
    collapsed to a constant output (``update(preds (N, L), targets (N, L))``, class ids in ``[0, num_classes)``)."""

    full_state_update = False

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.add_state("counts", default=torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        self.counts += torch.bincount(preds[targets != IGNORE_INDEX].flatten(), minlength=self.num_classes)

    def compute(self) -> torch.Tensor:
        return self.counts.max().float() / self.counts.sum().clamp_min(1)


def _metrics(num_classes: int, prefix: str, top_pred: bool = False) -> MetricCollection:
    """Accuracy, exact match and last-position accuracy; with ``top_pred`` (test sets) ``TopPredictionShare``."""
    metrics = {
        "acc": MulticlassAccuracy(num_classes=num_classes, average="micro", ignore_index=IGNORE_INDEX),
        "exact": MulticlassExactMatch(num_classes=num_classes, multidim_average="global", ignore_index=IGNORE_INDEX),
        "last_acc": LastPositionAccuracy(),
    }
    if top_pred:
        metrics["top_pred"] = TopPredictionShare(num_classes)
    return MetricCollection(metrics, prefix=f"{prefix}/")


def warmup_steps(warmup_ratio: float, max_steps: int) -> int:
    """Steps of the linear warm-up: ``warmup_ratio`` of ``max_steps``, at least 1 (ratio 0: the first
    step already runs at the full lr)."""
    return max(1, int(warmup_ratio * max_steps))


def cosine_with_warmup(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """LR multiplier of step ``step`` (0-based): linear warmup to 1 over ``warmup_steps``, then cosine decay to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def cosine_with_warmup_tensor(
    step: torch.Tensor, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> torch.Tensor:
    """``cosine_with_warmup`` of a step held in a tensor (float32, on its device): computable inside a CUDA graph."""
    t = step.float()
    progress = ((t - warmup_steps) / max(1, total_steps - warmup_steps)).clamp(0.0, 1.0)
    decay = min_ratio + (1 - min_ratio) * 0.5 * (1 + torch.cos(math.pi * progress))
    return torch.where(t < warmup_steps, (t + 1) / warmup_steps, decay)


class StepEngine(Protocol):
    """How a step engine other than eager steps hooks into ``LitSequenceModel`` (``step_engine``; the
    graph engines' ``experiments.engines.captured.CapturedSteps``). The module calls each method where
    its name says and reads ``loss`` and ``eager_from_step``."""

    #: the training loss ``(tokens, targets) -> loss`` when the engine computes it, else None (the module's)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
    #: the step from which the trial ran eagerly after all (None: never); the results row reports it
    eager_from_step: int | None

    def batch(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """``(tokens, targets, options)``: the batch the step's closure reads, and ``optimizer.step``'s options."""
        ...

    def record(self, module: LitSequenceModel, optimizer: torch.optim.Optimizer) -> None:
        """Inside the step, after backward: the engine's bookkeeping, on the device only (capturable)."""
        ...

    def on_train_start(self, module: LitSequenceModel) -> None: ...

    def on_validation_end(self, module: LitSequenceModel) -> None: ...


class LitSequenceModel(L.LightningModule):
    """Trains a ``SequenceModel``.

    Args:
        model: the model's ``ModelConfig`` as a plain dict (``dataclasses.asdict``; a ``ModelConfig`` is
            converted), so the hyperparameters saved in checkpoints are plain data.
        lr: peak learning rate; ``weight_decay``, ``betas``: AdamW (paper: 1e-6, (0.9, 0.999)).
        max_steps: the schedule's length; ``warmup_ratio``: fraction of it spent warming up.
        test_set_names: names of the test dataloaders, in order.
        stack_seeds: train the trials of these seeds as one stacked model (``mixers.stacking``; at least
            two): each trial's model is built after ``torch.manual_seed(seed)``, as its own trial builds
            it; batches are ``(S, B, L)`` (row ``s``: trial ``s``'s); the loss is the sum of the trials'
            own mean losses, so each trial's gradients are its own; validation metrics are logged per
            trial as ``s<seed>/val/acc`` etc. (``experiments.trial.stack`` trains them; ``train/loss`` is the
            trials' mean). ``None``: one trial.
    """

    def __init__(
        self,
        model: dict[str, Any] | ModelConfig,
        lr: float = 5e-4,
        weight_decay: float = 1e-6,
        betas: tuple[float, float] | list[float] = (0.9, 0.999),
        max_steps: int = 10_000,
        warmup_ratio: float = 0.1,
        test_set_names: tuple[str, ...] | list[str] = ("test",),
        stack_seeds: list[int] | None = None,
        min_lr: float = 0.0,
        grad_clip: float | None = None,
    ) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        model_config = model if isinstance(model, ModelConfig) else ModelConfig(**model)
        self.save_hyperparameters(
            {
                "model": dataclasses.asdict(model_config),
                "lr": float(lr),
                "weight_decay": float(weight_decay),
                "betas": [float(b) for b in betas],
                "max_steps": int(max_steps),
                "warmup_ratio": float(warmup_ratio),
                "test_set_names": list(test_set_names),
                **({"stack_seeds": [int(x) for x in stack_seeds]} if stack_seeds is not None else {}),
                **({"min_lr": float(min_lr)} if min_lr else {}),
                **({"grad_clip": float(grad_clip)} if grad_clip else {}),
            }
        )
        if grad_clip and stack_seeds is not None:
            raise ValueError("grad_clip clips each trial's own gradient: stacked trials (stack_seeds) cannot use it")
        self.stack_seeds = [int(x) for x in stack_seeds] if stack_seeds is not None else None
        if self.stack_seeds is None:
            self.model = SequenceModel(model_config)
        else:
            if len(self.stack_seeds) < 2 or len(set(self.stack_seeds)) != len(self.stack_seeds):
                raise ValueError(f"stack_seeds must be at least two distinct seeds, got {stack_seeds!r}")
            models = []
            for seed in self.stack_seeds:
                torch.manual_seed(seed)
                models.append(SequenceModel(model_config))
            self.model = stack_trials(models)
        self.lr, self.weight_decay, self.betas = lr, weight_decay, tuple(betas)
        self.max_steps, self.warmup_ratio = max_steps, warmup_ratio
        #: the schedule decays to ``min_lr`` (a fraction ``_min_ratio`` of ``lr``); ``grad_clip``: max global norm
        self._min_ratio, self.grad_clip = min(1.0, min_lr / lr), grad_clip
        self.test_set_names = tuple(test_set_names)
        n = model_config.num_classes
        self.val_metrics = (
            _metrics(n, "val")
            if self.stack_seeds is None
            else nn.ModuleList([_metrics(n, f"s{seed}/val") for seed in self.stack_seeds])
        )
        self.test_metrics = nn.ModuleList([_metrics(n, name, top_pred=True) for name in self.test_set_names])
        self.automatic_optimization = False  # training_step runs a chunk of optimizer steps (see there)
        # training-step state on the device: written inside the (possibly captured) step, read on the host
        # only when logging or validating
        self.register_buffer("_last_loss", torch.zeros(()), persistent=False)
        #: the largest training loss of this fit: NaN or inf once any step's loss was (``torch.maximum``
        #: propagates NaN), so one kernel per step watches for a non-finite loss
        self.register_buffer("_max_loss", torch.zeros(()), persistent=False)
        self.register_buffer("_step_counter", torch.zeros(1, dtype=torch.long), persistent=False)
        #: on a GPU the optimizer's lr is a view of this buffer, written inside the (captured) step
        self.register_buffer("_lr_now", torch.zeros(1), persistent=False)
        self._lr_table: torch.Tensor | None = None
        #: the step engine's hook (set before ``fit``; ``experiments.trial.train.engine_hook``); None: eager steps
        self.step_engine: StepEngine | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the scored positions; stacked trials (``logits (S, B, L, C)``): the sum
        of each trial's own mean."""
        if logits.dim() == 3:
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        S = logits.shape[0]
        losses = F.cross_entropy(
            logits.flatten(0, 2).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        )
        scored = (targets != IGNORE_INDEX).reshape(S, -1).sum(1)
        return (losses.view(S, -1).sum(1) / scored).sum()

    # --- training: one Lightning step runs a chunk of optimizer steps ------------------------------------
    def training_step(self, chunk, batch_idx: int) -> None:
        """Runs one optimizer step per batch ``(tokens (B, L), targets (B, L))`` of ``chunk`` (a
        ``tasks.datamodule.Chunk``: the batches of the training stream from this step on, so the batch
        of optimizer step ``t`` is the stream's batch ``t``, also after a resume).

        A step engine (``step_engine``) gives the batch the closure reads and the step's options (a CUDA
        graph's static buffers). The training loss is logged every ``log_every_n_steps`` Lightning steps
        (``self.log`` costs about a millisecond of host time: too much for every step of a small model).
        """
        opt = self.optimizers()
        for tokens, targets in chunk.batches(self.global_step, batch_idx):
            options: dict[str, Any] = {}
            if self.step_engine is not None:
                tokens, targets, options = self.step_engine.batch(tokens, targets)
            closure = lambda t=tokens, y=targets: self.training_closure(  # noqa: E731
                opt.optimizer, t, y, self.manual_backward
            )
            opt.step(closure=closure, **options)
        if not self._max_loss.is_cuda:  # free on the CPU; on a GPU checked at validations (no sync per step)
            self._raise_if_nonfinite()
        if (batch_idx + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            loss = self._last_loss / len(self.stack_seeds) if self.stack_seeds else self._last_loss
            self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False, batch_size=1)

    def training_closure(
        self,
        optimizer: torch.optim.Optimizer,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        backward: Callable[[torch.Tensor], Any] = torch.Tensor.backward,
    ) -> torch.Tensor:
        """The optimizer step's closure: forward, loss, backward and the step's bookkeeping
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
        """The training loss of one batch: the step engine's when it has one (the ``compiled`` engine's
        compiled model and loss, one Inductor graph), else the model and ``_loss``."""
        engine_loss = self.step_engine.loss if self.step_engine is not None else None
        if engine_loss is not None:
            return engine_loss(tokens, targets)
        return self._loss(self.model(tokens), targets)

    @torch.no_grad()
    def record_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """What a training step keeps besides its update, on the device only (capturable): the loss (the
        last, and the largest, which is NaN or inf once any was), the step engine's bookkeeping
        (``StepEngine.record``: the graph engines' skip flag of the update) and the next step's learning
        rate. About 5 kernels on a GPU, a share of a small model's step worth keeping low."""
        loss = loss.detach()
        torch.maximum(self._max_loss, loss, out=self._max_loss)
        self._last_loss.copy_(loss)
        if self.step_engine is not None:
            self.step_engine.record(self, optimizer)
        self._set_learning_rate(optimizer)

    def _set_learning_rate(self, optimizer: torch.optim.Optimizer) -> None:
        """The lr of this step, ``lr * cosine_with_warmup(step)``: on a GPU written into the device tensor
        the optimizer reads (a lookup in ``_lr_table``, or computed from the step counter), else a float."""
        group = optimizer.param_groups[0]
        if not isinstance(group["lr"], torch.Tensor):
            group["lr"] = self.lr * cosine_with_warmup(
                self.global_step, self._warmup_steps, self.max_steps, self._min_ratio
            )
            return
        step = self._step_counter
        if self._lr_table is not None:
            torch.index_select(self._lr_table, 0, step, out=self._lr_now)
        else:
            self._lr_now.copy_(
                self.lr * cosine_with_warmup_tensor(step, self._warmup_steps, self.max_steps, self._min_ratio)
            )
        torch.clamp(step + 1, max=self.max_steps, out=step)  # the schedule ends at max_steps (lr 0)

    def bind_learning_rate(self, optimizer: torch.optim.Optimizer) -> None:
        """On a GPU: make the optimizer's lr a view of ``_lr_now`` (also after a restore, which brings a
        tensor of its own) and build the schedule's table when it is short enough."""
        if not isinstance(optimizer.param_groups[0]["lr"], torch.Tensor):
            return
        self._lr_table = None
        if self.max_steps <= LR_TABLE_MAX_STEPS:
            steps = torch.arange(self.max_steps + 1, device=self.device)
            self._lr_table = self.lr * cosine_with_warmup_tensor(
                steps, self._warmup_steps, self.max_steps, self._min_ratio
            )
        self._lr_now.fill_(
            self.lr * cosine_with_warmup(self.global_step, self._warmup_steps, self.max_steps, self._min_ratio)
        )
        for group in optimizer.param_groups:
            group["lr"] = self._lr_now[0]

    @property
    def _warmup_steps(self) -> int:
        return warmup_steps(self.warmup_ratio, self.max_steps)

    def on_train_start(self) -> None:
        self._step_counter.fill_(self.global_step)  # where the schedule stands (after a resume)
        self.bind_learning_rate(self.optimizers().optimizer)
        if self.step_engine is not None:
            self.step_engine.on_train_start(self)

    def _raise_if_nonfinite(self) -> None:
        if not bool(torch.isfinite(self._max_loss)):
            raise NonFiniteLossError(
                f"training loss became non-finite (NaN or Inf) at or before step {self.global_step} "
                f"(last loss {float(self._last_loss)})"
            )

    def on_validation_start(self) -> None:
        if self.trainer.state.fn == "fit":
            self._raise_if_nonfinite()

    def on_train_end(self) -> None:
        self._raise_if_nonfinite()

    def on_validation_end(self) -> None:
        if self.step_engine is not None:
            self.step_engine.on_validation_end(self)

    def validation_step(self, batch, batch_idx: int) -> None:
        tokens, targets = batch
        if self.stack_seeds is not None:  # every trial on the same validation set
            S = len(self.stack_seeds)
            logits = self(tokens.expand(S, *tokens.shape))
            preds = logits.argmax(-1)
            for s, metrics in enumerate(self.val_metrics):
                metrics.update(preds[s], targets)
            self.log(
                "val/loss",
                self._loss(logits, targets.expand(S, *targets.shape)) / S,
                on_epoch=True,
                batch_size=tokens.shape[0],
            )
            return
        logits = self(tokens)
        self.val_metrics.update(logits.argmax(-1), targets)
        self.log("val/loss", self._loss(logits, targets), on_epoch=True, batch_size=tokens.shape[0])

    def on_validation_epoch_end(self) -> None:
        for metrics in self.val_metrics if self.stack_seeds is not None else [self.val_metrics]:
            self.log_dict(metrics.compute(), prog_bar=self.stack_seeds is None)
            metrics.reset()

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        tokens, targets = batch
        self.test_metrics[dataloader_idx].update(self(tokens).argmax(-1), targets)

    def on_test_epoch_start(self) -> None:
        for metrics in self.test_metrics:  # a test pass begun again (after running out of memory) starts clean
            metrics.reset()

    def on_test_epoch_end(self) -> None:
        for metrics in self.test_metrics:
            self.log_dict(metrics.compute())
            metrics.reset()

    def configure_optimizers(self):
        """AdamW; on CUDA the fused, capturable one with the lr as a device tensor (set each step by
        ``_set_learning_rate``), so a whole step can be captured in a CUDA graph."""
        cuda = self.device.type == "cuda"
        lr = (
            torch.tensor(
                self.lr * cosine_with_warmup(0, self._warmup_steps, self.max_steps, self._min_ratio), device=self.device
            )
            if cuda
            else self.lr
        )
        return torch.optim.AdamW(
            self.parameters(), lr=lr, betas=self.betas, weight_decay=self.weight_decay, fused=cuda, capturable=cuda
        )
