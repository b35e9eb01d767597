"""One training run ("trial"): data + model + Lightning Trainer -> a flat dict of results.

    spec = TrialSpec(task="parity", mixer="gru", lr=1e-3, seed=0, train=TrainConfig(max_steps=500))
    result = run_trial(spec, out_dir="runs/demo")   # {'test/acc': ..., 'n_params': ..., ...}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping
from lightning.pytorch.loggers import CSVLogger

from experiments.lit import LitSequenceModel
from experiments.model import ModelConfig, count_parameters
from tasks import ExtrapolationConfig, SyntheticDataModule, get_task


@dataclasses.dataclass
class TrainConfig:
    """Optimization and data sizes (defaults: paper 000 App. C.2 except the step budget)."""

    max_steps: int = 10_000
    batch_size: int = 16
    train_size: int = 10_000
    val_size: int = 2_000
    test_size: int = 100_000
    eval_batch_size: int = 1024
    #: training steps between validations (early stopping is checked there)
    eval_every: int = 250
    warmup_ratio: float = 0.1
    weight_decay: float = 1e-6
    #: stop once validation accuracy exceeds this (EarlyStopping's threshold is strict)
    early_stop_acc: float = 0.999
    #: the data seed (the trial's ``seed`` sets initialization and shuffling)
    data_seed: int = 0
    #: torch intra-op threads on the CPU: the models are tiny, so one thread per trial is fastest
    #: (run several trials in parallel instead); 0 leaves torch's default
    cpu_threads: int = 1


@dataclasses.dataclass
class TrialSpec:
    """Everything one trial needs; ``cell_key()`` identifies the grid cell."""

    task: str
    mixer: str
    lr: float
    seed: int
    task_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    mixer_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    block: str = "mixer"
    positional: str = "none"
    extrapolation: dict[str, Any] | None = None
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    device: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialSpec:
        d = dict(d)
        d["train"] = TrainConfig(**d.get("train", {}))
        return cls(**d)

    def cell_key(self) -> str:
        """A stable id of (task, mixer, seed, lr) — what the sweep resumes on."""
        return f"{self.task}|{self.mixer}|seed={self.seed}|lr={self.lr:g}"


class _History(Callback):
    """Records validation accuracy after each validation."""

    def __init__(self) -> None:
        self.val_acc: list[float] = []

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and "val/acc" in trainer.callback_metrics:
            self.val_acc.append(float(trainer.callback_metrics["val/acc"]))


def resolve_device(device: str) -> tuple[str, list[int] | str]:
    """``"auto" | "cpu" | "cuda" | "cuda:N"`` -> Lightning ``(accelerator, devices)``."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu", 1
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        index = int(device.split(":")[1]) if ":" in device else 0
        return "gpu", [index]
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def build_datamodule(spec: TrialSpec, device: str | torch.device = "cpu") -> SyntheticDataModule:
    """The trial's data sets, kept on ``device`` (the training device)."""
    t = spec.train
    extrap = ExtrapolationConfig(**spec.extrapolation) if spec.extrapolation else None
    return SyntheticDataModule(
        get_task(spec.task, **spec.task_options),
        train_size=t.train_size, val_size=t.val_size, test_size=t.test_size,
        batch_size=t.batch_size, eval_batch_size=t.eval_batch_size, seed=t.data_seed, extrapolation=extrap,
        device=device,
    )


def build_module(spec: TrialSpec, dm: SyntheticDataModule) -> LitSequenceModel:
    config = ModelConfig(
        vocab_size=dm.vocab_size, num_classes=dm.num_classes, mixer=spec.mixer,
        mixer_options=dict(spec.mixer_options), block=spec.block, positional=spec.positional,
    )
    t = spec.train
    return LitSequenceModel(
        config, lr=spec.lr, weight_decay=t.weight_decay, max_steps=t.max_steps, warmup_ratio=t.warmup_ratio,
        test_set_names=tuple(dm.test_set_names),
    )


