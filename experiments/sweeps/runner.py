"""The one runner below every training CLI (sweep, reproduce, probe): plans in, results files out.

``run_plans(plans, out, study_name, SweepOptions(...))`` runs (or resumes) the cells of several sweep plans as one
Optuna study, so a worker pool spans all of them: it checks every model builds, syncs the grid
(re-queueing the cells of dead or interrupted workers), runs the cells in this process or in
``SweepOptions.workers`` worker processes (``experiments.sweeps.workers``), shows progress, and writes each plan's
``<out>/<entry>/results.csv`` and ``table.md`` (with one plan and ``flat=True``: ``<out>/results.csv``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger("experiments.sweeps.runner")


def on_terminal() -> bool:
    """Is standard error an interactive terminal (where a progress bar makes sense)?"""
    return os.isatty(sys.stderr.fileno()) if hasattr(sys.stderr, "fileno") else False


class _ConsoleStream:
    """A text stream that prints through a rich console, above its live progress bar."""

    def __init__(self, console) -> None:
        self.console = console

    def write(self, text: str) -> int:
        if text.strip():
            self.console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass


class Progress:
    """Progress of a run over ``total`` cells: a rich bar on a terminal, else a line whenever a cell finishes.
    ``running(text)``: what the running trials are doing, in the bar's status field, else as a line.
    While the bar is live, log lines of the root logger's console handlers print above it (never glued
    onto it). The bar draws on standard error and starts at ``done`` finished cells (those an earlier
    command finished). ``console``: the rich console of the bar (tests)."""

    def __init__(self, label: str, total: int, enabled: bool = True, console=None, done: int = 0) -> None:
        self.label, self.total, self.start = label, total, time.perf_counter()
        self.bar = None
        self._last: int | None = None
        self._swapped: list[tuple[logging.StreamHandler, Any]] = []
        if enabled and (console is not None or on_terminal()):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress
            from rich.text import Text

            class Bar(RichProgress):
                """The bar, then its status (the running trials) on lines of their own below it, wrapped at
                the terminal's width rather than cut."""

                def get_renderables(self):
                    yield self.make_tasks_table(self.tasks)
                    for task in self.tasks:
                        if task.fields.get("status"):
                            yield Text(task.fields["status"], overflow="fold")

            self.bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=False,
                console=console or Console(stderr=True, force_terminal=True),
            )  # on_terminal() saw one
            self.task = self.bar.add_task(label, total=total, status="", completed=done)

    @property
    def live(self) -> bool:
        return self.bar is not None

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self.bar.__enter__()
            stream = _ConsoleStream(self.bar.console)
            for handler in logging.getLogger().handlers:
                if type(handler) is logging.StreamHandler:
                    self._swapped.append((handler, handler.setStream(stream)))
        return self

    def __exit__(self, *exc) -> None:
        for handler, old in self._swapped:
            handler.setStream(old)
        self._swapped.clear()
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, counts: dict[str, int], detail: str = "") -> None:
        """``counts``: ``done``, ``running``, ``waiting``, ``todo`` (``GridStudy.progress``)."""
        status = f"{counts.get('running', 0)} running, {counts.get('waiting', 0)} waiting"
        if self.bar is not None:
            self.bar.update(
                self.task,
                completed=counts["done"],
                status=status,
                description=f"{self.label}{': ' + detail if detail else ''}",
            )
            return
        if counts["done"] != self._last:
            self._last = counts["done"]
            elapsed = time.strftime("%H:%M:%S", time.gmtime(time.perf_counter() - self.start))
            log.info(
                "%s: %d/%d cells done, %s%s; %s elapsed",
                self.label,
                counts["done"],
                self.total,
                status,
                f" ({detail})" if detail else "",
                elapsed,
            )

    def running(self, text: str) -> None:
        """What the running trials are doing (``experiments.trial.running``)."""
        if self.bar is not None:
            self.bar.update(self.task, status=text)
        else:
            log.info("%s: running: %s", self.label, text)


