"""Stacked trials: the seeds of one cell trained together as one model (``mixers.stacking``).

    results = run_stack([spec_seed0, spec_seed1, spec_seed2], [dir0, dir1, dir2], stack_dir)

Each trial keeps what ``run_trial`` gives it: its own initialization (built after its seed) and data
order (its seed's ``TrainingStream``), its own early stopping (validation accuracy above
``early_stop_acc``, and the plateau rule), its own ``checkpoints/best.ckpt`` in its own folder (an
ordinary checkpoint: ``LitSequenceModel.load_from_checkpoint`` rebuilds the one-trial model), its
own ``checkpoints/final.ckpt`` (the weights when it stopped), ``progress.csv`` and results row, with
test metrics of its best (``test/acc``, ...) and final (``final/test/acc``, ...) weights computed by
the one-trial model. The stack trains until every trial has stopped; a trial that stopped early
goes on training inside the stack, but its checkpoints and results are those of its stopping step.

What differs from separate trials: the stack's steps are one computation, so a Newton solve that
fails its check is re-solved, replaced by the sequential loop or (in a CUDA graph) skipped for all
trials of the stack at once (``CellMixer.stack_trials``), and a trial's weights after a step equal
its separate trial's within float rounding (``tests/experiments/test_stack.py``). The stack's own
folder holds ``checkpoints/last.ckpt`` (written at every validation and on Ctrl-C: a re-run with the
same trials resumes from it) and the step log (``logs/``, validation metrics as ``s<seed>/val/acc``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import nn

from experiments.trial.captured import CapturedSteps
from experiments.trial.lightning_hooks import interrupt_as_keyboard_interrupt
from experiments.trial.lit import LitSequenceModel, task_metrics
from experiments.trial.model import SequenceModel, count_parameters
from experiments.trial.train import (
    BEST_CHECKPOINT,
    CHECKPOINT_DIR,
    GRAPH_ENGINES,
    PROGRESS_FILE,
    RunOptions,
    TrialSpec,
    _History,
    build_datamodule,
    evaluate_test_sets,
    fit_resuming,
    fit_trainer,
    fitting,
    module_options,
    resolve_device,
    result_row,
    steps_per_chunk,
)
from mixers.stacking import stack_trials, trial_state_dict
from tasks import IGNORE_INDEX, SyntheticDataModule

FINAL_CHECKPOINT = "final.ckpt"


class StackedLitSequenceModel(LitSequenceModel):
    """The trials of ``stack_seeds`` (at least two distinct seeds) trained as one stacked model
    (``mixers.stacking``); the other arguments are ``LitSequenceModel``'s but ``grad_clip`` (it would clip
    the trials' gradients together). Each trial's model is built after ``torch.manual_seed(seed)``, as
    its own trial builds it; batches are ``(S, B, L)`` (row ``s``: trial ``s``'s); the loss is the sum of
    the trials' own mean losses, so each trial's gradients are its own; validation metrics are logged
    per trial as ``s<seed>/val/acc`` etc., ``train/loss`` is the trials' mean."""

    def __init__(self, model: dict[str, Any], stack_seeds: list[int], **kwargs: Any) -> None:
        seeds = [int(x) for x in stack_seeds]
        if len(seeds) < 2 or len(set(seeds)) != len(seeds):
            raise ValueError(f"stack_seeds must be at least two distinct seeds, got {stack_seeds!r}")
        if kwargs.get("grad_clip"):
            raise ValueError("grad_clip clips each trial's own gradient: stacked trials (stack_seeds) cannot use it")
        super().__init__(model, **kwargs)
        self.save_hyperparameters({**self.hparams, "stack_seeds": seeds})
        self.stack_seeds = seeds
        models = []
        for seed in seeds:
            torch.manual_seed(seed)
            models.append(SequenceModel(self.config))
        self.model = stack_trials(models)  # replaces the one-trial model LitSequenceModel built
        self.val_metrics = nn.ModuleList([task_metrics(self.config.num_classes, f"s{seed}/val") for seed in seeds])

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The sum over trials of each one's mean cross-entropy (``logits (S, B, L, C)``, ``targets (S, B, L)``)."""
        S = logits.shape[0]
        losses = F.cross_entropy(
            logits.flatten(0, 2).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        )
        scored = (targets != IGNORE_INDEX).reshape(S, -1).sum(1)
        return (losses.view(S, -1).sum(1) / scored).sum()

    def logged_loss(self) -> torch.Tensor:
        return self._last_loss / len(self.stack_seeds)

    def validation_step(self, batch, batch_idx: int) -> None:
        tokens, targets = batch  # every trial on the same validation set
        S = len(self.stack_seeds)
        logits = self(tokens.expand(S, *tokens.shape))
        preds = logits.argmax(-1)
        for s, metrics in enumerate(self.val_metrics):
            metrics.update(preds[s], targets)
        loss = self.loss(logits, targets.expand(S, *targets.shape)) / S
        self.log("val/loss", loss, on_epoch=True, batch_size=tokens.shape[0])

    def on_validation_epoch_end(self) -> None:
        for metrics in self.val_metrics:
            self.log_dict(metrics.compute())
            metrics.reset()


class CapturedStackedLitSequenceModel(CapturedSteps, StackedLitSequenceModel):
    """Stacked trials trained with captured steps (the graph engines, ``experiments.trial.captured``)."""


def build_stacked_module(
    spec: TrialSpec, dm: SyntheticDataModule, stack_seeds: list[int], engine: str = "eager"
) -> StackedLitSequenceModel:
    """The LightningModule of ``spec``'s trials of ``stack_seeds`` stacked, for ``engine``."""
    if engine in GRAPH_ENGINES:
        return CapturedStackedLitSequenceModel(
            **module_options(spec, dm), stack_seeds=stack_seeds, compiled=engine == "compiled"
        )
    return StackedLitSequenceModel(**module_options(spec, dm), stack_seeds=stack_seeds)


def check_stackable(specs: list[TrialSpec]) -> None:
    """One-line ``ValueError`` unless ``specs`` differ in their seeds only (at least two, distinct)."""
    if len(specs) < 2:
        raise ValueError(f"a stack needs at least two trials, got {len(specs)}")
    seeds = [s.seed for s in specs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"stacked trials need distinct seeds, got {seeds}")
    base = dataclasses.replace(specs[0], seed=0)
    for spec in specs[1:]:
        if dataclasses.replace(spec, seed=0) != base:
            raise ValueError(
                f"stacked trials must differ in their seed only: {specs[0].cell_key()} vs {spec.cell_key()}"
            )


def stack_key(spec: TrialSpec) -> str:
    """What trials must share to be stacked: everything but the seed."""
    return json.dumps(dataclasses.replace(spec, seed=0).to_dict(), sort_keys=True, default=str)


class StackedTrials(Callback):
    """Each trial's best checkpoint, early stopping and final checkpoint inside a stack (module docstring).

    After every validation, for each trial still training: a higher ``s<seed>/val/acc`` than its best
    writes its ``best.ckpt``; it stops when the accuracy exceeds ``early_stop_acc`` or (with
    ``plateau_steps``) when it has not exceeded its best by ``plateau_delta`` for that many steps (as
    Lightning's ``EarlyStopping``: strict comparisons, the plateau reference moving only on gains
    above the delta); a stopping trial writes its ``final.ckpt``. ``report(s, acc, step)`` is called
    with each validation of a trial still training (its stopping one included). Training ends when all stopped (or at
    ``max_steps``, where the rest write theirs). The state survives a resume (``state_dict``)."""

    def __init__(
        self, specs: list[TrialSpec], dirs: list[Path], report: Callable[[int, float, int], None] | None = None
    ) -> None:
        self.specs, self.dirs, self.report = specs, dirs, report
        S = len(specs)
        self.best: list[float | None] = [None] * S
        self.best_step = [0] * S
        self.plateau_best: list[float | None] = [None] * S
        self.plateau_step = [0] * S
        self.stopped_at: list[int | None] = [None] * S
        self.last_val_acc: list[float | None] = [None] * S

    def state_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("best", "best_step", "plateau_best", "plateau_step", "stopped_at", "last_val_acc")
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, list(v))

    def write_checkpoint(self, pl_module: LitSequenceModel, s: int, name: str, step: int) -> None:
        """Trial ``s``'s weights as an ordinary one-trial checkpoint ``<trial dir>/checkpoints/<name>``."""
        hparams = {k: v for k, v in pl_module.hparams.items() if k != "stack_seeds"}
        state = {f"model.{k}": v.cpu() for k, v in trial_state_dict(pl_module.model, s).items()}
        path = self.dirs[s] / CHECKPOINT_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "state_dict": state,
                "hyper_parameters": hparams,
                "global_step": step,
                "pytorch-lightning_version": L.__version__,
            },
            path.with_suffix(".tmp"),
        )
        path.with_suffix(".tmp").replace(path)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        step = trainer.global_step
        for s, spec in enumerate(self.specs):
            key = f"s{spec.seed}/val/acc"
            if self.stopped_at[s] is not None or key not in trainer.callback_metrics:
                continue
            t = spec.train
            acc = float(trainer.callback_metrics[key])
            self.last_val_acc[s] = acc
            if self.report is not None:
                self.report(s, acc, step)
            if self.best[s] is None or acc > self.best[s]:
                self.best[s], self.best_step[s] = acc, step
                self.write_checkpoint(pl_module, s, BEST_CHECKPOINT, step)
            if self.plateau_best[s] is None or acc - t.plateau_delta > self.plateau_best[s]:
                self.plateau_best[s], self.plateau_step[s] = acc, step
            plateau = t.plateau_steps is not None and step - self.plateau_step[s] >= t.plateau_steps
            if acc > t.early_stop_acc or plateau:
                self.stopped_at[s] = step
                self.write_checkpoint(pl_module, s, FINAL_CHECKPOINT, step)
        if self.all_stopped:
            trainer.should_stop = True

    def on_train_start(self, trainer, pl_module) -> None:
        if self.all_stopped:  # resumed after every trial had stopped: test only
            trainer.should_stop = True

    @property
    def all_stopped(self) -> bool:
        return all(x is not None for x in self.stopped_at)

    def on_train_end(self, trainer, pl_module) -> None:
        for s in range(len(self.specs)):
            if self.stopped_at[s] is None:
                self.stopped_at[s] = trainer.global_step
                self.write_checkpoint(pl_module, s, FINAL_CHECKPOINT, trainer.global_step)