def newton_summary(model: torch.nn.Module) -> dict[str, Any]:
    """Newton statistics of mixers that record them (``last_newton_stats`` of the last forward, and the
    ``fallback_count`` / ``retry_count`` / ``newton_forwards`` counters over the whole trial, evaluation included), else ``{}``."""
    out: dict[str, Any] = {}
    for name, module in model.named_modules():
        stats = getattr(module, "last_newton_stats", None)
        if stats is None:
            continue
        as_dict = stats if isinstance(stats, dict) else getattr(stats, "__dict__", {"value": stats})
        for k, v in as_dict.items():
            if isinstance(v, torch.Tensor):
                v = v.tolist()
            if isinstance(v, (int, float, str, bool, list)):
                out[f"newton/{k}"] = v
        for counter in ("fallback_count", "retry_count", "newton_forwards"):
            if isinstance(getattr(module, counter, None), int):
                out[f"newton/{counter}"] = getattr(module, counter)
        break
    return out


def run_trial(spec: TrialSpec, out_dir: str | Path | None = None, progress_bar: bool = False) -> dict[str, Any]:
    """Train and evaluate one trial; returns a flat dict of results.

    Raises ``NonFiniteLossError`` when the loss becomes NaN/Inf. With ``out_dir``, writes the
    per-step CSV log (``metrics.csv``), ``spec.json`` and the final weights ``model.pt`` there.
    """
    accelerator, devices = resolve_device(spec.device)
    if accelerator == "cpu" and spec.train.cpu_threads > 0:
        torch.set_num_threads(spec.train.cpu_threads)
    out = Path(out_dir) if out_dir is not None else None
    dm = build_datamodule(spec, f"cuda:{devices[0]}" if accelerator == "gpu" else "cpu")
    dm.setup()
    L.seed_everything(spec.seed, workers=True, verbose=False)
    module = build_module(spec, dm)
    t = spec.train
    history = _History()
    callbacks = [
        history,
        EarlyStopping(monitor="val/acc", mode="max", stopping_threshold=t.early_stop_acc,
                      patience=10**9, check_on_train_epoch_end=False),
    ]
    logger = CSVLogger(str(out), name="", version="") if out is not None else False
    trainer = L.Trainer(
        accelerator=accelerator, devices=devices, max_steps=t.max_steps,
        # never the working directory: a worker must survive its cwd being deleted under it
        default_root_dir=str(out) if out is not None else tempfile.gettempdir(),
        val_check_interval=t.eval_every, check_val_every_n_epoch=None, num_sanity_val_steps=0,
        callbacks=callbacks, logger=logger, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=progress_bar, log_every_n_steps=max(1, t.eval_every // 5),
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*is smaller than the logging interval.*")
        trainer.fit(module, datamodule=dm)
        train_time = time.perf_counter() - start
        tested = trainer.test(module, datamodule=dm, verbose=False)
    metrics: dict[str, Any] = {}
    for part in tested:
        for key, value in part.items():
            metrics[key.split("/dataloader_idx")[0]] = float(value)
    extrap_accs = [metrics[f"{name}/acc"] for name in dm.test_set_names[1:] if f"{name}/acc" in metrics]
    device_name = torch.cuda.get_device_name(devices[0]) if accelerator == "gpu" else "cpu"
    result: dict[str, Any] = {
        "n_params": count_parameters(module.model),
        "steps": trainer.global_step,
        "train_time_s": round(train_time, 3),
        "wall_time_s": round(time.perf_counter() - start, 3),
        "steps_per_s": round(trainer.global_step / max(train_time, 1e-9), 3),
        "best_val_acc": max(history.val_acc) if history.val_acc else float("nan"),
        "final_val_acc": history.val_acc[-1] if history.val_acc else float("nan"),
        "stopped_early": trainer.global_step < t.max_steps,
        "device": device_name,
        **metrics,
        **newton_summary(module.model),
    }
    if extrap_accs:
        result["extrap/mean_acc"] = sum(extrap_accs) / len(extrap_accs)
    if out is not None:
        (out / "spec.json").write_text(json.dumps(spec.to_dict(), indent=1))
        torch.save(module.model.state_dict(), out / "model.pt")
    return result


def quiet_lightning() -> None:
    """Silence Lightning's per-run banners (GPU available, LOCAL_RANK, ...)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
