"""One training run ("trial"): data + model + Lightning Trainer -> a flat dict of results.

    spec = TrialSpec(task="parity", mixer="gru", lr=1e-3, seed=0, train=TrainConfig(max_steps=500))
    result = run_trial(spec, out_dir="runs/demo")   # {'test/acc': ..., 'n_params': ..., ...}

Two seeds: ``TrialSpec.seed`` (the trial's seed) sets the initialization and the order in which the
training set is served; ``TrainConfig.data_seed`` fixes the data sets themselves (as the paper fixes
one training set). Trained models: ``LitSequenceModel.load_from_checkpoint(<trial dir>/checkpoints/best.ckpt)``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from experiments.engines.cuda_graph import CUDAGraphPrecision
from experiments.trial.captured import CapturedLitSequenceModel, CapturedSteps
from experiments.trial.lightning_hooks import (
    InterruptCheckpoint,
    TrialCheckpoint,
    TrialEarlyStopping,
    interrupt_as_keyboard_interrupt,
)
from experiments.trial.lit import LitSequenceModel
from experiments.trial.model import ModelConfig, count_parameters
from experiments.trial.running import PROGRESS_FILE, append_sample
from experiments.trial.shape import PRECISIONS, ModelShape
from mixers.protocol import declared
from tasks import ExtrapolationConfig, SyntheticDataModule, get_task

log = logging.getLogger(__name__)


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
    #: the cosine schedule's final learning rate (absolute; Grazzi et al. 2025 decay to 1e-6)
    min_lr: float = 0.0
    #: clip the gradient's global norm to this before each update (``None``: never)
    grad_clip: float | None = None
    #: stop once validation accuracy exceeds this (EarlyStopping's threshold is strict)
    early_stop_acc: float = 0.999
    #: also stop when the best validation accuracy has not grown by ``plateau_delta`` for this many
    #: steps (``None``: never; a departure from budgets stated in epochs, for cells stuck at chance)
    plateau_steps: int | None = None
    plateau_delta: float = 0.001
    #: the data seed: fixes the data sets (the trial's ``seed`` sets initialization and the training order)
    data_seed: int = 0
    #: torch intra-op threads on the CPU: the models are tiny, so one thread per trial is fastest
    #: (run several trials in parallel instead); 0 leaves torch's default
    cpu_threads: int = 1
    #: 0: training batches padded to the longest training length; k >= 1: batches of near-equal lengths
    #: (pools of k batches sorted by length), each cut to its longest sequence: the same sequences per epoch,
    #: less padding (``tasks.datamodule.TrainingStream``); eager steps only
    length_bucketing: int = 0

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "train_size", "val_size", "test_size", "eval_batch_size", "eval_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"train option {name} must be a positive integer, got {value!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"train option warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"train option weight_decay must be >= 0, got {self.weight_decay!r}")
        if not self.min_lr >= 0:
            raise ValueError(f"train option min_lr must be >= 0, got {self.min_lr!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"train option grad_clip must be None or > 0, got {self.grad_clip!r}")
        if isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int) or self.data_seed < 0:
            raise ValueError(f"train option data_seed must be an integer >= 0, got {self.data_seed!r}")
        if self.plateau_steps is not None and (
            not isinstance(self.plateau_steps, int) or self.plateau_steps < self.eval_every
        ):
            raise ValueError(
                f"train option plateau_steps must be None or an integer >= eval_every ({self.eval_every}), "
                f"got {self.plateau_steps!r}"
            )
        if isinstance(self.cpu_threads, bool) or not isinstance(self.cpu_threads, int) or self.cpu_threads < 0:
            raise ValueError(f"train option cpu_threads must be an integer >= 0, got {self.cpu_threads!r}")
        if (
            isinstance(self.length_bucketing, bool)
            or not isinstance(self.length_bucketing, int)
            or self.length_bucketing < 0
        ):
            raise ValueError(
                f"train option length_bucketing must be an integer >= 0 (0: off), got {self.length_bucketing!r}"
            )


@dataclasses.dataclass
class TrialSpec:
    """Everything one trial needs; ``cell_key()`` identifies the grid cell, ``model`` its model's shape.

    ``to_dict()`` is flat (the ``ModelShape`` fields beside the others): the form of ``spec.json`` and of
    the study's trials, read back by ``from_dict``."""

    task: str
    model: ModelShape
    lr: float
    seed: int
    task_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    extrapolation: dict[str, Any] | None = None
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    device: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelShape):
            raise ValueError(f"model must be a ModelShape, got {self.model!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("model", "train")}
        return {**copy.deepcopy(d), **copy.deepcopy(self.model.to_dict()), "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialSpec:
        own = {f.name for f in dataclasses.fields(cls)} - {"model", "train"}
        unknown = set(d) - own - set(ModelShape.field_names()) - {"train"}
        if unknown:
            raise ValueError(f"a trial spec has no field(s) {', '.join(sorted(unknown))}")
        return cls(
            model=ModelShape.from_dict(d),
            train=TrainConfig(**d.get("train", {})),
            **{k: v for k, v in d.items() if k in own},
        )

    def cell_key(self) -> str:
        """A stable id of (task, mixer, [layers, precision,] seed, lr) — what the sweep resumes on (layers
        and precision appear when they are not the defaults, so earlier studies keep their keys)."""
        m, defaults = self.model, ModelShape.defaults()
        extra = (f"|layers={m.layers}" if m.layers != defaults["layers"] else "") + (
            f"|{m.precision}" if m.precision != defaults["precision"] else ""
        )
        return f"{self.task}|{m.mixer}{extra}|seed={self.seed}|lr={self.lr:g}"

    def identity(self) -> dict[str, Any]:
        """``to_dict()`` without the fields at their defaults that earlier versions did not have (what the
        cell's hash covers, so a study written before them resumes): the model's (``ModelShape.identity``)
        and the training options ``min_lr``, ``grad_clip`` and ``length_bucketing``."""
        d = self.to_dict()
        for name in set(ModelShape.field_names()) - set(self.model.identity()):
            del d[name]
        for name, default in (("min_lr", 0.0), ("grad_clip", None), ("length_bucketing", 0)):
            if d["train"][name] == default:
                del d["train"][name]
        return d


#: seconds between two samples of a trial's training progress (``progress.csv``)
PROGRESS_EVERY_S = 1.0


class _History(Callback):
    """Records validation accuracy after each validation (the last one survives a resume) and, from the
    end of the first Lightning step after 10 steps (what comes after compilation and CUDA-graph
    capture) on, ``progress``:
    ``(perf_counter s, optimizer step)`` samples at least ``PROGRESS_EVERY_S`` apart (after a device
    synchronization, so a step counts once the GPU has run it), the last at the end of training.
    Several trials' samples give the steps they ran in one shared time window
    (``benchmarks.training.throughput.concurrent_rate``). Each sample is appended to ``progress_files`` as it is
    taken (``unix_time_s,step,val_acc,phase``: ``experiments.trial.running``), so a running trial's progress
    can be read while it trains."""

    def __init__(self) -> None:
        self.val_acc: list[float] = []
        self.progress: list[tuple[float, int]] = []
        self.progress_files: list[Path] = []
        self._unix_offset = time.time() - time.perf_counter()

    def _sample(self, pl_module, step: int, phase: str = "train") -> None:
        torch.cuda.synchronize() if pl_module.device.type == "cuda" else None
        self.progress.append((time.perf_counter(), step))
        val = self.val_acc[-1] if self.val_acc else None
        for path in self.progress_files:
            append_sample(path, self.progress[-1][0] + self._unix_offset, step, val, phase)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and "val/acc" in trainer.callback_metrics:
            self.val_acc.append(float(trainer.callback_metrics["val/acc"]))

    def state_dict(self) -> dict[str, Any]:  # the last validation survives a resume (a re-run that only tests)
        return {"val_acc": self.val_acc[-1:]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.val_acc = list(state_dict.get("val_acc", []))

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if (not self.progress and trainer.global_step >= 10) or (
            self.progress and time.perf_counter() - self.progress[-1][0] >= PROGRESS_EVERY_S
        ):
            self._sample(pl_module, trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        self._sample(pl_module, trainer.global_step, "end")

    def steady_rate(self) -> float:
        """Training steps/s from the first progress sample to the end of training (validations
        included, first-call compilation and graph capture excluded); NaN if too short."""
        if len(self.progress) < 2 or self.progress[-1][1] <= self.progress[0][1]:
            return float("nan")
        (t0, s0), (t1, s1) = self.progress[0], self.progress[-1]
        return (s1 - s0) / max(t1 - t0, 1e-9)


def resolve_device(device: str) -> tuple[str, list[int] | str]:
    """``"auto" | "cpu" | "cuda" | "cuda:N"`` -> Lightning ``(accelerator, devices)``."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu", 1
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available on this machine; use --device cpu")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return "gpu", [index]
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def build_datamodule(
    spec: TrialSpec,
    device: str | torch.device = "cpu",
    chunk: int = 1,
    stack_seeds: list[int] | None = None,
    width_multiple: int = 1,
) -> SyntheticDataModule:
    """The trial's data sets, kept on ``device`` (the training device); training batches in chunks of
    ``chunk``; with ``stack_seeds``, the training batches of those seeds' trials stacked (``(S, B, L)``);
    with length bucketing, batch widths rounded up to a multiple of ``width_multiple``."""
    t = spec.train
    extrap = ExtrapolationConfig(**spec.extrapolation) if spec.extrapolation else None
    return SyntheticDataModule(
        get_task(spec.task, **spec.task_options),
        train_size=t.train_size,
        val_size=t.val_size,
        test_size=t.test_size,
        batch_size=t.batch_size,
        eval_batch_size=t.eval_batch_size,
        seed=t.data_seed,
        shuffle_seed=spec.seed,
        stack_shuffle_seeds=stack_seeds,
        train_chunk=chunk,
        extrapolation=extrap,
        device=device,
        length_bucketing=t.length_bucketing,
        width_multiple=width_multiple,
    )


def module_options(spec: TrialSpec, dm: SyntheticDataModule) -> dict[str, Any]:
    """``LitSequenceModel``'s arguments for the trial ``spec`` on ``dm``'s task."""
    t = spec.train
    return {
        "model": dataclasses.asdict(ModelConfig.of(spec.model, dm.vocab_size, dm.num_classes)),
        "lr": spec.lr,
        "weight_decay": t.weight_decay,
        "max_steps": t.max_steps,
        "warmup_ratio": t.warmup_ratio,
        "test_set_names": tuple(dm.test_set_names),
        "min_lr": t.min_lr,
        "grad_clip": t.grad_clip,
    }


def build_module(spec: TrialSpec, dm: SyntheticDataModule, engine: str = "eager") -> LitSequenceModel:
    """The trial's LightningModule for ``engine``: ``LitSequenceModel`` (eager steps), or
    ``CapturedLitSequenceModel`` for a graph engine (``experiments.trial.captured``)."""
    if engine in GRAPH_ENGINES:
        static = bool(spec.train.length_bucketing)  # batches of a few widths: a compiled graph each
        return CapturedLitSequenceModel(**module_options(spec, dm), compiled=engine == "compiled", static_shapes=static)
    return LitSequenceModel(**module_options(spec, dm))


def newton_summary(model: torch.nn.Module) -> dict[str, Any]:
    """Newton statistics of mixers that record them (``last_newton_stats`` of the last forward, the
    ``fallback_count`` / ``retry_count`` / ``newton_forwards`` / ``jacobian_checks`` counters over the whole
    trial, evaluation and CUDA-graph replays included; ``graph_forwards``, ``graph_resolved`` and
    ``skipped_steps`` of the replays (``skipped_steps``: updates skipped because the solve failed its
    check); ``jacobian_fallback``: the run-time Jacobian check's message when it found the declared
    structure wrong), else ``{}``."""
    out: dict[str, Any] = {}
    for module in model.modules():
        stats = getattr(module, "last_newton_stats", None)
        if stats is None:
            continue
        as_dict = stats if isinstance(stats, dict) else getattr(stats, "__dict__", {"value": stats})
        for k, v in as_dict.items():
            if isinstance(v, torch.Tensor):
                v = v.tolist()
            if isinstance(v, (int, float, str, bool, list)):
                out[f"newton/{k}"] = v
        for counter in ("fallback_count", "retry_count", "newton_forwards", "jacobian_checks"):
            if isinstance(getattr(module, counter, None), int):
                out[f"newton/{counter}"] = getattr(module, counter)
        graph = getattr(module, "graph_counts", None)
        if isinstance(graph, torch.Tensor) and graph.numel() == 3 and int(graph[0]):  # forwards in CUDA-graph replays
            forwards, resolved, unchecked = (int(v) for v in graph.tolist())
            out["newton/graph_forwards"], out["newton/graph_resolved"], out["newton/skipped_steps"] = (
                forwards,
                resolved,
                unchecked,
            )
            out["newton/newton_forwards"] = out.get("newton/newton_forwards", 0) + forwards
            out["newton/retry_count"] = out.get("newton/retry_count", 0) + resolved
        if getattr(module, "jacobian_fallback", None):
            out["newton/jacobian_fallback"] = module.jacobian_fallback
        break
    return out


#: loggers ``run_trial`` can write the step log with (``tensorboard`` needs the ``tensorboard`` extra)
LOGGERS = ("csv", "tensorboard", "none")
#: how optimizer steps run: ``eager`` (launched op by op), ``graph`` (replays of a CUDA graph,
#: ``experiments.engines.cuda_graph``), ``compiled`` (graph replays of the ``torch.compile``d model),
#: ``auto`` (``RunOptions.gpu_engine`` on CUDA, ``eager`` on the CPU)
ENGINES = ("auto", "eager", "graph", "compiled")
#: engines whose optimizer steps replay a CUDA graph (``compiled``: of the ``torch.compile``d model)
GRAPH_ENGINES = ("graph", "compiled")
#: the graph engine runs up to this many optimizer steps per Lightning training step
MAX_CHUNK = 50
#: with length bucketing, the graph engine rounds batch widths up to a multiple of this: one CUDA graph per
#: width, at most ``longest training length / GRAPH_WIDTH_MULTIPLE`` of them
GRAPH_WIDTH_MULTIPLE = 16


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How trials run, not what they compute (not part of a cell): the step log, the step engine, and
    how many trials of a cell's seeds a worker trains together as one stacked model (``stack``;
    ``experiments.trial.stack``: each trial's results as when it runs alone, within float rounding).
    ``gpu_engine``: what ``engine="auto"`` means on CUDA (``graph``, or ``compiled`` where a reproduction
    preset's ``budget: {engine: compiled}`` says its steps run faster compiled)."""

    logger: str = "csv"
    engine: str = "auto"
    stack: int = 1
    gpu_engine: str = "graph"

    def __post_init__(self) -> None:
        check_logger(self.logger)
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if isinstance(self.stack, bool) or not isinstance(self.stack, int) or self.stack < 1:
            raise ValueError(f"stack must be a positive integer (trials per stacked model), got {self.stack!r}")
        if self.gpu_engine not in GRAPH_ENGINES:
            raise ValueError(f"gpu_engine must be one of {', '.join(GRAPH_ENGINES)}, got {self.gpu_engine!r}")

    def resolved_engine(self, accelerator: str) -> str:
        """``eager``, ``graph`` or ``compiled`` for a trial on ``accelerator`` (the graph engines need CUDA)."""
        if self.engine in GRAPH_ENGINES and accelerator != "gpu":
            raise ValueError(f"engine {self.engine!r} (CUDA graphs) needs a CUDA device")
        return (self.gpu_engine if accelerator == "gpu" else "eager") if self.engine == "auto" else self.engine


def steps_per_chunk(engine: str, train: TrainConfig) -> int:
    """Optimizer steps per Lightning training step: 1 eagerly; with graphs the largest divisor of both
    ``eval_every`` and ``max_steps`` up to ``MAX_CHUNK``, so validations and the end fall on chunk ends."""
    if engine not in GRAPH_ENGINES:
        return 1
    g = math.gcd(min(train.eval_every, train.max_steps), train.max_steps)
    return next(d for d in range(min(MAX_CHUNK, g), 0, -1) if g % d == 0)


LOG_DIR = "logs"
CHECKPOINT_DIR = "checkpoints"
BEST_CHECKPOINT = "best.ckpt"
LAST_CHECKPOINT = "last.ckpt"
INTERRUPT_CHECKPOINT = "interrupted.ckpt"


def check_logger(kind: str) -> None:
    """One-line ``ValueError`` unless ``kind`` is a logger that can run here."""
    if kind not in LOGGERS:
        raise ValueError(f"logger must be one of {', '.join(LOGGERS)}, got {kind!r}")
    if kind == "tensorboard":
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
            raise ValueError("logger 'tensorboard' needs tensorboard: pip install 'expressivity-suite[tensorboard]'")


def _logger(kind: str, out: Path):
    check_logger(kind)
    if kind == "none":
        return False
    # one version folder per invocation (logs/version_<n>/): a resumed trial keeps the earlier part of its log
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(str(out), name=LOG_DIR)
    return CSVLogger(str(out), name=LOG_DIR)


def evaluate_test_sets(
    trainer: L.Trainer, module: LitSequenceModel, dm: SyntheticDataModule, ckpt_path: str | None = None
) -> dict[str, float]:
    """Test-set metrics ``{"test/acc": ..., "len64/acc": ...}`` of the module (or of ``ckpt_path``'s weights).

    Out of GPU memory (other trials' processes share the GPU; the longest test sequences need the most), it
    frees the cached memory and evaluates again at half the batch (``dm.eval_batch_size``, kept halved for
    the trial's later test passes) down to one sequence: the metrics do not depend on the batch, and a
    trained trial is not lost to its test pass."""
    metrics: dict[str, float] = {}
    kwargs = {"ckpt_path": ckpt_path} if ckpt_path else {}
    while True:
        try:
            parts = trainer.test(module, datamodule=dm, verbose=False, **kwargs)
            break
        except torch.OutOfMemoryError:
            if dm.eval_batch_size == 1:
                raise
            torch.cuda.empty_cache()
            dm.eval_batch_size //= 2
            log.warning("test pass out of GPU memory: evaluating again at batch %d", dm.eval_batch_size)
    for part in parts:
        for key, value in part.items():
            metrics[key.split("/dataloader_idx")[0]] = float(value)
    return metrics


def run_trial(
    spec: TrialSpec,
    out_dir: str | Path | None = None,
    progress_bar: bool = False,
    callbacks: list[Callback] | None = None,
    options: RunOptions = RunOptions(),
) -> dict[str, Any]:
    """Train and evaluate one trial; returns a flat dict of results.

    Checkpoints go to ``<out_dir>/checkpoints/``: ``best.ckpt`` (the weights of the highest ``val/acc``),
    ``last.ckpt`` (everything needed to resume, written at every validation) and, when training is
    interrupted (Ctrl-C, SIGTERM), ``interrupted.ckpt``. Training resumes from the newer of the last
    two when one exists (a trial interrupted mid-way continues where it stopped). The test sets are evaluated twice: on the best
    checkpoint (``test/acc``, ``len<L>/acc``, ...: what tables report) and on the final weights
    (``final/test/acc``, ...). Raises ``NonFiniteLossError`` when the loss becomes NaN/Inf.

    ``options``: the step engine (``RunOptions.engine``: CUDA-graph replays or eager steps, the same
    computation) and the step log. With ``out_dir``, also writes ``spec.json`` and the step log (``csv`` writes
    ``logs/version_<n>/metrics.csv``, ``tensorboard`` event files there; one version per invocation); without, everything goes to a temporary folder that is
    removed. ``callbacks`` are extra Lightning callbacks (e.g. reporting validation accuracy to Optuna).
    Rebuild a trained model with ``LitSequenceModel.load_from_checkpoint(<out_dir>/checkpoints/best.ckpt)``.
    """
    accelerator, devices = resolve_device(spec.device)
    if accelerator == "cpu" and spec.train.cpu_threads > 0:
        torch.set_num_threads(spec.train.cpu_threads)
    engine = options.resolved_engine(accelerator)
    keep = out_dir is not None  # else everything goes to a temporary folder, removed at the end
    with contextlib.nullcontext(out_dir) if keep else tempfile.TemporaryDirectory(prefix="trial-") as folder:
        out = Path(folder)
        entered = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        if keep:
            (out / "spec.json").write_text(json.dumps(spec.to_dict(), indent=1))
        t = spec.train
        chunk = steps_per_chunk(engine, t)
        dm = build_datamodule(
            spec,
            f"cuda:{devices[0]}" if accelerator == "gpu" else "cpu",
            chunk=chunk,
            width_multiple=GRAPH_WIDTH_MULTIPLE if engine in GRAPH_ENGINES else 1,
        )
        dm.setup()
        L.seed_everything(spec.seed, workers=True, verbose=False)
        module = build_module(spec, dm, engine)
        engine, engine_note = capturable_engine(engine, module.model)
        if engine_note:  # a model the graph engine cannot capture: eager steps, the model built again as before
            dm.train_chunk, dm.width_multiple, chunk = 1, 1, 1
            L.seed_everything(spec.seed, workers=True, verbose=False)
            module = build_module(spec, dm, engine)
        history = _History()
        checkpoints = TrialCheckpoint(  # the best weights only: kB
            dirpath=out / CHECKPOINT_DIR,
            filename=Path(BEST_CHECKPOINT).stem,
            monitor="val/acc",
            mode="max",
            save_top_k=1,
            save_weights_only=True,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        )
        trainer = fit_trainer(
            t,
            out,
            accelerator,
            devices,
            engine,
            chunk,
            options.logger if keep else "none",
            progress_bar,
            precision=spec.model.precision,
            callbacks=[
                history,
                checkpoints,
                TrialEarlyStopping(
                    monitor="val/acc",
                    mode="max",
                    stopping_threshold=t.early_stop_acc,
                    patience=t.plateau_steps // t.eval_every if t.plateau_steps else 10**9,
                    min_delta=t.plateau_delta if t.plateau_steps else 0.0,
                    check_on_train_epoch_end=False,
                ),
                *(callbacks or []),
            ],
        )
        start = time.perf_counter()
        with fitting(trainer, history, [out / PROGRESS_FILE] if keep else []):
            resumed_from = fit_resuming(trainer, module, dm, out)
            train_time = time.perf_counter() - start
            final = evaluate_test_sets(trainer, module, dm)
            best_path = checkpoints.best_model_path
            best = evaluate_test_sets(trainer, module, dm, ckpt_path=best_path) if best_path else dict(final)
        return result_row(
            n_params=count_parameters(module.model),
            steps=trainer.global_step,
            best_step=_best_step(best_path, trainer.global_step),
            resumed_from=resumed_from,
            module=module,
            trainer=trainer,
            entered=entered,
            start=start,
            train_time=train_time,
            history=history,
            # the checkpoint callback's best score survives a resume; the history holds this run's validations
            best_val_acc=float(checkpoints.best_model_score)
            if checkpoints.best_model_score is not None
            else float("nan"),
            final_val_acc=history.val_acc[-1] if history.val_acc else float("nan"),
            best=best,
            final=final,
            test_set_names=dm.test_set_names,
            engine=engine,
            engine_note=engine_note,
            scaled=dm.task.scaled_accuracy,
        )


def capturable_engine(engine: str, model: torch.nn.Module) -> tuple[str, str]:
    """``(engine, note)``: ``engine``, or ``eager`` when it is a graph engine and a module of ``model``
    declares ``graph_capturable = False`` (a mixer whose kernels cannot be captured in a CUDA graph);
    ``note`` says why (``""`` when nothing changed)."""
    if engine not in GRAPH_ENGINES:
        return engine, ""
    for module in model.modules():
        if declared(module, "graph_capturable") is False:
            why = declared(module, "graph_note") or f"{type(module).__name__} cannot be captured in a CUDA graph"
            return "eager", f"engine {engine} -> eager: {why}"
    return engine, ""


def fit_trainer(
    t: TrainConfig,
    out: Path,
    accelerator: str,
    devices,
    engine: str,
    chunk: int,
    logger: str,
    progress_bar: bool,
    callbacks: list[Callback],
    precision: str = PRECISIONS[0],
) -> L.Trainer:
    """The Lightning ``Trainer`` of a trial (or a stack of trials) whose files go to ``out``: validations
    every ``eval_every`` optimizer steps (``chunk`` per Lightning step), ``precision`` (Lightning's name;
    with a graph engine its precision plugin autocasts the same way), ``callbacks`` plus the resume
    point (``last.ckpt`` at every validation) and the checkpoint written on Ctrl-C / SIGTERM."""
    resume_point = TrialCheckpoint(  # last.ckpt at every validation, with optimizer and loop state
        dirpath=out / CHECKPOINT_DIR,
        filename=Path(LAST_CHECKPOINT).stem,
        save_top_k=1,
        monitor=None,
        enable_version_counter=False,
    )
    on_interrupt = InterruptCheckpoint(dirpath=out / CHECKPOINT_DIR, filename=Path(INTERRUPT_CHECKPOINT).stem)
    return L.Trainer(
        accelerator=accelerator,
        devices=devices,
        max_steps=t.max_steps,
        plugins=[CUDAGraphPrecision(autocast=precision == "bf16-mixed")] if engine in GRAPH_ENGINES else None,
        precision=None if engine in GRAPH_ENGINES else precision,
        # never the working directory: a worker must survive its cwd being deleted under it
        default_root_dir=str(out),
        # in Lightning steps (chunks of optimizer steps); at least one validation, so every trial has a best checkpoint
        val_check_interval=min(t.eval_every, t.max_steps) // chunk,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        callbacks=[*callbacks, resume_point, on_interrupt],
        logger=_logger(logger, out),
        enable_checkpointing=True,
        enable_model_summary=False,
        enable_progress_bar=progress_bar,
        log_every_n_steps=max(1, t.eval_every // 5 // chunk),
    )


@contextlib.contextmanager
def fitting(trainer: L.Trainer, history: _History, progress_files: list[Path]):
    """Around ``fit`` and the test passes: Lightning's warnings about these small in-memory runs muted,
    Ctrl-C raised as ``KeyboardInterrupt``, and the progress samples appended to ``progress_files``
    as they are taken (a resumed invocation appends to the interrupted one's)."""
    history.progress_files = list(progress_files)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*is smaller than the logging interval.*")
        warnings.filterwarnings("ignore", ".*Checkpoint directory .* exists and is not empty.*")
        warnings.filterwarnings("ignore", ".*is set, but there is no last checkpoint available.*")  # a fresh trial
        with interrupt_as_keyboard_interrupt(trainer):
            yield


def fit_resuming(trainer: L.Trainer, module: LitSequenceModel, dm: SyntheticDataModule, out: Path) -> int:
    """``trainer.fit`` from ``resume_checkpoint(out)`` when there is one; returns the step it resumed from (0)."""
    resume = resume_checkpoint(out)
    resumed_from = trainer_step_of(resume) if resume else 0
    trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else "last")
    return resumed_from


def result_row(
    *,
    n_params: int,
    steps: int,
    best_step: int,
    resumed_from: int,
    module: LitSequenceModel,
    trainer: L.Trainer,
    entered: float,
    start: float,
    train_time: float,
    history: _History,
    best_val_acc: float,
    final_val_acc: float,
    best: dict[str, float],
    final: dict[str, float],
    test_set_names: list[str],
    engine: str = "",
    engine_note: str = "",
    scaled: Callable[[float], float] | None = None,
) -> dict[str, Any]:
    """A trial's results row (``run_trial``'s keys): the trial's own numbers, the run's times and rates
    (``perf_counter`` s at ``entered`` the run, ``start`` its fit), the test metrics of the best
    (``test/acc``, ...) and final (``final/test/acc``, ...) weights and the Newton statistics of ``module``.
    With the task's ``scaled`` (``Task.scaled_accuracy``: ``(acc - chance) / (1 - chance)``), the scaled
    accuracies too (``test/scaled_acc``, ``len<L>/scaled_acc``, ``range<a>-<b>/scaled_acc``,
    ``extrap/scaled_acc``: Grazzi et al. 2025; ``final/<set>/scaled_acc`` of the final weights, which
    Grazzi et al. score)."""
    extrap_accs = [best[f"{name}/acc"] for name in test_set_names if name.startswith("len") and f"{name}/acc" in best]
    root = trainer.strategy.root_device
    result: dict[str, Any] = {
        "n_params": n_params,
        "steps": steps,
        "best_step": best_step,
        "resumed_from_step": resumed_from,
        # seconds: data sets, model and trainer built; fit (validations included); fit and the test passes
        "setup_time_s": round(start - entered, 3),
        "train_time_s": round(train_time, 3),
        "wall_time_s": round(time.perf_counter() - start, 3),
        "steps_per_s": round((trainer.global_step - resumed_from) / max(train_time, 1e-9), 3),
        "steady_steps_per_s": round(history.steady_rate(), 3),
        "best_val_acc": best_val_acc,
        "final_val_acc": final_val_acc,
        "stopped_early": steps < trainer.max_steps,
        "device": torch.cuda.get_device_name(root) if root.type == "cuda" else "cpu",
        "engine": engine,
        **({"engine_note": engine_note} if engine_note else {}),
        **best,
        **{f"final/{k}": v for k, v in final.items()},
        **newton_summary(module.model),
    }
    if isinstance(module, CapturedSteps) and module.eager_from_step is not None:  # captured steps kept skipping
        result["newton/eager_from_step"] = module.eager_from_step
    if extrap_accs:
        result["extrap/mean_acc"] = sum(extrap_accs) / len(extrap_accs)
    if scaled is not None:
        accuracies = [f"{w}{name}/acc" for w in ("", "final/") for name in test_set_names if f"{w}{name}/acc" in result]
        accuracies += ["extrap/mean_acc"] if "extrap/mean_acc" in result else []
        result.update({key.rsplit("/", 1)[0] + "/scaled_acc": scaled(result[key]) for key in accuracies})
    return result


def resume_checkpoint(out: Path) -> Path | None:
    """The checkpoint a trial in ``out`` resumes from: the newer of ``interrupted.ckpt`` (written on
    Ctrl-C / SIGTERM) and ``last.ckpt`` (written at every validation), or ``None``."""
    found = [
        p for p in (out / CHECKPOINT_DIR / INTERRUPT_CHECKPOINT, out / CHECKPOINT_DIR / LAST_CHECKPOINT) if p.is_file()
    ]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def trainer_step_of(checkpoint: Path) -> int:
    """The training step a Lightning checkpoint was written at."""
    return int(torch.load(checkpoint, map_location="cpu", weights_only=False).get("global_step", 0))


def _best_step(best_path: str, default: int) -> int:
    return trainer_step_of(Path(best_path)) if best_path else default


#: torch's notice that ``rms_norm`` of a bfloat16 input (``bf16-mixed`` autocast) with a float32 weight runs
#: its composite implementation instead of the fused kernel: the same function, so not a user's concern
RMS_NORM_DTYPE_NOTICE = "Mismatch dtype between input and weight.*Cannot dispatch to fused implementation"


def quiet_lightning() -> None:
    """Silence Lightning's per-run banners (GPU available, LOCAL_RANK, ...) and torch's ``rms_norm`` notice
    under bf16 autocast (``RMS_NORM_DTYPE_NOTICE``)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", RMS_NORM_DTYPE_NOTICE, UserWarning)
