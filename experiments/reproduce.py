"""``python -m experiments.reproduce NAME``: run a paper table's sweeps and compare (SPEC §8.5, §10).

NAME is a reproduction preset (``pararnn-table6``, ``pararnn-table1``, ``flashrnn-parity``): a
preset file with a ``paper:`` section holding the paper's numbers. All sweeps of the table share one
study (one journal file in ``--out``), so ``--workers N`` keeps N workers busy across the whole
table, and re-running the command resumes (finished cells are kept; interrupted ones re-run).

Writes ``<out>/<entry>/results.csv`` and ``table.md`` per sweep, and ``<out>/reproduction.md`` (+
``reproduction.csv``): our numbers next to the paper's, with parameter counts, the budget and the
device. ``--quick`` shrinks everything (one seed, short sequences, a few hundred steps) to check
the pipeline on a CPU; its numbers are not a reproduction.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.cli import run_cli

log = logging.getLogger("experiments.reproduce")

#: the --quick overrides: minutes on a CPU (not a reproduction)
QUICK_TRAIN = {"max_steps": 300, "batch_size": 32, "train_size": 2000, "val_size": 300, "test_size": 1000,
               "eval_every": 100}
QUICK_SEQ_LEN = 32
QUICK_EXTRAPOLATION = {"min_len": 3, "max_len": 16, "eval_lengths": [16, 32]}
#: an accuracy at or above this counts as "solved" when comparing with the paper
SOLVED = 0.98


def reproduction_presets() -> list[str]:
    from experiments.presets import available_presets, load_preset

    return [name for name in available_presets() if "paper" in load_preset(name)]


def load_reproduction(name: str) -> dict[str, Any]:
    from experiments.presets import load_preset

    known = reproduction_presets()
    if name not in known:
        raise ValueError(f"unknown reproduction {name!r}; known: {', '.join(known)}")
    return load_preset(name)


def plans_for(name: str, quick: bool = False, overrides: dict[str, Any] | None = None) -> list:
    """One ``SweepPlan`` per sweep entry of the preset, with ``--quick`` and CLI overrides applied."""
    from experiments.presets import resolve_sweep

    data = load_reproduction(name)
    plans = []
    for entry in data.get("tasks", {}):
        over: dict[str, Any] = {}
        if quick:
            base = resolve_sweep(entry, name)
            over = {"seeds": [0], "train": dict(QUICK_TRAIN), "lrs": base.lrs[:2]}
            if base.extrapolation:
                over["extrapolation"] = dict(QUICK_EXTRAPOLATION)
            else:
                over["task_options"] = {"seq_len": QUICK_SEQ_LEN}
        for key, value in (overrides or {}).items():
            if value is not None:
                over[key] = {**over.get(key, {}), **value} if isinstance(value, dict) else value
        plans.append(resolve_sweep(entry, name, over))
    return plans


def _aggregate(df: pd.DataFrame, metric: str, how: str) -> pd.DataFrame:
    """Per mixer: ``value`` (best over seeds, or mean at the best lr), ``std``, ``params``, ``seeds``, ``lr``."""
    from experiments.results import best_over_lrs

    rows = []
    ok = df[df["status"] == "ok"] if len(df) else df
    for mixer in dict.fromkeys(df["mixer"]) if len(df) else []:
        sel = ok[ok["mixer"] == mixer]
        if sel.empty or metric not in sel:
            rows.append({"mixer": mixer, "value": float("nan"), "std": float("nan"), "params": float("nan"),
                         "seeds": 0, "lr": float("nan"), "steps": float("nan"),
                         "failed": int((df[df["mixer"] == mixer]["status"] != "ok").sum())})
            continue
        if how == "mean_at_best_lr":
            by_lr = sel.groupby("lr")["best_val_acc"].mean()
            lr = float(by_lr.idxmax())
            chosen = sel[sel["lr"] == lr]
            value, std = chosen[metric].mean(), chosen[metric].std(ddof=0)
        else:  # best: per seed the lr with the best validation accuracy, then the best seed
            chosen = best_over_lrs(sel)
            value, std = chosen[metric].max(), chosen[metric].std(ddof=0)
            lr = float(chosen.loc[chosen[metric].idxmax(), "lr"])
        rows.append({"mixer": mixer, "value": float(value), "std": float(std), "params": int(chosen["n_params"].iloc[0]),
                     "seeds": int(chosen["seed"].nunique()), "lr": lr,
                     "steps": int(chosen["steps"].median()), "failed": int((df[df["mixer"] == mixer]["status"] != "ok").sum())})
    return pd.DataFrame(rows)


def compare(name: str, results: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Long table: one row per (entry, mixer) with ours and the paper's value and parameters."""
    paper = load_reproduction(name)["paper"]
    metric, how = paper.get("metric", "test/acc"), paper.get("aggregate", "best")
    rows = []
    for entry, df in results.items():
        ours = _aggregate(df, metric, how).set_index("mixer") if len(df) else pd.DataFrame()
        mixers = list(dict.fromkeys([*paper["results"], *(ours.index if len(ours) else [])]))
        for mixer in mixers:
            ref = (paper["results"].get(mixer) or {}).get(entry) or [float("nan")]
            r = ours.loc[mixer] if len(ours) and mixer in ours.index else None
            rows.append({
                "entry": entry, "mixer": mixer, "metric": metric,
                "ours": float(r["value"]) if r is not None else float("nan"),
                "ours_std": float(r["std"]) if r is not None else float("nan"),
                "ours_params": r["params"] if r is not None else float("nan"),
                "seeds": int(r["seeds"]) if r is not None else 0,
                "lr": r["lr"] if r is not None else float("nan"),
                "median_steps": r.get("steps", float("nan")) if r is not None else float("nan"),
                "failed": int(r.get("failed", 0)) if r is not None else 0,
                "paper": float(ref[0]),
                "paper_params": float(ref[1]) if len(ref) > 1 else float("nan"),
            })
    return pd.DataFrame(rows)


