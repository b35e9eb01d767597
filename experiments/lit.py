"""The LightningModule: cross-entropy over scored positions, AdamW with a cosine schedule and linear
warmup, torchmetrics token accuracy (micro), exact match and final-position accuracy on the
validation and test sets.

Metric names: ``val/acc``, ``val/exact``, ``val/last_acc``, and for each test set ``<name>/acc``,
``<name>/exact``, ``<name>/last_acc`` (``test``, then ``len<L>`` per extrapolation length).
``acc`` averages over every scored position, ``last_acc`` scores only the last scored position of
each sequence (where a single-label task puts its label), so one run gives both readings.

The hyperparameters are plain data (``save_hyperparameters``), so a checkpoint rebuilds its model:
``LitSequenceModel.load_from_checkpoint(path)``.
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

from experiments.model import ModelConfig, SingleLayerModel
from tasks import IGNORE_INDEX


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


def _metrics(num_classes: int, prefix: str) -> MetricCollection:
    return MetricCollection(
        {
            "acc": MulticlassAccuracy(num_classes=num_classes, average="micro", ignore_index=IGNORE_INDEX),
            "exact": MulticlassExactMatch(num_classes=num_classes, multidim_average="global", ignore_index=IGNORE_INDEX),
            "last_acc": LastPositionAccuracy(),
        },
        prefix=f"{prefix}/",
    )


def cosine_with_warmup(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, then cosine decay to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class LitSequenceModel(L.LightningModule):
    """Trains a ``SingleLayerModel``.

    Args:
        model: the model's ``ModelConfig`` as a plain dict (``dataclasses.asdict``; a ``ModelConfig`` is
            converted), so the hyperparameters saved in checkpoints are plain data.
        lr: peak learning rate; ``weight_decay``, ``betas``: AdamW (paper: 1e-6, (0.9, 0.999)).
        max_steps: the schedule's length; ``warmup_ratio``: fraction of it spent warming up.
        test_set_names: names of the test dataloaders, in order.
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
    ) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        model_config = model if isinstance(model, ModelConfig) else ModelConfig(**model)
        self.save_hyperparameters({
            "model": dataclasses.asdict(model_config), "lr": float(lr), "weight_decay": float(weight_decay),
            "betas": [float(b) for b in betas], "max_steps": int(max_steps), "warmup_ratio": float(warmup_ratio),
            "test_set_names": list(test_set_names),
        })
        self.model = SingleLayerModel(model_config)
        self.lr, self.weight_decay, self.betas = lr, weight_decay, tuple(betas)
        self.max_steps, self.warmup_ratio = max_steps, warmup_ratio
        self.test_set_names = tuple(test_set_names)
        n = model_config.num_classes
        self.val_metrics = _metrics(n, "val")
        self.test_metrics = nn.ModuleList([_metrics(n, name) for name in self.test_set_names])
        self._last_loss: torch.Tensor | None = None  # detached loss of the latest training step

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)

    def _logging_step(self) -> bool:
        """Does Lightning write step-level logs after this step? (Every ``log_every_n_steps`` steps.)"""
        if self._trainer is None:
            return True
        return (self.global_step + 1) % max(1, self.trainer.log_every_n_steps) == 0 or self.trainer.should_stop

    def _check_finite(self, loss: torch.Tensor, step: int) -> None:
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"training loss is {loss.item()} at step {step}")

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        tokens, targets = batch
        loss = self._loss(self(tokens), targets)
        self._last_loss = loss.detach()
        # Only on the steps whose logs Lightning writes: `self.log` costs ~1 ms of CPU per call and the
        # finiteness test a device synchronisation, while a small model's whole step takes 3-8 ms. A
        # non-finite loss makes AdamW's weights non-finite, so a later test still catches it.
        if self._logging_step():
            self._check_finite(loss, self.global_step)
            self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def on_train_end(self) -> None:
        if self._last_loss is not None:  # the steps after the last logging step
            self._check_finite(self._last_loss, self.global_step)

    def validation_step(self, batch, batch_idx: int) -> None:
        tokens, targets = batch
        logits = self(tokens)
        self.val_metrics.update(logits.argmax(-1), targets)
        self.log("val/loss", self._loss(logits, targets), on_epoch=True, batch_size=tokens.shape[0])

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute(), prog_bar=True)
        self.val_metrics.reset()

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        tokens, targets = batch
        self.test_metrics[dataloader_idx].update(self(tokens).argmax(-1), targets)

    def on_test_epoch_end(self) -> None:
        for metrics in self.test_metrics:
            self.log_dict(metrics.compute())
            metrics.reset()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, betas=self.betas, weight_decay=self.weight_decay)
        warmup = max(1, int(self.warmup_ratio * self.max_steps))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: cosine_with_warmup(step, warmup, self.max_steps)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
