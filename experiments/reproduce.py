"""``python -m experiments.reproduce NAME``: run a paper table's sweeps and compare with the paper.

NAME is a reproduction preset (a preset file with a ``paper:`` section holding the paper's numbers;
``experiments.paper``). All sweeps of the table share one study (one journal file in ``--out``), so
``--workers N`` keeps N workers busy across the whole table, and re-running the command resumes
(finished cells are kept; interrupted ones continue from their last checkpoint).

Every reproduction shares one study in ``--out`` (default ``runs/reproduce``), so presets with
identical cells (pararnn-table1 within pararnn-table6) share their trials. Writes
``<out>/<NAME>/<entry>/results.csv`` and ``table.md`` per sweep, and ``<out>/<NAME>/reproduction.md``
(+ ``reproduction.csv``): our numbers next to the paper's, with parameter counts, the budget and the
device. ``--quick`` shrinks everything (one seed, at most two learning rates and depths, width 32 at
most, short sequences, a few hundred steps; plus the preset's ``quick:`` overrides) to check the
pipeline on a CPU; its numbers are not a reproduction.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.claims import claims_lines
from experiments.cli import (
    Parser,
    add_run_arguments,
    check_run_arguments,
    int_list,
    positive_int,
    str_list,
    sweep_options,
    training_main,
)
from experiments.paper import compare, comparison_markdown, load_reproduction, reproduction_presets
from experiments.sweeps.runner import SweepOptions, run_plans

log = logging.getLogger("experiments.reproduce")

#: the --quick overrides: minutes on a CPU (not a reproduction)
QUICK_TRAIN = {
    "max_steps": 300,
    "batch_size": 32,
    "train_size": 2000,
    "val_size": 300,
    "test_size": 1000,
    "eval_every": 100,
}
QUICK_SEQ_LEN = 32
QUICK_D_MODEL = 32
#: --quick trains on lengths up to 16 and tests at lengths up to 32 (each sweep's own, capped)
QUICK_MAX_LEN, QUICK_EVAL_LEN = 16, 32


def quick_extrapolation(extrapolation: dict[str, Any]) -> dict[str, Any]:
    """A sweep's length-extrapolation setting cut to ``--quick`` size: training lengths capped at
    ``QUICK_MAX_LEN``, test lengths (and a ``test_range``, a ``val_range``) at ``QUICK_EVAL_LEN``, so sweeps that differ in
    length (one per length k) stay distinct cells with their own ``len<k>`` metrics."""
    from tasks.extrapolation import ExtrapolationConfig

    full = ExtrapolationConfig(**extrapolation)  # the defaults of what the sweep leaves out
    max_len = min(full.max_len, QUICK_MAX_LEN)
    quick = {
        "min_len": min(full.min_len, max_len),
        "max_len": max_len,
        "eval_lengths": sorted({min(n, QUICK_EVAL_LEN) for n in full.eval_lengths}),
    }
    for name in ("test_range", "val_range"):  # capped the same way: from at most max_len to at most QUICK_EVAL_LEN
        bounds = getattr(full, name)
        if bounds is not None:
            high = min(bounds[1], QUICK_EVAL_LEN)
            quick[name] = [min(bounds[0], max_len, high), high]
    return quick


def plans_for(name: str, quick: bool = False, overrides: dict[str, Any] | None = None) -> list:
    """One ``SweepPlan`` per sweep entry of the preset, with ``--quick`` and CLI overrides applied."""
    from experiments.sweeps.presets import resolve_sweep

    data = load_reproduction(name)
    plans = []
    for entry in data.get("tasks", {}):
        over: dict[str, Any] = {}
        if quick:
            base = resolve_sweep(entry, name)
            over = {
                "seeds": [0],
                "train": dict(QUICK_TRAIN),
                "lrs": base.lrs[:2],
                "layers": base.layers[:2],
                "d_model": min(base.model.d_model, QUICK_D_MODEL),
            }
            if base.extrapolation:
                over["extrapolation"] = quick_extrapolation(base.extrapolation)
            else:
                over["task_options"] = {"seq_len": QUICK_SEQ_LEN}
            for key, value in (data.get("quick") or {}).items():  # the preset's own quick form
                over[key] = {**over.get(key, {}), **value} if isinstance(value, dict) else value
        for key, value in (overrides or {}).items():
            if value is not None:
                over[key] = {**over.get(key, {}), **value} if isinstance(value, dict) else value
        plans.append(resolve_sweep(entry, name, over))
    return plans


def devices_used(results: pd.DataFrame) -> str:
    """The devices the finished trials ran on (failed or interrupted trials have none)."""
    return ", ".join(_distinct(results, "device")) or "none yet"


def trial_versions(results: pd.DataFrame) -> str:
    """The library versions and commits the finished trials recorded (several values joined by '/');
    failed trials recorded none, and their rows in results written by earlier versions carry the
    reporting process's, so only ``ok`` rows count."""
    ok = results[results["status"] == "ok"] if "status" in results else results
    parts = []
    for key in ("torch", "lightning", "python", "triton", "commit"):
        values = _distinct(ok, key)
        if values:
            parts.append(f"{key} {'/'.join(values)}")
    return ", ".join(parts)


