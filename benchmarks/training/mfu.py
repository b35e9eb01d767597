"""``python -m benchmarks.training.mfu PRESET [PRESET ...]``: how much of the GPU the presets' training uses.

For each preset it takes one representative cell per model shape (``representative_cells``: a mixer with its
options, depth, width, block, batch size, training lengths and precision; sweeps of a preset that differ only
in the task's vocabulary and classes share one, and the report names the entries each stands for) and measures:

- **alone**: one short trial of ``--steps`` steps through ``run_trial`` (the engine the preset's sweep uses: the
  CUDA graph, or the compiled graph where its ``budget: {engine: compiled}`` says so; eager on the CPU), with the
  preset's own validation and test sets and validation interval. A ``phases.PhaseTimer`` splits its wall time;
  the steps/s are its training steps after the first batch (warm-up, capture, compilation) less stalled
  batches (``phases.STALL_FACTOR``: a kernel autotuned on a later call, counted once as stall), and the phase
  shares are those of a full trial of the preset's ``max_steps`` (``phases.Phases.project``);
- **FLOPs** per training step (``flops.step_flops``: ``FlopCounterMode``, forward, loss and backward of one
  padded batch) and tokens per step: ``padded`` (batch x the longest training length: the width every
  training batch has) and ``real`` (batch x the mean sequence length);
- **with N workers** (``--workers N``, under MPS with ``--mps``): the cells trained at once on N worker
  processes (``throughput.train_together``; fewer cells than workers: repeated with other seeds; more: in
  waves of N), each trial long enough for about ``--worker-seconds`` of training together; per cell its
  steady steps/s, and for the preset the tokens/s and FLOP/s of all workers together in the window in which
  all of them trained (``throughput.concurrent_rate``, weighted by each trial's tokens or FLOPs per step).

The whole preset's wall time is projected from the cells (``preset_projection``): every trial of a cell's shape
at its own step budget, slowed as the cell's rate with the workers, shared over the workers.

MFU is the achieved model FLOP/s over the device's dense bfloat16 peak and its float32 (non-tensor-core) peak
(``flops.PEAKS``); a device without a known peak (a CPU) gets none. The Markdown report (``--out``, default
``benchmarks/results/mfu.md``) states device, date, versions and the command; the rows go to the JSON file
beside it; ``--merge`` adds the presets of another call on the same device to that report (replacing those it
measures again). ``--batch-size N`` trains every cell on batches of ``N`` (the papers' batch sizes are larger
than the presets': how much of the GPU a larger batch uses), reported as ``PRESET (batch N)`` beside the
preset's own rows under ``--merge``. ``--quick``: a CPU run of a few steps on small data sets and batches (a
test runs it in seconds).

Examples::

    python -m benchmarks.training.mfu pararnn-table6 grazzi-table3 deltaproduct-groups state-tracking --workers 16 --mps
    python -m benchmarks.training.mfu deltaproduct-groups --workers 16 --mps --batch-size 2048 --merge
    python -m benchmarks.training.mfu state-tracking --quick --tasks s3 --mixers gru,transformer --workers 2 --out /tmp/m.md
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from experiments.cli import Parser, nonnegative_int, positive_int, run_cli, str_list
from experiments.trial.shape import PRECISIONS

log = logging.getLogger("benchmarks.training.mfu")

DEFAULT_OUT = Path("benchmarks/results/mfu.md")
#: the GPU takes about this many alone-trials' worth of steps when many workers share it (graph engine,
#: docs/performance.md): a worker trial's steps are sized from it (its window is measured, not assumed)
GPU_CONCURRENCY = 6
#: ``--quick``: batch and data-set sizes of the CPU run
QUICK = {"batch_size": 8, "train_size": 64, "val_size": 16, "test_size": 16, "eval_batch_size": 16}
#: ``--quick``: steps of each worker trial: several seconds on a CPU, so that two workers started a few
#: seconds apart on a busy machine still train at the same time (progress is sampled from step 10 on)
QUICK_WORKER_STEPS = 1000


@dataclasses.dataclass
class Cell:
    """A representative cell: ``spec`` (a ``TrialSpec`` of sweep ``entry``), ``entries``: every sweep of the
    preset whose cells have its shape (``entry`` first), and ``trials``: how many of the preset's trials have
    its shape, by ``(max_steps, eval_every)``."""

    entry: str
    spec: Any
    entries: list[str]
    trials: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)


def training_lengths(spec) -> tuple[int, int]:
    """``(shortest, longest)`` training sequence length of ``spec``."""
    from tasks import get_task

    if spec.extrapolation:
        return int(spec.extrapolation.get("min_len", 3)), int(spec.extrapolation.get("max_len", 40))
    length = int(get_task(spec.task, **spec.task_options).config.seq_len)
    return length, length


def shape_key(spec) -> tuple:
    """What sets a training step's cost, the task's vocabulary and classes aside."""
    return (
        spec.model.mixer,
        json.dumps(spec.model.mixer_options, sort_keys=True),
        spec.model.layers,
        spec.model.d_model,
        spec.model.block,
        spec.model.positional,
        spec.model.conv_kernel,
        spec.model.precision,
        spec.train.batch_size,
        training_lengths(spec),
    )


def representative_cells(
    preset: str, tasks: list[str] | None = None, mixers: list[str] | None = None, device: str = "auto"
) -> list[Cell]:
    """One ``Cell`` per distinct ``shape_key`` among the preset's sweeps (``tasks``: only those entries;
    ``mixers``: only those mixers), the first seed and lr of the first sweep that has it, in preset order,
    with the count of the trials of every seed and lr it stands for."""
    from experiments.sweeps.presets import build_specs, load_preset, resolve_sweep

    entries = list(load_preset(preset).get("tasks", {}))
    unknown = sorted(set(tasks or ()) - set(entries))
    if unknown:
        raise ValueError(f"--tasks: preset {preset} has no sweep {', '.join(unknown)}; it has {', '.join(entries)}")
    cells: dict[tuple, Cell] = {}
    for entry in tasks or entries:
        plan = resolve_sweep(entry, preset)
        plan.mixers = [m for m in plan.mixers if mixers is None or m in mixers]
        for spec in build_specs(plan, device):  # mixer, depth, seed, lr: a shape's first is its first seed and lr
            cell = cells.setdefault(shape_key(spec), Cell(entry, spec, []))
            cell.entries += [] if entry in cell.entries else [entry]
            budget = (spec.train.max_steps, spec.train.eval_every)
            cell.trials[budget] = cell.trials.get(budget, 0) + 1
    if not cells:
        raise ValueError(f"preset {preset}: no cell of --mixers {','.join(mixers or [])} in its sweeps")
    return list(cells.values())


def run_options(preset: str):
    """The ``RunOptions`` the preset's sweep runs with (its engine; no step log)."""
    from experiments.sweeps.presets import load_preset
    from experiments.trial.train import RunOptions

    engine = (load_preset(preset).get("budget") or {}).get("engine")
    return RunOptions(logger="none", **({"gpu_engine": engine} if engine else {}))


