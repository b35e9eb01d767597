"""``python -m experiments.sweep TASK``: mixers × seeds × learning rates as Optuna trials (SPEC §8.2).

Re-running the same command resumes: finished cells are kept, interrupted ones re-run, nothing runs
twice. ``--workers N`` runs N worker processes (``experiments.workers``); ``--storage
postgresql://...`` lets workers on several machines share one study (``experiments.study``).
Results: ``<out>/results.csv`` and ``<out>/table.md``; per trial in ``<out>/trials/<n>-<cell>/``:
``metrics.csv`` (the step log), ``spec.json``, ``run.json`` (worker, device, versions) and the final
weights ``model.pt`` (load with ``experiments.sweep.load_trained``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml

from experiments.cli import run_cli
from experiments.lit import NonFiniteLossError
from experiments.mps import add_mps_argument, workers_mps
from experiments.presets import SweepPlan, available_presets, resolve_sweep
from experiments.results import collect, versions, write_results
from experiments.study import (
    HEARTBEAT_DIR,
    STALE_TIMEOUT,
    cell_id,
    finish,
    open_storage,
    open_study,
    sync_grid,
)
from experiments.study import progress as progress_counts
from experiments.train import TrialSpec, quiet_lightning, run_trial
from tasks import TASKS

log = logging.getLogger("experiments.sweep")


def build_specs(plan: SweepPlan, device: str = "auto") -> list[TrialSpec]:
    """The grid: one ``TrialSpec`` per (mixer, seed, lr), in that nesting order."""
    return [
        TrialSpec(
            task=plan.task, mixer=mixer, lr=lr, seed=seed, task_options=plan.task_options,
            mixer_options=plan.mixer_options.get(mixer, {}), block=plan.block, positional=plan.positional,
            extrapolation=plan.extrapolation, train=plan.train, device=device,
        )
        for mixer in plan.mixers for seed in plan.seeds for lr in plan.lrs
    ]


def validate_specs(specs: list[TrialSpec]) -> None:
    """Build each distinct model once so configuration errors surface before any training."""
    from experiments.train import build_datamodule, build_module

    seen = set()
    for spec in specs:
        key = (spec.mixer, repr(sorted(spec.mixer_options.items())))
        if key in seen:
            continue
        seen.add(key)
        dm = build_datamodule(spec)
        try:
            build_module(spec, dm)
        except (ValueError, TypeError) as err:
            raise ValueError(f"mixer {spec.mixer!r} with options {spec.mixer_options}: {err}") from None


def trial_dir(out: Path, number: int, spec: TrialSpec) -> Path:
    return out / "trials" / f"{number:04d}-{spec.mixer.replace(':', '.')}-s{spec.seed}-lr{spec.lr:g}"


def run_one(study, trial, out: Path, device: str | None = None) -> str:
    """Run a claimed trial and record its outcome; returns ``"ok"``, ``"nan"``, ``"error"`` or ``"lost"``.

    ``device`` (a worker's GPU) replaces the spec's ``"auto"``/``"cuda"``; the cell stays the same.
    Writes ``<trial dir>/run.json`` (worker, device, library versions) beside ``run_trial``'s
    ``metrics.csv``, ``spec.json`` and ``model.pt``. ``"lost"``: the trial was finished elsewhere
    meanwhile (declared stale while this worker hung); its cell was re-queued.
    """
    from experiments.results import atomic_write_text
    from experiments.study import _worker_identity

    spec = TrialSpec.from_dict(trial.user_attrs["spec"])
    if device and spec.device in ("auto", "cuda"):
        spec.device = device
    tdir = trial_dir(out, trial.number, spec)
    tdir.mkdir(parents=True, exist_ok=True)
    run_info = {"trial": trial.number, "cell": trial.user_attrs["cell"], "device": spec.device,
                "worker": _worker_identity(), "versions": versions()}
    try:
        result = run_trial(spec, tdir)
    except NonFiniteLossError as err:
        return "nan" if finish(study, trial, None, failure="nan", error=str(err)) else "lost"
    except KeyboardInterrupt:
        finish(study, trial, None, failure="interrupted", error="KeyboardInterrupt")
        raise
    except Exception as err:  # a kernel error etc.: the trial fails, the sweep goes on
        (tdir / "error.txt").write_text(traceback.format_exc())
        ok = finish(study, trial, None, failure="error", error=f"{type(err).__name__}: {err}")
        return "error" if ok else "lost"
    finally:  # after run_trial: Lightning's CSV logger warns about a non-empty folder
        atomic_write_text(tdir / "run.json", json.dumps(run_info, indent=1))
    result = {**result, **run_info["versions"]}  # the versions this trial ran with (the table shows them)
    return "ok" if finish(study, trial, result) else "lost"


def load_trained(trial_folder: str | Path):
    """The trained model of a finished trial folder: ``(SingleLayerModel, TrialSpec)`` (on the CPU)."""
    import torch

    from experiments.train import build_datamodule, build_module

    folder = Path(trial_folder)
    spec = TrialSpec.from_dict(json.loads((folder / "spec.json").read_text()))
    dm = build_datamodule(spec)
    model = build_module(spec, dm).model
    model.load_state_dict(torch.load(folder / "model.pt", map_location="cpu", weights_only=True))
    return model.eval(), spec


def study_name(plan: SweepPlan) -> str:
    return f"{plan.entry or plan.task}-{plan.preset}"


def run_sweep(plan: SweepPlan, out: Path, storage_url: str | None = None, device: str = "auto",
              retry_failed: bool = False, progress: bool = True, workers: int = 0,
              stale_timeout: float = STALE_TIMEOUT):
    """Run (or resume) the sweep; returns the results ``DataFrame``.

    ``workers=0`` runs the trials in this process; ``workers=N`` in N worker processes
    (``experiments.workers``). Stale trials of dead workers are re-run (``stale_timeout`` seconds
    without a heartbeat, or at once for a dead process of this host).
    """
    from experiments.workers import run_workers, worker_loop

    specs = build_specs(plan, device)
    validate_specs(specs)
    study = open_study(open_storage(storage_url, out, stale_timeout), study_name(plan))
    counts = sync_grid(study, specs, retry_failed=retry_failed, heartbeat_dir=out / HEARTBEAT_DIR,
                       stale_timeout=stale_timeout)
    log.info("%s: %d cells (%d done, %d queued, %d pending elsewhere, %d interrupted and re-queued)",
             study.study_name, len(specs), counts["done"], counts["queued"], counts["pending"], counts["stale"])
    cells = list(dict.fromkeys(cell_id(s) for s in specs))  # grid order
    meta = versions()

    def write() -> None:
        write_results(collect(study, cells, meta), out)

    label = f"{plan.entry or plan.task} sweep"
    if workers:
        run_workers(study, specs, out, storage_url, workers, device, stale_timeout=stale_timeout,
                    progress=progress, label=label, on_progress=write)
        df = collect(study, cells, meta)
        write_results(df, out)
        return df

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task_id = bar.add_task(label, total=len(specs), completed=counts["done"])

        def claimed(p: dict) -> None:
            bar.update(task_id, description=f"{plan.entry or plan.task}: {p['mixer']} seed={p['seed']} lr={p['lr']:g}")

        def finished(p: dict, outcome: str) -> None:
            if outcome != "ok":
                log.warning("trial (%s seed=%s lr=%g) failed: %s", p["mixer"], p["seed"], p["lr"], outcome)
            write()
            bar.update(task_id, completed=progress_counts(study, cells)["done"])

        dev = None if device == "auto" else device
        worker_loop(study, specs, out, device=dev, stale_timeout=stale_timeout, on_trial=finished, on_claim=claimed)
    df = collect(study, cells, meta)
    write_results(df, out)
    return df


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}") from None
    return parse


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def preset_entries(preset: str) -> list[str]:
    """The sweep entries (``tasks:`` keys) of ``preset``; ``[]`` if it does not exist."""
    from experiments.presets import load_preset

    try:
        return list(load_preset(preset).get("tasks", {}))
    except ValueError:
        return []


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.sweep",
        description="Train single-layer models for every (mixer, seed, learning rate) of a preset on one task, "
                    "as Optuna trials; print and write the accuracy table. Re-running the same command resumes.",
        epilog=f"Tasks: {', '.join(sorted(TASKS))}. Presets: {', '.join(available_presets())} "
               "(files in experiments/presets/). Mixers: any registered name (see mixers.MIXERS) or "
               "'module.path:CellClass' for your own RNNCell. Example: python -m experiments.sweep parity --preset smoke",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", help=f"one of: {', '.join(sorted(TASKS))}, or a sweep entry of --preset (e.g. khop2)")
    p.add_argument("--preset", default="default", help="named configuration (default: %(default)s, the paper's setup)")
    p.add_argument("--mixers", type=_csv(str), help="comma-separated mixers, overriding the preset's")
    p.add_argument("--seeds", type=_csv(int), help="comma-separated seeds, e.g. 0,1,2")
    p.add_argument("--lrs", type=_csv(float), help="comma-separated learning rates, e.g. 1e-3,3e-4")
    p.add_argument("--max-steps", type=int, help="training step budget per trial")
    p.add_argument("--task-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="override a task option (repeatable), e.g. --task-option seq_len=64")
    p.add_argument("--out", type=Path, help="output folder (default: runs/<task>-<preset>)")
    p.add_argument("--storage", help="Optuna storage URL shared by workers (postgresql://...); "
                                     "default: a JournalStorage file in the output folder")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="run trials in N worker processes on this machine (spread over the visible GPUs, "
                        "several per GPU; on a CPU one thread each); 0 (default): in this process")
    p.add_argument("--stale-timeout", type=float, default=STALE_TIMEOUT, metavar="S",
                   help="seconds without a heartbeat after which another worker's RUNNING trial counts as "
                        "dead and its cell is re-run (a dead process on this host is detected at once; "
                        "default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--retry-failed", action="store_true", help="re-run cells whose trial failed (NaN, errors)")
    add_mps_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_lightning()

    def run() -> None:
        if args.task not in TASKS and args.task not in preset_entries(args.preset):
            raise ValueError(f"unknown task {args.task!r}; known tasks: {', '.join(sorted(TASKS))}")
        if args.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {args.workers}")
        train_over = {"max_steps": args.max_steps} if args.max_steps else None
        overrides = {"mixers": args.mixers, "seeds": args.seeds, "lrs": args.lrs, "train": train_over,
                     "task_options": dict(args.task_option) or None}
        plan = resolve_sweep(args.task, args.preset, overrides)
        out = args.out or Path("runs") / f"{args.task}-{args.preset}"
        with workers_mps(args.mps, args.workers):
            df = run_sweep(plan, out, args.storage, args.device, args.retry_failed, progress=not args.no_progress,
                           workers=args.workers, stale_timeout=args.stale_timeout)
        print((out / "table.md").read_text())
        print(f"results: {out / 'results.csv'} ({len(df)} trials)")

    return run_cli(run, "re-run the same command to resume")


if __name__ == "__main__":
    sys.exit(main())