def sweep_eta(cells: list[tuple[Path, int | str, int]], trials: list) -> str:
    """``"; sweep: at most ~2.1 h left"``: the steps every unfinished cell of ``cells`` (``(cell folder, label,
    max_steps)``) has left to its budget, at the running ``trials``' summed rate (early stopping ends
    trials sooner, so it is an upper bound); ``""`` before any rate is known."""
    from experiments.trial.running import duration, steps_left

    rate = sum(t.rate for t in trials if t.rate == t.rate)
    if not rate > 0:
        return ""
    left = sum(steps_left(folder, max_steps) for folder, _, max_steps in cells)
    return f"; sweep: at most ~{duration(left / rate)} left ({len(trials)} running)"


class RunningMonitor:
    """A thread that reports the running trials of ``cells`` (``(cell folder, label, max_steps)``) to
    ``bar.running`` every ``every`` seconds (every 2 s at most on a live bar); ``every <= 0``: never."""

    def __init__(self, bar: Progress, cells: list[tuple[Path, str, int]], every: float) -> None:
        import threading

        self.bar, self.cells, self.since = bar, cells, time.time()
        self.every = min(every, 2.0) if bar.live else every
        self.stale_s = max(120.0, 3 * every)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="running-trials", daemon=True)

    def _loop(self) -> None:
        from experiments.trial.running import running_trials

        while not self._stop.wait(self.every):
            trials = running_trials(self.cells, self.since, self.stale_s)
            if trials:
                self.bar.running("; ".join(t.describe() for t in trials) + sweep_eta(self.cells, trials))

    def __enter__(self) -> RunningMonitor:
        if self.every > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


#: words in an error of a model run on the CPU that say its kernels need a GPU
_GPU_ONLY = re.compile(r"cuda|triton|gpu", re.IGNORECASE)


def _names_the_mixer(message: str, mixer: str) -> bool:
    """Is ``message`` a mixer error of ``mixers`` that already names ``mixer`` (or its name without its
    ``[key=value,...]`` options) up front? Then it is shown as it is, without a second prefix."""
    from mixers.build import split_options

    try:
        base = split_options(mixer)[0]
    except ValueError:
        base = mixer
    return any(message.startswith(f"{lead}{name!r}") for lead in ("mixer ", "unknown mixer ") for name in (mixer, base))


#: seconds: a model check that takes longer than this is logged (with its time), as is the whole check
SLOW_CHECK_S = 5.0