def _pct(x: float) -> str:
    return "–" if x != x else f"{100 * x:.0f}%" if x in (0.0, 1.0) else f"{100 * x:.1f}%"


def _k(n: float) -> str:
    return "" if n != n else f" ({n / 1000:.1f}k)"


def verdict(ours: float, paper: float) -> str:
    """``✓`` same side of the 98% line as the paper, ``✗`` paper solved it and we did not, ``↑`` the reverse."""
    if ours != ours or paper != paper:
        return ""
    if (ours >= SOLVED) == (paper >= SOLVED):
        return "✓"
    return "✗" if paper >= SOLVED else "↑"


def comparison_markdown(name: str, table: pd.DataFrame, meta: dict[str, Any]) -> str:
    """The Markdown report: a header (device, date, budget), the side-by-side table, notes."""
    data = load_reproduction(name)
    paper = data["paper"]
    columns = paper.get("columns", {})
    # the paper's column order (the preset may list its sweeps in another order, e.g. longest first)
    entries = sorted(dict.fromkeys(table["entry"]), key=lambda e: list(columns).index(e) if e in columns else len(columns))
    lines = [f"# Reproduction: {name}", "", f"Paper: {paper.get('source', '')}.", "",
             f"- Device: {meta.get('device', '?')}; date: {meta.get('date', '?')}; "
             + (f"workers: {meta.get('workers', '?')}; wall time of this invocation: {meta.get('wall_min', float('nan')):.1f} min; "
                if meta.get("ran", True) else "table written from stored results; ")
             + f"trials' own training+test time, summed: {meta.get('trial_min', float('nan')):.1f} min.",
             f"- Budget: {meta.get('budget', '')}",
             f"- Cells: {meta.get('done', '?')} of {meta.get('cells', '?')} finished; versions: {meta.get('versions', '')}.",
             "", f"Metric: `{paper.get('metric', 'test/acc')}`, "
             + ("best over seeds (per seed the lr with the best validation accuracy)." if paper.get("aggregate", "best") == "best"
                else "mean over seeds at the learning rate with the best mean validation accuracy (± std)."),
             "Each cell: ours (parameters) / paper (parameters); ✓ same side of 98% as the paper, ✗ the paper "
             "reaches ≥ 98% and we do not, ↑ we reach ≥ 98% where the paper does not.", ""]
    head = ["model"] + [columns.get(e, e) for e in entries]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mixer in dict.fromkeys(table["mixer"]):
        cells = [mixer]
        for e in entries:
            r = table[(table["entry"] == e) & (table["mixer"] == mixer)]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            ours = _pct(r["ours"]) + (f" ± {100 * r['ours_std']:.1f}" if paper.get("aggregate") == "mean_at_best_lr"
                                      and r["ours_std"] == r["ours_std"] else "")
            cells.append(f"{ours}{_k(r['ours_params'])} / {_pct(r['paper'])}{_k(r['paper_params'])} {verdict(r['ours'], r['paper'])}".strip())
        lines.append("| " + " | ".join(cells) + " |")
    differ = table[[verdict(o, p) in ("✗", "↑") for o, p in zip(table["ours"], table["paper"])]]
    lines += ["", f"Preset: `experiments/presets/{name}.yaml`. {' '.join(str(data.get('description', '')).split())}", ""]
    if len(differ):
        lines.append("Cells that differ from the paper (✗/↑): " + "; ".join(
            f"{r.entry}/{r.mixer} {_pct(r.ours)} vs {_pct(r.paper)} (median steps {r.median_steps:g})"
            for r in differ.itertuples()) + ".")
    return "\n".join(lines) + "\n"


