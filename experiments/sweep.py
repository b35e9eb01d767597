"""``python -m experiments.sweep TASK``: mixers × seeds × learning rates as Optuna trials (SPEC §8.2).

Re-running the same command resumes: finished cells are kept, interrupted ones re-run, nothing runs
twice. Results: ``<out>/results.csv`` and ``<out>/table.md``; per-trial logs and weights in
``<out>/trials/``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml

from experiments.presets import SweepPlan, available_presets, resolve_sweep
from experiments.results import collect, versions, write_results
from experiments.study import cell_id, claim_next, finish, open_storage, open_study, sync_grid
from experiments.lit import NonFiniteLossError
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


def run_one(study, trial, out: Path) -> str:
    """Run a claimed trial and record its outcome; returns ``"ok"``, ``"nan"`` or ``"error"``."""
    spec = TrialSpec.from_dict(trial.user_attrs["spec"])
    tdir = trial_dir(out, trial.number, spec)
    tdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run_trial(spec, tdir)
    except NonFiniteLossError as err:
        finish(study, trial, None, failure="nan", error=str(err))
        return "nan"
    except KeyboardInterrupt:
        finish(study, trial, None, failure="interrupted", error="KeyboardInterrupt")
        raise
    except Exception as err:  # a kernel error etc.: the trial fails, the sweep goes on
        (tdir / "error.txt").write_text(traceback.format_exc())
        finish(study, trial, None, failure="error", error=f"{type(err).__name__}: {err}")
        return "error"
    finish(study, trial, result)
    return "ok"


def run_sweep(plan: SweepPlan, out: Path, storage_url: str | None = None, device: str = "auto",
              retry_failed: bool = False, progress: bool = True):
    """Run (or resume) the sweep; returns the results ``DataFrame``."""
    specs = build_specs(plan, device)
    validate_specs(specs)
    study = open_study(open_storage(storage_url, out), f"{plan.task}-{plan.preset}")
    counts = sync_grid(study, specs, retry_failed=retry_failed)
    log.info("%s: %d cells (%d done, %d queued, %d pending elsewhere, %d interrupted and re-queued)",
             study.study_name, len(specs), counts["done"], counts["queued"], counts["pending"], counts["stale"])
    cells = list(dict.fromkeys(cell_id(s) for s in specs))  # grid order
    meta = versions()

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task_id = bar.add_task(f"{plan.task} sweep", total=len(specs), completed=counts["done"])
        while (trial := claim_next(study, set(cells))) is not None:
            p = trial.user_attrs["spec"]
            bar.update(task_id, description=f"{plan.task}: {p['mixer']} seed={p['seed']} lr={p['lr']:g}")
            outcome = run_one(study, trial, out)
            if outcome != "ok":
                log.warning("trial %d (%s seed=%s lr=%g) failed: %s", trial.number, p["mixer"], p["seed"], p["lr"],
                            study._storage.get_trial(trial._trial_id).user_attrs.get("error", outcome))
            write_results(collect(study, cells, meta), out)
            bar.advance(task_id)
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
    p.add_argument("task", help=f"one of: {', '.join(sorted(TASKS))}")
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
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--retry-failed", action="store_true", help="re-run cells whose trial failed (NaN, errors)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_lightning()
    try:
        if args.task not in TASKS:
            raise ValueError(f"unknown task {args.task!r}; known tasks: {', '.join(sorted(TASKS))}")
        train_over = {"max_steps": args.max_steps} if args.max_steps else None
        overrides = {"mixers": args.mixers, "seeds": args.seeds, "lrs": args.lrs, "train": train_over,
                     "task_options": dict(args.task_option) or None}
        plan = resolve_sweep(args.task, args.preset, overrides)
        out = args.out or Path("runs") / f"{args.task}-{args.preset}"
        df = run_sweep(plan, out, args.storage, args.device, args.retry_failed, progress=not args.no_progress)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: re-run the same command to resume", file=sys.stderr)
        return 130
    print((out / "table.md").read_text())
    print(f"results: {out / 'results.csv'} ({len(df)} trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