def scheduled_minutes(results: pd.DataFrame, workers: int) -> float:
    """Minutes one uninterrupted run would take on ``workers`` workers with the measured trial times.

    ``results``: one row per trial, in the order trials are claimed, with ``wall_time_s`` (s; a resumed
    trial's covers its last invocation only, so it is scaled to the whole trial by ``steps /
    (steps - resumed_from_step)``). Each trial goes to the worker that frees first; NaN if no trial has a time.
    """
    if "wall_time_s" not in results or results["wall_time_s"].isna().all():
        return float("nan")
    seconds = results["wall_time_s"].astype(float)
    if {"steps", "resumed_from_step"} <= set(results.columns):
        trained = results["steps"] - results["resumed_from_step"].fillna(0)
        seconds = seconds * (results["steps"] / trained.where(trained > 0)).fillna(1.0)
    free_at = [0.0] * max(1, workers)  # a heap: the worker that frees first on top
    for s in seconds.dropna():
        heapq.heapreplace(free_at, free_at[0] + s)
    return max(free_at) / 60


def _distinct(results: pd.DataFrame, column: str) -> list[str]:
    """The column's distinct recorded values (empty when absent or never recorded), sorted."""
    return sorted(set(results[column].dropna().astype(str))) if column in results else []


def _lrs(lrs: list[float]) -> str:
    return "/".join(f"{lr:g}" for lr in lrs)


def run_reproduction(
    name: str,
    out: Path,
    options: SweepOptions = SweepOptions(),
    *,
    quick: bool = False,
    overrides: dict[str, Any] | None = None,
    entries: list[str] | None = None,
    mixers: list[str] | None = None,
    run: bool = True,
) -> pd.DataFrame:
    """Run (resume) the table's sweeps in one study as ``options`` says, write the per-sweep results and
    the comparison. ``quick``: the CPU-sized form; ``overrides``: of every sweep's plan (``resolve_sweep``);
    ``entries``: only these sweeps; ``mixers``: only these rows (mixers as the preset names them; a sweep
    without any of them is left out); ``run=False``: tabulate what has finished."""
    from experiments.sweeps.results import atomic_write_text

    plans = plans_for(name, quick, overrides)
    if entries:
        unknown = set(entries) - {p.entry for p in plans}
        if unknown:
            raise ValueError(
                f"unknown sweep(s) {', '.join(sorted(unknown))} in {name}; valid: {', '.join(p.entry for p in plans)}"
            )
        plans = [p for p in plans if p.entry in entries]
    if mixers:
        valid = dict.fromkeys(m for p in plans for m in p.mixers)
        unknown = set(mixers) - valid.keys()
        if unknown:
            raise ValueError(f"unknown mixer(s) {', '.join(sorted(unknown))} in {name}; valid: {', '.join(valid)}")
        plans = [dataclasses.replace(p, mixers=[m for m in p.mixers if m in mixers]) for p in plans]
        plans = [p for p in plans if p.mixers]
    # one study for every reproduction: presets with identical cells (table1 within table6) share trials
    report = out / name
    results, info = run_plans(
        plans, out, "reproduce" + ("-quick" if quick else ""), options, run=run, label=name, results_dir=report
    )
    table = compare(name, results, {p.entry: list(p.mixers) for p in plans})
    frames = [df for df in results.values() if len(df)]
    every = pd.concat(frames) if frames else pd.DataFrame()
    data = load_reproduction(name)
    train = plans[0].train
    # a full run is laid on the preset's budget of workers; a quick check on the workers it ran with
    workers = options.workers
    scheduled_workers = int((not quick and data.get("budget", {}).get("workers")) or workers or 1)
    meta = {
        "device": devices_used(every),
        "date": time.strftime("%Y-%m-%d"),
        "workers": workers or 1,
        "ran": run,
        "wall_min": info["wall_s"] / 60,
        "busy_min": info["busy_s"] / 60,
        "check_min": info["checks"][0] / 60,
        "checks": info["checks"][1],
        "trial_min": float(every["wall_time_s"].sum()) / 60 if "wall_time_s" in every else float("nan"),
        "scheduled_min": scheduled_minutes(every, scheduled_workers),
        "scheduled_workers": scheduled_workers,
        "resumed": int((every["resumed_from_step"] > 0).sum()) if "resumed_from_step" in every else 0,
        "budget": (
            f"max_steps per trial {', '.join(f'{p.entry} {p.train.max_steps}' for p in plans)} "
            f"(lr {', '.join(f'{p.entry} {_lrs(p.lrs)}' for p in plans)}), batch {train.batch_size}, {train.train_size} train / "
            f"{train.test_size} test sequences, "
            + (f"early stop at val acc > {train.early_stop_acc}" if train.early_stop_acc < 1 else "no early stop")
            + (" — QUICK (CPU smoke check, not a reproduction)" if quick else "")
            + (
                "; preset budget: " + ", ".join(f"{k} {v}" for k, v in data["budget"].items())
                if data.get("budget")
                else ""
            )
        ),
        "done": info["done"],
        "cells": info["cells"],
        "versions": trial_versions(every) or ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        "claims": claims_lines(name, every),
    }
    atomic_write_text(report / "reproduction.md", comparison_markdown(name, table, meta))
    atomic_write_text(report / "reproduction.csv", table.to_csv(index=False))
    return table