def devices_used(results: pd.DataFrame) -> str:
    """The devices the finished trials ran on (failed or interrupted trials have none)."""
    return ", ".join(_distinct(results, "device")) or "none yet"


def trial_versions(results: pd.DataFrame) -> str:
    """The library versions and commits the finished trials recorded (several values joined by '/')."""
    parts = []
    for key in ("torch", "lightning", "python", "triton", "commit"):
        values = _distinct(results, key)
        if values:
            parts.append(f"{key} {'/'.join(values)}")
    return ", ".join(parts)


def _distinct(results: pd.DataFrame, column: str) -> list[str]:
    """The column's distinct recorded values (empty when absent or never recorded), sorted."""
    return sorted(set(results[column].dropna().astype(str))) if column in results else []


def _lrs(lrs: list[float]) -> str:
    return "/".join(f"{lr:g}" for lr in lrs)


def run_reproduction(name: str, out: Path, workers: int = 0, device: str = "auto", storage_url: str | None = None,
                     quick: bool = False, overrides: dict[str, Any] | None = None, entries: list[str] | None = None,
                     run: bool = True, progress: bool = True, stale_timeout: float = 60,
                     retry_failed: bool = False) -> pd.DataFrame:
    """Run (resume) the table's sweeps in one study, write the per-sweep results and the comparison."""
    from experiments._plans import run_plans
    from experiments.results import atomic_write_text

    plans = plans_for(name, quick, overrides)
    if entries:
        unknown = set(entries) - {p.entry for p in plans}
        if unknown:
            raise ValueError(f"unknown sweep(s) {', '.join(sorted(unknown))} in {name}; valid: {', '.join(p.entry for p in plans)}")
        plans = [p for p in plans if p.entry in entries]
    # one study for every reproduction: presets with identical cells (table1 within table6) share trials
    results, info = run_plans(plans, out, "reproduce" + ("-quick" if quick else ""), workers, device,
                              storage_url, run=run, progress=progress, stale_timeout=stale_timeout, label=name,
                              retry_failed=retry_failed)
    meta_versions = info["versions"]
    table = compare(name, results)
    frames = [df for df in results.values() if len(df)]
    every = pd.concat(frames) if frames else pd.DataFrame()
    data = load_reproduction(name)
    train = plans[0].train
    meta = {
        "device": devices_used(every),
        "date": time.strftime("%Y-%m-%d"),
        "workers": workers or 1, "ran": run,
        "wall_min": info["wall_s"] / 60,
        "trial_min": float(every["wall_time_s"].sum()) / 60 if "wall_time_s" in every else float("nan"),
        "budget": (f"max_steps per trial {', '.join(f'{p.entry} {p.train.max_steps}' for p in plans)} "
                   f"(lr {', '.join(f'{p.entry} {_lrs(p.lrs)}' for p in plans)}), batch {train.batch_size}, {train.train_size} train / "
                   f"{train.test_size} test sequences, early stop at val acc > {train.early_stop_acc}"
                   + (" — QUICK (CPU smoke check, not a reproduction)" if quick else "")
                   + ("; preset budget: " + ", ".join(f"{k} {v}" for k, v in data["budget"].items()) if data.get("budget") else "")),
        "done": info["done"], "cells": info["cells"],
        "versions": trial_versions(every) or ", ".join(f"{k} {v}" for k, v in meta_versions.items()),
    }
    atomic_write_text(out / "reproduction.md", comparison_markdown(name, table, meta))
    atomic_write_text(out / "reproduction.csv", table.to_csv(index=False))
    return table