@contextlib.contextmanager
def _still_checking(what: str, every: float = 10.0):
    """Log ``checking WHAT: N s so far (...)`` every ``every`` seconds while the block runs."""
    import threading

    done, start = threading.Event(), time.perf_counter()

    def report() -> None:
        while not done.wait(every):
            log.info(
                "checking %s: %.0f s so far (compiling its Triton kernels: the first run on a machine; "
                "later ones read Triton's cache)",
                what,
                time.perf_counter() - start,
            )

    thread = threading.Thread(target=report, name="model-check", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def validate_specs(cells: list[tuple[str, Any]]) -> float:
    """Build each distinct model once and run it forward and backward on a tiny input on the trials'
    device (with their precision), so configuration errors (an unknown mixer option, something that is
    not a mixer, a GPU-only mixer on a machine without one, a kernel that refuses its backward there)
    surface before any training. Autotuned Triton kernels (fla's) run their first configuration only
    (``experiments.engines.autotune.first_config_only``; a model that fails so is checked again with
    autotuning), but on a GPU each kernel still compiles on its first call on a machine: a check running
    longer than 10 s says so every 10 s, and each one slower than ``SLOW_CHECK_S`` is logged with its
    time. Returns the check's time in seconds."""
    distinct = {}
    for _, spec in cells:
        # the task (its vocabulary and classes), the whole model shape and the device
        key = json.dumps([spec.task, spec.task_options, spec.model.to_dict(), spec.device], sort_keys=True, default=str)
        distinct.setdefault(key, spec)
    from experiments.engines.autotune import first_config_only

    t_all = time.perf_counter()
    for n, spec in enumerate(distinct.values(), 1):
        t_model = time.perf_counter()
        what = (
            f"model {n}/{len(distinct)} ({spec.model.mixer}, {spec.model.layers} layer{'' if spec.model.layers == 1 else 's'}, "
            f"{spec.task}) on {spec.device or 'cpu'}"
        )
        with _still_checking(what):
            try:
                with first_config_only():  # one configuration per autotuned kernel: a check, not a tuning
                    _check_model(spec)
            except ValueError:
                _check_model(spec)  # a first configuration that does not fit is not the model's fault
        took = time.perf_counter() - t_model
        if took > SLOW_CHECK_S:
            log.info("checked %s in %.0f s", what, took)
    took = time.perf_counter() - t_all
    if took > SLOW_CHECK_S:
        log.info("checked %d distinct models in %.0f s before training", len(distinct), took)
    return took


def _check_model(spec) -> None:
    """``validate_specs``' check of one model: raises ``ValueError`` with a one-line message."""
    import torch

    from experiments.trial.train import build_datamodule, build_module, resolve_device
    from mixers.protocol import declared

    accelerator, devices = resolve_device(spec.device)
    device = torch.device(f"cuda:{devices[0]}" if accelerator == "gpu" else "cpu")
    dm = build_datamodule(spec)
    try:
        model = build_module(spec, dm).model
        gpu_only = [m for m in model.modules() if declared(m, "requires_cuda")]
        if gpu_only and device.type != "cuda":
            raise ValueError(
                f"mixer {spec.model.mixer!r} needs a CUDA GPU: {type(gpu_only[0]).__name__} runs Triton kernels "
                "for a GPU only; run it with --device cuda on a machine with one"
            )
        tokens = torch.zeros(1, 4, dtype=torch.long, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.model.precision == "bf16-mixed"):
            logits = model.to(device)(tokens)
        logits.float().sum().backward()
    except (ValueError, TypeError, AttributeError, RuntimeError, AssertionError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, ValueError) and _names_the_mixer(first, spec.model.mixer):
            raise ValueError(first) from None
        if device.type == "cpu" and _GPU_ONLY.search(first):
            raise ValueError(f"mixer {spec.model.mixer!r} needs a CUDA GPU: {first}") from None
        options = f" with options {spec.model.mixer_options}" if spec.model.mixer_options else ""
        raise ValueError(f"mixer {spec.model.mixer!r}{options}: {first}") from None
    if tuple(logits.shape) != (1, 4, dm.num_classes):
        raise ValueError(
            f"mixer {spec.model.mixer!r} gives logits of shape {tuple(logits.shape)} for 4 tokens; "
            f"a mixer must map (B, L, d) to (B, L, d)"
        )


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """How a study's cells run, not what they compute (built once from a CLI's run arguments:
    ``experiments.cli.sweep_options``): ``workers`` processes (0: this one), the ``device`` of each
    trial, the Optuna ``storage_url`` (``None``: a journal file in the output folder), ``stale_timeout``
    seconds without a heartbeat before another worker's trial counts as dead, ``retry_failed`` (re-run
    cells whose trial failed for a final reason), the ``progress`` bar and ``progress_every`` seconds
    between reports of the running trials (0: none), and ``trial``: each trial's
    ``experiments.trial.train.RunOptions`` (step log, step engine, stacking)."""

    workers: int = 0
    device: str = "auto"
    storage_url: str | None = None
    stale_timeout: float = 60
    retry_failed: bool = False
    progress: bool = True
    progress_every: float = 30.0
    trial: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {self.workers!r}")
        if not self.stale_timeout > 0:
            raise ValueError(f"stale timeout must be > 0 seconds, got {self.stale_timeout}")
        if not self.progress_every >= 0:
            raise ValueError(f"progress every must be >= 0 seconds, got {self.progress_every}")
        if self.trial is None:
            from experiments.trial.train import RunOptions

            object.__setattr__(self, "trial", RunOptions())


def _run(
    grid,
    cells: list,
    keys: list[str],
    out: Path,
    options: SweepOptions,
    on_progress,
    bar: Progress,
    priority: set[str] = frozenset(),
) -> None:
    """Run the cells: in ``options.workers`` processes, or in this one. ``priority``: the cells of
    ``priority: high`` sweeps (worker processes only)."""
    from experiments.sweeps.workers import run_workers, worker_loop

    device = options.device
    if options.workers:
        run_workers(
            grid,
            cells,
            out,
            options.storage_url,
            options.workers,
            device,
            on_progress=on_progress,
            options=options.trial,
            priority=priority,
        )
        return
    on_progress(grid.progress(keys))

    def finished(spec: dict, outcome: str) -> None:
        if outcome != "ok":
            log.warning("trial (%s seed=%s lr=%g) failed: %s", spec["mixer"], spec["seed"], spec["lr"], outcome)
        on_progress(grid.progress(keys), f"{spec['mixer']} seed={spec['seed']} lr={spec['lr']:g} {outcome}")

    worker_loop(
        grid,
        cells,
        out,
        device=None if device == "auto" else device,
        options=options.trial,
        on_claim=lambda s: bar.update(grid.progress(keys), f"{s['mixer']} seed={s['seed']} lr={s['lr']:g}"),
        on_trial=finished,
    )


def run_plans(
    plans: list,
    out: Path,
    study_name: str,
    options: SweepOptions = SweepOptions(),
    *,
    run: bool = True,
    label: str | None = None,
    flat: bool = False,
    results_dir: Path | None = None,
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Run (resume) every plan's cells as ``options`` says; returns ``({entry: results DataFrame}, info)``.

    ``run=False`` only collects. ``label`` names the study's part in the logs and the record of its
    checks (default ``study_name``). Results files go to ``results_dir`` (default ``out``, the folder of the
    study and the cells): ``<results_dir>/<entry>/``, or with ``flat`` (one plan) ``results_dir`` itself.
    ``info``: ``cells``, ``done``, ``counts`` (of this call's sync), ``wall_s``, ``busy_s``
    (``results.busy_seconds`` of the cells' trials: over every invocation), ``checks`` (seconds and count
    of the up-front model checks of every invocation under this ``label``; ``run=False`` checks nothing),
    ``versions``.
    """
    from experiments.sweeps.presets import build_specs
    from experiments.sweeps.results import busy_seconds, collect, versions, warn_newton_fallbacks, write_results
    from experiments.sweeps.study import GridStudy, cell_id

    cells_by_entry = {
        p.entry or p.task: [(p.entry or p.task, s) for s in build_specs(p, options.device)] for p in plans
    }
    cells = [c for v in cells_by_entry.values() for c in v]
    if flat and len(cells_by_entry) != 1:
        raise ValueError("flat results need exactly one plan")
    check_s = validate_specs(cells) if run else None
    grid = GridStudy.open(
        options.storage_url, out, study_name, options.stale_timeout
    )  # a storage that cannot open: no folder made
    if check_s is not None:
        grid.record_check(label or study_name, check_s)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(cell_id(s) for _, s in cells))
    priority = {cell_id(s) for p in plans if p.priority == "high" for _, s in cells_by_entry[p.entry or p.task]}
    meta = versions()

    target = results_dir or out

    def write_all() -> dict[str, pd.DataFrame]:
        results = {}
        for entry, entry_cells in cells_by_entry.items():
            results[entry] = collect(grid, entry_cells, meta, every_finished=flat)
            write_results(results[entry], target if flat else target / entry)
        return results

    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    if run:
        counts = grid.sync(cells, retry_failed=options.retry_failed)
        log.info(
            "%s: %d cells: %d done, %d queued, %d waiting, %d running%s",
            label or study_name,
            len(keys),
            counts["done"],
            counts["queued"],
            counts["waiting"],
            counts["running"],
            (f", {counts['stale']} cell(s) of dead workers re-queued" if counts["stale"] else ""),
        )
        from experiments.sweeps.workers import cell_dir

        watched = [
            (cell_dir(out, entry, spec), f"{spec.model.mixer} s{spec.seed} lr {spec.lr:g}", spec.train.max_steps)
            for entry, spec in cells
        ]
        with (
            Progress(label or study_name, len(keys), enabled=options.progress, done=grid.progress(keys)["done"]) as bar,
            RunningMonitor(bar, watched, options.progress_every),
        ):
            done_seen = [-1]

            def on_progress(c: dict[str, int], detail: str = "") -> None:
                bar.update(c, detail)
                if c["done"] != done_seen[0]:
                    done_seen[0] = c["done"]
                    write_all()

            try:
                _run(grid, cells, keys, out, options, on_progress, bar, priority)
            except KeyboardInterrupt:
                write_all()  # the interrupted cells show as missing
                raise
    results = write_all()
    for df in results.values():
        warn_newton_fallbacks(df)
    by_cell = grid.trials_by_cell()
    info = {
        "cells": len(keys),
        "done": grid.progress(keys, by_cell)["done"],
        "counts": counts,
        "wall_s": time.perf_counter() - t0,
        "busy_s": busy_seconds(t for key in keys for t in by_cell.get(key, [])),
        "checks": grid.check_seconds(label or study_name),
        "versions": meta,
    }
    return results, info