def with_options(cells: list[Cell], train: dict[str, Any], model: dict[str, Any]) -> list[Cell]:
    """``cells`` with these ``train`` and ``model`` options changed; an option given as 0 or ``None`` keeps the
    preset's (``length_bucketing``: pools of batches cut by length; ``batch_size``: sequences per batch;
    ``precision``: the model's)."""
    train, model = ({k: v for k, v in d.items() if v} for d in (train, model))
    if not train and not model:
        return cells

    def changed(spec):
        t, m = dataclasses.replace(spec.train, **train), dataclasses.replace(spec.model, **model)
        return dataclasses.replace(spec, train=t, model=m)

    return [dataclasses.replace(c, spec=changed(c.spec)) for c in cells]


def report_name(preset: str, batch_size: int | None, length_bucketing: int = 0, precision: str | None = None) -> str:
    """The preset's name in the report: ``PRESET``, or with ``--batch-size N``, ``--length-bucketing k`` and
    ``--precision P`` ``PRESET (batch N, length pools of k, P)``, so that a ``--merge`` keeps the preset's own
    rows beside them."""
    changes = [f"batch {batch_size}"] if batch_size else []
    changes += [f"length pools of {length_bucketing}"] if length_bucketing else []
    changes += [precision] if precision else []
    return f"{preset} ({', '.join(changes)})" if changes else preset