def main(argv: list[str] | None = None) -> int:
    from experiments.mps import add_mps_argument, workers_mps
    from experiments.train import quiet_lightning

    p = argparse.ArgumentParser(
        prog="python -m experiments.reproduce",
        description="Run the sweeps of a paper table (resuming) and write it with the paper's numbers side by side.",
        epilog=f"Tables: {', '.join(reproduction_presets())} (experiments/presets/<NAME>.yaml; each says how it departs "
               "from the paper). Example: python -m experiments.reproduce pararnn-table6 --workers 16",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", help=f"one of: {', '.join(reproduction_presets())}")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="N worker processes (several per GPU); 0 (default): in this process")
    p.add_argument("--out", type=Path, help="output folder (default: runs/reproduce/NAME[-quick])")
    p.add_argument("--storage", help="shared Optuna storage (postgresql://...); default: a journal file in --out")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a CPU-sized smoke version (1 seed, short sequences, 300 steps)")
    p.add_argument("--only", help="comma-separated sweeps of the table to run (e.g. parity,mqar)")
    p.add_argument("--max-steps", type=int, help="override the step budget per trial")
    p.add_argument("--seeds", help="override the seeds, e.g. 0")
    p.add_argument("--table-only", action="store_true", help="do not train: write the comparison from what has finished")
    p.add_argument("--retry-failed", action="store_true", help="re-run cells whose trial failed (NaN loss, an error)")
    p.add_argument("--copy-to", type=Path, help="also copy reproduction.md here (e.g. benchmarks/reproduction/NAME.md)")
    add_mps_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_lightning()

    def run() -> None:
        load_reproduction(args.name)
        if args.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {args.workers}")
        overrides: dict[str, Any] = {}
        if args.max_steps:
            overrides["train"] = {"max_steps": args.max_steps}
        if args.seeds:
            try:
                overrides["seeds"] = [int(s) for s in args.seeds.split(",")]
            except ValueError:
                raise ValueError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
        out = args.out or Path("runs") / "reproduce" / (args.name + ("-quick" if args.quick else ""))
        with workers_mps(args.mps and not args.table_only, args.workers):
            run_reproduction(args.name, out, args.workers, args.device, args.storage, args.quick, overrides,
                             args.only.split(",") if args.only else None, run=not args.table_only,
                             progress=not args.no_progress, retry_failed=args.retry_failed)
        text = (out / "reproduction.md").read_text()
        print(text)
        if args.copy_to:
            args.copy_to.parent.mkdir(parents=True, exist_ok=True)
            args.copy_to.write_text(text)

    return run_cli(run, "re-run the same command to resume")


if __name__ == "__main__":
    sys.exit(main())
