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

Training is Lightning's automatic optimisation: one optimizer step per training step, AdamW under a
warm-up + cosine ``LambdaLR``. The graph engines run chunks of steps as CUDA-graph replays in a subclass
(``experiments.trial.captured``); stacked trials are another (``experiments.trial.stack``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassExactMatch

from experiments.trial.model import ModelConfig, SequenceModel
from tasks import IGNORE_INDEX
from tasks.datamodule import Chunk


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


def task_metrics(num_classes: int, prefix: str, top_pred: bool = False) -> MetricCollection:
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


class LitSequenceModel(L.LightningModule):
    """Trains a ``SequenceModel`` with eager optimizer steps (see the module docstring).

    Args:
        model: the model's ``ModelConfig`` as a plain dict (``dataclasses.asdict``; a ``ModelConfig`` is
            converted), so the hyperparameters saved in checkpoints are plain data.
        lr: peak learning rate; ``weight_decay``, ``betas``: AdamW (paper: 1e-6, (0.9, 0.999)).
        max_steps: the schedule's length; ``warmup_ratio``: fraction of it spent warming up.
        test_set_names: names of the test dataloaders, in order.
        min_lr: the learning rate the cosine decays to; ``grad_clip``: the largest global gradient norm
            (``None``: no clipping).
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
        min_lr: float = 0.0,
        grad_clip: float | None = None,
    ) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.config = model if isinstance(model, ModelConfig) else ModelConfig(**model)
        self.save_hyperparameters(
            {
                "model": dataclasses.asdict(self.config),
                "lr": float(lr),
                "weight_decay": float(weight_decay),
                "betas": [float(b) for b in betas],
                "max_steps": int(max_steps),
                "warmup_ratio": float(warmup_ratio),
                "test_set_names": list(test_set_names),
                **({"min_lr": float(min_lr)} if min_lr else {}),
                **({"grad_clip": float(grad_clip)} if grad_clip else {}),
            }
        )
        self.model = SequenceModel(self.config)
        self.lr, self.weight_decay, self.betas = lr, weight_decay, tuple(betas)
        self.max_steps, self.warmup_steps = max_steps, warmup_steps(warmup_ratio, max_steps)
        self.min_ratio, self.grad_clip = min(1.0, min_lr / lr), grad_clip  # min_ratio: min_lr as a share of lr
        self.test_set_names = tuple(test_set_names)
        self.val_metrics = task_metrics(self.config.num_classes, "val")
        self.test_metrics = nn.ModuleList(
            [task_metrics(self.config.num_classes, name, top_pred=True) for name in self.test_set_names]
        )
        # the last and the largest training loss, kept on the device (a host read per step would stall a
        # GPU): the largest is NaN or inf once any loss was (torch.maximum propagates NaN)
        self.register_buffer("_last_loss", torch.zeros(()), persistent=False)
        self.register_buffer("_max_loss", torch.zeros(()), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the scored positions of ``logits (B, L, C)``, ``targets (B, L)``."""
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)

    def lr_factor(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) as a share of ``lr``."""
        return cosine_with_warmup(step, self.warmup_steps, self.max_steps, self.min_ratio)

    def training_step(self, chunk: Chunk, batch_idx: int) -> torch.Tensor:
        """One optimizer step on the training stream's batch of this step (``chunk``: one batch of a
        ``tasks.datamodule.TrainingStream``, so a resumed run goes on with the batch of its step)."""
        tokens, targets = chunk.stream.batch(self.global_step)
        loss = self.loss(self(tokens), targets)
        self.keep_loss(loss)
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        if self.grad_clip:
            self.clip_gradients(optimizer, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")

    def configure_optimizers(self):
        """AdamW (fused on a GPU) under a warm-up + cosine ``LambdaLR`` (``cosine_with_warmup``) stepped after
        every optimizer step."""
        optimizer = torch.optim.AdamW(
            self.parameters(),
            lr=self.lr,
            betas=self.betas,
            weight_decay=self.weight_decay,
            fused=self.device.type == "cuda",
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.lr_factor(step))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    @torch.no_grad()
    def keep_loss(self, loss: torch.Tensor) -> None:
        """Keep a training step's loss on the device: the last (logged) and the largest (checked for NaN/inf)."""
        torch.maximum(self._max_loss, loss.detach(), out=self._max_loss)
        self._last_loss.copy_(loss.detach())

    def logged_loss(self) -> torch.Tensor:
        """What ``train/loss`` logs: the last training loss."""
        return self._last_loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """Every ``log_every_n_steps`` Lightning steps, log ``train/loss`` (``self.log`` costs about a
        millisecond of host time: too much for every step of a small model); on the CPU check the loss
        for NaN/inf (on a GPU at validations: no host read per step)."""
        if not self._max_loss.is_cuda:
            self._raise_if_nonfinite()
        if (batch_idx + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            self.log("train/loss", self.logged_loss(), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)

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

    def validation_step(self, batch, batch_idx: int) -> None:
        tokens, targets = batch
        logits = self(tokens)
        self.val_metrics.update(logits.argmax(-1), targets)
        self.log("val/loss", self.loss(logits, targets), on_epoch=True, batch_size=tokens.shape[0])

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute(), prog_bar=True)
        self.val_metrics.reset()

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

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A resume point without a scheduler's state (written by the graph engines' steps,
        ``experiments.trial.captured``, which keep the schedule on the device) resumes on this schedule at
        its step."""
        if checkpoint.get("optimizer_states") and not checkpoint.get("lr_schedulers"):
            step = int(checkpoint["global_step"])
            checkpoint["lr_schedulers"] = [{"last_epoch": step, "_step_count": step + 1, "lr_lambdas": [None]}]
            for group in checkpoint["optimizer_states"][0]["param_groups"]:
                group["lr"] = self.lr * self.lr_factor(step)