def timed_spec(spec, steps: int, quick: bool, eval_every: int | None = None, small_eval: bool = False):
    """``spec`` training ``steps`` steps with no early stop, validating every ``eval_every`` (default: the
    preset's, at most every ``steps // 2``: two validations at least, so the first's one-off compilation
    is told from the validation's cost, ``phases.PhaseTimer``); ``small_eval``: 256 validation and test
    sequences; ``quick``: ``QUICK``'s sizes on the CPU."""
    t = spec.train
    every = min(eval_every, steps) if eval_every else min(t.eval_every, max(1, steps // 2))
    train = dataclasses.replace(t, max_steps=steps, eval_every=every, early_stop_acc=2.0, plateau_steps=None)
    if small_eval:
        train = dataclasses.replace(train, val_size=min(t.val_size, 256), test_size=min(t.test_size, 256))
    if quick:
        sizes = {k: min(v, getattr(train, k)) for k, v in QUICK.items()}
        train = dataclasses.replace(train, **sizes)
    return dataclasses.replace(spec, train=train, device="cpu" if quick else spec.device)


def measure_alone(cell: Cell, steps: int, options, quick: bool) -> dict[str, Any]:
    """The cell's step cost and one short trial of it alone (see the module docstring) as one row."""
    import torch

    from benchmarks.training.flops import step_flops
    from benchmarks.training.phases import PhaseTimer
    from experiments.trial.train import run_trial

    spec = timed_spec(cell.spec, steps, quick)
    full = cell.spec.train
    row: dict[str, Any] = {
        "entry": cell.entry,
        "entries": cell.entries,
        "mixer": spec.model.mixer,
        "layers": spec.model.layers,
        "d_model": spec.model.d_model,
        "precision": spec.model.precision,
        "max_steps": full.max_steps,
        "eval_every": full.eval_every,
        "trials": [[max_steps, every, n] for (max_steps, every), n in cell.trials.items()],
    }
    try:
        device = "cuda" if torch.cuda.is_available() and spec.device != "cpu" else "cpu"
        row.update(step_flops(spec, device))
        timer = PhaseTimer()
        t0 = time.perf_counter()
        result = run_trial(spec, options=options, callbacks=[timer])
        phases = timer.phases(time.perf_counter() - t0, result["setup_time_s"])
    except Exception as e:  # noqa: BLE001  (a cell that cannot run is reported, not fatal)
        return {**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    finally:
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    row.update(
        {
            "engine": result["engine"],
            "device": result["device"],
            "steps_per_s": phases.steps_per_s,
            "phases": dataclasses.asdict(phases),
            "full_trial_s": phases.project(full.max_steps, full.eval_every),
            "shares": phases.shares(full.max_steps, full.eval_every),
        }
    )
    return row


def worker_steps(alone_steps_per_s: float, seconds: float, workers: int, chunk: int = 50) -> int:
    """Steps of a worker trial that trains about ``seconds`` while ``workers`` share the GPU (each at
    ``GPU_CONCURRENCY / workers`` of its rate alone, at most all of it), a multiple of ``chunk``."""
    if not alone_steps_per_s > 0:
        return chunk
    rate = alone_steps_per_s * min(1.0, GPU_CONCURRENCY / workers)
    return max(chunk, int(rate * seconds) // chunk * chunk)


def worker_waves(cells: list[Cell], workers: int) -> list[list[tuple[int, int]]]:
    """The trials of the concurrent run as waves of ``workers`` trials, each ``(cell index, copy)``: every cell
    once, a wave that is not full topped up with further copies of the cells (other seeds), round robin."""
    n = len(cells)
    order = list(range(n)) + [i % n for i in range(n, -(-n // workers) * workers)] if n else []
    copies: dict[int, int] = {}
    trials = []
    for i in order:
        trials.append((i, copies.get(i, 0)))
        copies[i] = copies.get(i, 0) + 1
    return [trials[k : k + workers] for k in range(0, len(trials), workers)]


def measure_workers(
    cells: list[Cell], rows: list[dict[str, Any]], workers: int, options, quick: bool, seconds: float, out: Path
) -> dict[str, Any]:
    """The cells trained at once on ``workers`` processes (``worker_waves``); adds each cell's steady steps/s
    with ``workers`` (``with_workers_steps_per_s``) to its row of ``rows`` and returns the preset's rates together:
    in the windows in which all of a wave's trials trained (``*_per_s``), and end to end
    (``end_to_end_real_tokens_per_s``: the tokens of every trial over the waves' wall-clock, worker start-up,
    compilation and test passes included)."""
    from benchmarks.training.throughput import concurrent_rate, train_together

    ok = [i for i, r in enumerate(rows) if "error" not in r]
    in_window = {"window_s": 0.0, "real_tokens": 0.0, "padded_tokens": 0.0, "flops": 0.0, "steps": 0.0}
    end_to_end = {"wall_s": 0.0, "real_tokens": 0.0}
    busy, waves, rates = [], [], {i: [] for i in ok}
    for w, wave in enumerate(worker_waves([cells[i] for i in ok], workers)):
        trials = []
        for k, copy in wave:
            i = ok[k]
            n = QUICK_WORKER_STEPS if quick else worker_steps(rows[i]["steps_per_s"], seconds, workers)
            spec = timed_spec(cells[i].spec, n, quick, eval_every=n, small_eval=True)
            trials.append((i, (cells[i].entry, dataclasses.replace(spec, seed=spec.seed + copy))))
        df, progress, wall, gpu_busy = train_together(
            [t for _, t in trials], workers, "cpu" if quick else "auto", out / f"wave{w}", options
        )
        real = [rows[i]["batch"] * rows[i]["real_len"] for i, _ in trials]
        done = [(k, r) for k, (_, r) in enumerate(df.iterrows()) if r.get("status") == "ok"]
        for k, r in done:
            rates[trials[k][0]].append(float(r["steady_steps_per_s"]))
        end_to_end["wall_s"] += wall
        end_to_end["real_tokens"] += sum(float(r["steps"]) * real[k] for k, r in done)
        rate, window = concurrent_rate(progress) if all(p is not None for p in progress) else (float("nan"), 0.0)
        waves.append({"trials": len(trials), "wall_s": round(wall, 1), "window_s": round(window, 2)})
        if not window > 0:
            continue
        weights = {
            "steps": [1.0] * len(trials),
            "real_tokens": real,
            "padded_tokens": [rows[i]["batch"] * rows[i]["padded_len"] for i, _ in trials],
            "flops": [float(rows[i]["flops"]) for i, _ in trials],
        }
        in_window["window_s"] += window
        for key, wts in weights.items():
            in_window[key] += concurrent_rate(progress, wts)[0] * window
        busy.append(gpu_busy)
    for i, r in rates.items():
        rows[i]["with_workers_steps_per_s"] = sorted(r)[len(r) // 2] if r else float("nan")
    window = in_window.pop("window_s")
    together = {f"{k}_per_s": (v / window if window else float("nan")) for k, v in in_window.items()}
    return {
        "workers": workers,
        "waves": waves,
        "window_s": round(window, 2),
        **together,
        "end_to_end_real_tokens_per_s": end_to_end["real_tokens"] / end_to_end["wall_s"],
        "gpu_busy": sum(busy) / len(busy) if busy else float("nan"),
    }


#: a preset's ``together`` while its workers train: what the report says if the run is cut there
WORKERS_UNFINISHED = {"error": "not finished: the run was cut while the workers trained"}


def measure_preset(preset: str, cells: list[Cell], args, save=lambda result: None) -> dict[str, Any]:
    """The rows of ``preset``'s representative ``cells`` and its rates with ``--workers`` together; ``save``
    gets the result without them (``WORKERS_UNFINISHED``) before the workers start, so a run cut during
    their run keeps the cells' rows."""
    options = run_options(preset)
    log.info("%s: %d representative cells", preset, len(cells))
    rows = []
    for cell in cells:
        rows.append(measure_alone(cell, args.steps, options, args.quick))
        log.info("%s %s: %s", preset, cell.entry, {k: v for k, v in rows[-1].items() if k not in ("phases", "shares")})
    together = None
    if args.workers:
        save({"cells": rows, "together": WORKERS_UNFINISHED})
        try:
            together = measure_workers(
                cells, rows, args.workers, options, args.quick, args.worker_seconds, args.scratch / preset
            )
        except Exception as e:  # noqa: BLE001  (the cells' own rows are kept)
            log.exception("%s: the workers' run failed", preset)
            together = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"cells": rows, "together": together}


def preset_projection(rows: list[dict[str, Any]], workers: int) -> dict[str, Any] | None:
    """The whole preset's wall time, projected from its cells' rows: every trial a cell stands for (its
    ``trials``) takes the cell's projected full trial (``phases.Phases.project`` at that trial's budget, no
    early stop), slowed by the cell's steps/s with ``workers`` against alone where the workers' rates were
    measured, the trials shared evenly over the ``workers`` (at least the longest trial); else trial after
    trial on one process. ``None`` for rows without trial counts (an older report)."""
    from benchmarks.training.phases import Phases

    if not rows or any("trials" not in r for r in rows):
        return None
    measured = lambda r: "error" not in r and r["steps_per_s"] > 0  # noqa: E731
    ok = [r for r in rows if measured(r)]
    shared = bool(workers) and bool(ok) and all(r.get("with_workers_steps_per_s", math.nan) > 0 for r in ok)
    total = longest = 0.0
    trials = steps = 0
    for r in ok:
        phases = Phases(**r["phases"])
        slow = r["steps_per_s"] / r["with_workers_steps_per_s"] if shared else 1.0
        for max_steps, every, n in r["trials"]:
            seconds = phases.project(max_steps, every)["total"] * slow
            total, longest = total + n * seconds, max(longest, seconds)
            trials, steps = trials + n, steps + n * max_steps
    return {
        "trials": trials,
        "steps": steps,
        "unmeasured_trials": sum(n for r in rows if not measured(r) for *_, n in r["trials"]),
        "workers": workers if shared else 1,
        "wall_s": max(total / workers, longest) if shared else total,
        "longest_trial_s": longest,
    }


# --- the report ---------------------------------------------------------------------------------------------


def _num(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


def _pct(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


def _mfu(flops_per_s: float, peak: float | None) -> str:
    return _pct(flops_per_s / peak) if peak else "n/a"


def render(report: dict[str, Any]) -> str:
    """The Markdown report of ``report`` (the JSON file's content: ``runs`` and ``presets``)."""
    from benchmarks.training.flops import device_peaks

    runs = report["runs"]
    device = runs[0]["device"]
    peaks = device_peaks(device)
    peak_text = (
        f"dense peaks {peaks.bf16 / 1e12:,.0f} (bfloat16), {peaks.tf32 / 1e12:,.0f} (TF32), "
        f"{peaks.fp32 / 1e12:,.0f} (float32) TFLOP/s"
        if peaks
        else "no known peak: MFU n/a"
    )
    lines = [
        "# Training throughput and MFU of the presets",
        "",
        'Generated by `benchmarks/training/mfu.py` (docs/performance.md, "MFU"); do not edit by hand.',
        "",
        f"- device: {device} ({peak_text})",
    ]
    for k, run in enumerate(runs, 1):
        measured = [name for name, data in report["presets"].items() if data["run"] == k - 1]
        lines.append(
            f"- run {k}: {', '.join(measured)}; {run['date']}, commit {run['commit']}; torch {run['torch']}, "
            f"triton {run['triton']}, lightning {run['lightning']}, python {run['python']}; one trial of "
            f"{run['steps']:,} steps per cell alone"
            + (f", length-bucketed batches (pools of {run['length_bucketing']})" if run.get("length_bucketing") else "")
            + (f", batches of {run['batch_size']:,} sequences" if run.get("batch_size") else "")
            + (f", every model in {run['precision']}" if run.get("precision") else "")
            + (
                f", {run['workers']} workers{' under MPS' if run['mps'] else ''} with trials sized for about "
                f"{run['worker_seconds']:g} s of training together"
                if run["workers"]
                else ""
            )
            + f": `{run['command']}`"
        )
    lines += [
        "",
        "GFLOP/step: the model FLOPs of one training step (forward, loss and backward of the padded batch; matrix "
        "products only, `FlopCounterMode`). Tokens per step: real (non-padding) and padded (batch x the longest "
        "training length, the width of every training batch). Alone: one trial's training steps/s on the device, "
        "its model TFLOP/s, and MFU against the dense bfloat16 and float32 peaks. With N workers: each trial's "
        "steady steps/s while all train. Phase shares: of one full trial of the preset's step budget, projected "
        "from the short trial (set-up, warm-up, stalls, the test passes and other once; training steps and host "
        "per step; validations at the preset's interval). Stalls: training batches slower per step than 5x the "
        "median batch (a kernel autotuned or compiled after the first batch), their time beyond the median's. "
        "Host: the training loop's time between batches; the loop's time around a validation (checkpoints, the "
        "Newton mixers' Jacobian check) counts with the validation; other: the trainer's start and tear-down.",
    ]
    for preset, data in report["presets"].items():
        lines += ["", f"## {preset}", ""]
        lines += _preset_lines(data, runs[data["run"]]["workers"], peaks)
    return "\n".join(lines) + "\n"


def _preset_lines(data: dict[str, Any], workers: int, peaks) -> list[str]:
    """One preset's section of the report: its rate together, the cells' rates and their phases."""
    from benchmarks.training.phases import PHASES

    rows = [r for r in data["cells"] if "error" not in r]
    lines = []
    together = data.get("together")
    end_to_end = _num((together or {}).get("end_to_end_real_tokens_per_s", float("nan")))
    if together and "error" in together:
        lines += [f"The {workers} workers' run failed: {together['error']}", ""]
    elif together and together["window_s"] > 0:
        padding = 1 - together["real_tokens_per_s"] / together["padded_tokens_per_s"]
        lines += [
            f"All {workers} workers together ({len(together['waves'])} wave(s) of trials, {together['window_s']:.1f} s "
            f"in which all of a wave trained): **{_num(together['real_tokens_per_s'])} real tokens/s** "
            f"({_num(together['padded_tokens_per_s'])} padded: {_pct(padding)} padding), "
            f"{_num(together['steps_per_s'])} steps/s, {_num(together['flops_per_s'] / 1e12, 3)} TFLOP/s"
            + (
                f": MFU {_mfu(together['flops_per_s'], peaks.bf16)} of bfloat16, "
                f"{_mfu(together['flops_per_s'], peaks.fp32)} of float32; GPU busy {_pct(together['gpu_busy'])}."
                if peaks
                else "."
            )
            + f" End to end (worker start-up, compilation and test passes included): {end_to_end} real tokens/s.",
            "",
        ]
    elif workers and together:
        lines += [
            f"The {workers} workers' trials had no window in which all of a wave trained; end to end (worker start-up, "
            f"compilation and test passes included): {end_to_end} real tokens/s.",
            "",
        ]
    projection = preset_projection(data["cells"], workers)
    if projection and projection["trials"]:
        p = projection
        how = (
            f"with {p['workers']} workers (each trial's full time slowed as its cell's steps/s with the workers "
            "against alone, shared evenly over the workers)"
            if p["workers"] > 1
            else "trial after trial on one process"
        )
        sweeps = list(dict.fromkeys(e for r in data["cells"] for e in r["entries"]))
        lines += [
            f"Projected wall time of the trials of sweeps {', '.join(sweeps)}: {p['trials']:,} trials, "
            f"{p['steps'] / 1e6:.2f}M training steps at most (no early stop), **{p['wall_s'] / 60:.1f} min** {how}; "
            f"the longest trial {p['longest_trial_s'] / 60:.1f} min."
            + (
                f" {p['unmeasured_trials']:,} trials of cells that did not run are left out."
                if p["unmeasured_trials"]
                else ""
            ),
            "",
        ]
    head = (
        "| sweeps | mixer | layers | params | engine | batch x length (real mean: padding) | GFLOP/step "
        "| alone: steps/s | real tokens/s | padded tokens/s | TFLOP/s | MFU bf16 | MFU fp32 |"
    )
    head += f" {workers} workers: steps/s each |" if workers else ""
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        rate = r["steps_per_s"]
        flops_s = r["flops"] * rate
        cells = [
            ", ".join(r["entries"]),
            r["mixer"],
            str(r["layers"]),
            _num(r["n_params"]),
            r["engine"],
            f"{r['batch']} x {r['padded_len']:.4g} ({r['real_len']:.1f}: {_pct(1 - r['real_len'] / r['padded_len'])})",
            _num(r["flops"] / 1e9, 2),
            _num(rate),
            _num(rate * r["batch"] * r["real_len"]),
            _num(rate * r["batch"] * r["padded_len"]),
            _num(flops_s / 1e12, 3),
            _mfu(flops_s, peaks and peaks.bf16),
            _mfu(flops_s, peaks and peaks.fp32),
        ]
        cells += [_num(r.get("with_workers_steps_per_s", float("nan")))] if workers else []
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| sweeps | mixer | layers | set-up s | warm-up s | stalls s (batches) | µs per step | s per validation "
        "| test s | host µs per step | full trial s | " + " | ".join(f"{p} share" for p in PHASES) + " |",
        "|" + "---|" * (11 + len(PHASES)),
    ]
    for r in rows:
        p = r["phases"]
        cells = [
            ", ".join(r["entries"]),
            r["mixer"],
            str(r["layers"]),
            _num(p["setup_s"], 1),
            _num(p["warmup_s"], 1),
            f"{_num(p.get('stall_s', 0.0), 1)} ({p.get('stalls', 0)})",
            _num(1e6 * p["train_s"] / max(p["steps"], 1)),
            _num(p["validation_s"] / p["validations"], 2) if p["validations"] else "n/a",
            _num(p["test_s"], 1),
            _num(1e6 * p["host_s"] / max(p["steps"], 1)),
            _num(r["full_trial_s"]["total"]),
            *(_pct(r["shares"].get(k, 0.0)) for k in PHASES),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in data["cells"] if "error" in r]
    if failed:
        lines += ["", "Cells that did not run:", ""]
        lines += [f"- {', '.join(r['entries'])} / {r['mixer']} ({r['layers']} layers): {r['error']}" for r in failed]
    uncounted_cells = [
        f"- FLOPs of {', '.join(r['entries'])} / {r['mixer']} ({r['layers']} layers) not counted: {r['flops_error']}"
        for r in rows
        if "flops_error" in r
    ]
    lines += [""] + uncounted_cells if uncounted_cells else []
    uncounted = sorted({op for r in rows for op in r.get("uncounted_ops", [])})
    if uncounted:
        lines += ["", "Custom operators whose FLOPs the count leaves out: " + ", ".join(f"`{o}`" for o in uncounted)]
    return lines


def merged(old: dict[str, Any] | None, run: dict[str, Any], presets: dict[str, Any]) -> dict[str, Any]:
    """The report of ``old`` (a report of the same device; ``None``: none) with ``presets`` measured in ``run``
    added or replacing its own; runs no preset refers to any more are dropped."""
    if old is None:
        return {"runs": [run], "presets": {name: {**data, "run": 0} for name, data in presets.items()}}
    if old["runs"][0]["device"] != run["device"]:
        raise ValueError(f"--merge: the report was measured on {old['runs'][0]['device']}, this run on {run['device']}")
    kept = {name: data for name, data in old["presets"].items() if name not in presets}
    used = sorted({data["run"] for data in kept.values()})
    runs = [old["runs"][k] for k in used] + [run]
    renumber = {k: i for i, k in enumerate(used)}
    out = {name: {**data, "run": renumber[data["run"]]} for name, data in kept.items()}
    out.update({name: {**data, "run": len(runs) - 1} for name, data in presets.items()})
    return {"runs": runs, "presets": out}


def parser() -> Parser:
    p = Parser(prog="python -m benchmarks.training.mfu", description=__doc__)
    p.add_argument("presets", nargs="+", help="presets to measure (e.g. grazzi-table3 state-tracking)")
    p.add_argument("--workers", type=nonnegative_int, default=0, help="worker processes training together (0: none)")
    p.add_argument("--steps", type=positive_int, help="training steps of each alone trial (default: 2000; --quick: 6)")
    p.add_argument(
        "--worker-seconds",
        type=float,
        default=20.0,
        help="size each worker trial for about this many seconds of training together (default: %(default)s)",
    )
    p.add_argument(
        "--length-bucketing",
        type=nonnegative_int,
        default=0,
        help="train every cell on length-bucketed batches in pools of this many (train.length_bucketing); "
        "default 0: as the presets train",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        help="train every cell on batches of this many sequences instead of the preset's (train.batch_size); "
        "the report names the preset 'PRESET (batch N)', so --merge keeps the preset's own rows beside it",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="train every cell in this precision instead of the preset's (bf16-mixed: the projections on "
        "tensor cores); the report names the preset 'PRESET (bf16-mixed)'",
    )
    p.add_argument("--tasks", type=str_list, help="only these sweeps (entries) of each preset")
    p.add_argument("--mixers", type=str_list, help="only these mixers")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown report; the JSON goes beside it")
    p.add_argument(
        "--scratch", type=Path, default=Path("runs/bench-mfu"), help="the worker runs' folder (default: %(default)s)"
    )
    p.add_argument("--quick", action="store_true", help="a few steps on the CPU with small data sets (tests)")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other presets of the report at --out (measured on the same device) and add or replace these",
    )
    from experiments.engines.mps import add_mps_argument

    add_mps_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.steps is None:
        args.steps = 6 if args.quick else 2000

    def run() -> None:
        import torch

        from experiments.engines.mps import workers_mps
        from experiments.sweeps.presets import available_presets
        from experiments.sweeps.results import versions
        from experiments.trial.train import quiet_lightning

        unknown = [p for p in args.presets if p not in available_presets()]
        if unknown:
            raise ValueError(f"unknown preset(s) {', '.join(unknown)}; available: {', '.join(available_presets())}")
        if args.quick and args.mps:
            raise ValueError("--quick runs on the CPU: --mps does not apply")
        if not args.worker_seconds > 0:
            raise ValueError(f"--worker-seconds must be > 0, got {args.worker_seconds}")
        quiet_lightning()
        device = "cpu" if args.quick else "auto"
        cells = {p: representative_cells(p, args.tasks, args.mixers, device) for p in args.presets}
        data_file = args.out.with_suffix(".json")
        old = json.loads(data_file.read_text()) if args.merge and data_file.is_file() else None
        # MPS before this process's first CUDA call (the device's name): a context from before would not use it
        with workers_mps(args.mps, args.workers):
            run_meta = {
                "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.quick else "cpu",
                **versions(),
                "date": time.strftime("%Y-%m-%d", time.gmtime()),
                "command": "python -m benchmarks.training.mfu " + " ".join(argv if argv is not None else sys.argv[1:]),
                "steps": args.steps,
                "workers": args.workers,
                "worker_seconds": args.worker_seconds,
                "mps": bool(args.mps),
                "length_bucketing": args.length_bucketing,
                "batch_size": args.batch_size,
                "precision": args.precision,
            }
            if old is not None:
                merged(old, run_meta, {})  # a report of another device: the error now, before measuring
            presets: dict[str, Any] = {}

            def save(name: str, result: dict[str, Any]) -> None:
                presets[name] = result
                report = merged(old, run_meta, presets)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                data_file.write_text(json.dumps(report, indent=1, default=float))
                args.out.write_text(render(report))

            # the report rewritten after each preset's cells and after its workers: a cut run keeps them
            for preset, preset_cells in cells.items():
                train = {"length_bucketing": args.length_bucketing, "batch_size": args.batch_size}
                preset_cells = with_options(preset_cells, train, {"precision": args.precision})
                name = report_name(preset, args.batch_size, args.length_bucketing, args.precision)
                save(name, measure_preset(preset, preset_cells, args, functools.partial(save, name)))
        print(args.out.read_text())

    return run_cli(run, "nothing to resume: re-run the measurement")


if __name__ == "__main__":
    sys.exit(main())