def run_stack(
    specs: list[TrialSpec],
    trial_dirs: list[str | Path],
    stack_dir: str | Path,
    options: RunOptions | None = None,
    callbacks: list[Callback] | None = None,
    progress_bar: bool = False,
    report: Callable[[int, float, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Train ``specs`` (differing in their seed only) as one stacked model; one results dict per trial,
    in order, with ``run_trial``'s keys plus ``stack_size`` (module docstring). Each trial's files go
    to its ``trial_dirs`` entry, the stack's resume checkpoint and step log to ``stack_dir``.
    ``report(trial index, val/acc, step)``: each validation of a trial while it trains (Optuna's
    learning curves). Raises ``NonFiniteLossError`` when the loss of the stack becomes NaN/Inf."""
    options = options or RunOptions()
    check_stackable(specs)
    if len(trial_dirs) != len(specs):
        raise ValueError(f"{len(specs)} trials but {len(trial_dirs)} trial folders")
    entered = time.perf_counter()
    spec, seeds = specs[0], [s.seed for s in specs]
    dirs, out = [Path(d) for d in trial_dirs], Path(stack_dir)
    accelerator, devices = resolve_device(spec.device)
    if accelerator == "cpu" and spec.train.cpu_threads > 0:
        torch.set_num_threads(spec.train.cpu_threads)
    engine = options.resolved_engine(accelerator)
    for d, s in zip(dirs, specs):
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.json").write_text(json.dumps(s.to_dict(), indent=1))
    out.mkdir(parents=True, exist_ok=True)
    t = spec.train
    chunk = steps_per_chunk(engine, t)
    device = f"cuda:{devices[0]}" if accelerator == "gpu" else "cpu"
    dm = build_datamodule(spec, device, chunk, stack_seeds=seeds)
    dm.setup()
    module = build_stacked_module(spec, dm, seeds, engine)
    history, trials = _History(), StackedTrials(specs, dirs, report)
    trainer = fit_trainer(
        t,
        out,
        accelerator,
        devices,
        engine,
        chunk,
        options.logger,
        progress_bar,
        [history, trials, *(callbacks or [])],
        precision=spec.model.precision,
    )
    tester = L.Trainer(
        accelerator=accelerator,
        devices=devices,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    results = []
    with fitting(trainer, history, [d / PROGRESS_FILE for d in dirs]), interrupt_as_keyboard_interrupt(tester):
        resumed_from = fit_resuming(trainer, module, dm, out)
        train_time = time.perf_counter() - start
        for s, d in enumerate(dirs):  # the test sets are every trial's: the stack's data module serves them
            final_module = LitSequenceModel.load_from_checkpoint(
                d / CHECKPOINT_DIR / FINAL_CHECKPOINT, map_location=device
            )
            best_module = LitSequenceModel.load_from_checkpoint(
                d / CHECKPOINT_DIR / BEST_CHECKPOINT, map_location=device
            )
            results.append(
                {
                    **result_row(
                        n_params=count_parameters(final_module.model),
                        steps=trials.stopped_at[s],
                        best_step=trials.best_step[s],
                        resumed_from=resumed_from,
                        module=module,
                        trainer=trainer,
                        entered=entered,
                        start=start,
                        train_time=train_time,
                        history=history,
                        best_val_acc=trials.best[s] if trials.best[s] is not None else float("nan"),
                        final_val_acc=trials.last_val_acc[s] if trials.last_val_acc[s] is not None else float("nan"),
                        best=evaluate_test_sets(tester, best_module, dm),
                        final=evaluate_test_sets(tester, final_module, dm),
                        test_set_names=dm.test_set_names,
                        engine=engine,
                        scaled=dm.task.scaled_accuracy,
                    ),
                    "stack_size": len(specs),
                }
            )
    return results