def parser() -> Parser:
    p = Parser(
        prog="python -m experiments.reproduce",
        description="Run the sweeps of a paper table (resuming) and write it with the paper's numbers side by side.",
        epilog=f"Tables: {', '.join(reproduction_presets())} (experiments/presets/<NAME>.yaml; each says how it departs "
        "from the paper). Example: python -m experiments.reproduce pararnn-table6 --workers 16 --mps; "
        "on a CPU: python -m experiments.reproduce pararnn-table6 --quick --workers 2",
    )
    p.add_argument("name", help=f"one of: {', '.join(reproduction_presets())}")
    p.add_argument(
        "--out",
        type=Path,
        help="output folder shared by the reproductions (default: runs/reproduce, "
        "runs/reproduce-quick with --quick); NAME's report in OUT/NAME/",
    )
    p.add_argument(
        "--quick", action="store_true", help="a CPU-sized smoke version (1 seed, short sequences, 300 steps)"
    )
    p.add_argument("--only", type=str_list, help="comma-separated sweeps of the table to run (e.g. parity,mqar)")
    p.add_argument(
        "--mixers",
        type=str_list,
        help="comma-separated rows of the table to run, as the preset names them (e.g. pd_ssm)",
    )
    p.add_argument("--max-steps", type=positive_int, help="override the step budget per trial")
    p.add_argument("--seeds", type=int_list, help="override the seeds, e.g. 0")
    p.add_argument(
        "--table-only", action="store_true", help="do not train: write the comparison from what has finished"
    )
    p.add_argument("--copy-to", type=Path, help="also copy reproduction.md here")
    add_run_arguments(p)
    return p


def run(args) -> None:
    """The reproduction of the parsed command line: run (or only tabulate) and print the comparison."""
    from experiments.engines.mps import workers_mps

    load_reproduction(args.name)
    overrides: dict[str, Any] = {}
    if args.max_steps:
        overrides["train"] = {"max_steps": args.max_steps}
    if args.seeds:
        overrides["seeds"] = args.seeds
    out = args.out or Path("runs") / ("reproduce-quick" if args.quick else "reproduce")
    check_run_arguments(args, out)
    with workers_mps(args.mps and not args.table_only, args.workers):
        run_reproduction(
            args.name,
            out,
            sweep_options(args, args.name),
            quick=args.quick,
            overrides=overrides,
            entries=args.only,
            mixers=args.mixers,
            run=not args.table_only,
        )
    report = out / args.name / "reproduction.md"
    text = report.read_text()
    print(text)
    print(f"report: {report}" + (f" (copied to {args.copy_to})" if args.copy_to else ""))
    if args.copy_to:
        args.copy_to.parent.mkdir(parents=True, exist_ok=True)
        args.copy_to.write_text(text)


def main(argv: list[str] | None = None) -> int:
    return training_main(parser(), argv, run)


if __name__ == "__main__":
    sys.exit(main())
