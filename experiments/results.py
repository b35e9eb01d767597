"""Results files (SPEC §8.3): ``results.csv`` (one row per grid cell) and ``table.md``.

The table: for each (mixer, seed) the learning rate with the best validation accuracy; then per
mixer the best and the mean ± std over seeds of the test accuracy (and extrapolation accuracy).
Failed cells are counted and shown.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from experiments.study import trials_by_cell
from kernels.bench.common import git_commit

ID_COLUMNS = ["task", "task_config", "mixer", "mixer_config", "backend", "block", "positional", "seed", "lr"]


def versions() -> dict[str, str]:
    """Versions of the libraries a result depends on, and the suite's git commit."""
    import lightning
    import torch

    out = {"torch": torch.__version__, "lightning": lightning.__version__, "python": platform.python_version()}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = "none"
    out["commit"] = git_commit()
    return out


def _row(trial: FrozenTrial) -> dict[str, Any]:
    spec = trial.user_attrs["spec"]
    status = {TrialState.COMPLETE: "ok", TrialState.FAIL: "failed"}.get(trial.state, trial.state.name.lower())
    row: dict[str, Any] = {
        "task": spec["task"],
        "task_config": json.dumps(spec["task_options"], sort_keys=True),
        "mixer": spec["mixer"],
        "mixer_config": json.dumps(spec["mixer_options"], sort_keys=True),
        "backend": spec["mixer_options"].get("backend", spec["mixer_options"].get("mode", "auto")),
        "block": spec["block"],
        "positional": spec["positional"],
        "extrapolation": json.dumps(spec["extrapolation"]) if spec["extrapolation"] else "",
        "seed": spec["seed"],
        "lr": spec["lr"],
        "max_steps": spec["train"]["max_steps"],
        "status": status,
        "failure": trial.user_attrs.get("failure", ""),
        "error": trial.user_attrs.get("error", ""),
        "trial": trial.number,
    }
    for key, value in trial.user_attrs.get("result", {}).items():
        row[key] = json.dumps(value) if isinstance(value, list) else value
    return row


def collect(study, cells: Iterable[str], meta: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per cell: its completed trial, else its latest failed one; pending cells are skipped.

    ``meta`` (e.g. ``versions()``) fills the columns a trial did not record itself (trials record the
    versions they ran with; older ones did not).
    """
    by_cell = trials_by_cell(study)
    rows = []
    for cell in cells:
        trials = by_cell.get(cell, [])
        done = [t for t in trials if t.state == TrialState.COMPLETE] or [
            t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("failure") != "duplicate"
        ]
        if done:
            rows.append({**(meta or {}), **_row(max(done, key=lambda t: t.number))})
    return pd.DataFrame(rows)


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it over (never a half-written file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_results(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``results.csv`` (+ ``results.parquet`` when pyarrow is installed) and ``table.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.csv", out_dir / "table.md"]
    atomic_write_text(written[0], df.to_csv(index=False))
    try:
        import pyarrow  # noqa: F401

        tmp = out_dir / f".results.parquet.{os.getpid()}.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, out_dir / "results.parquet")
        written.append(out_dir / "results.parquet")
    except ImportError:
        pass
    atomic_write_text(written[1], table_markdown(df))
    return written


def best_over_lrs(df: pd.DataFrame) -> pd.DataFrame:
    """Per (task, mixer, seed): the row of the learning rate with the best validation accuracy."""
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        return ok
    ok["_rank"] = ok["best_val_acc"].fillna(-1.0)
    idx = ok.groupby(["task", "mixer", "seed"])["_rank"].idxmax()
    return ok.loc[idx].drop(columns="_rank")


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per (task, mixer): params, best / mean / std over seeds of the metrics, failures."""
    if df.empty:
        return pd.DataFrame()
    best = best_over_lrs(df)
    metric_cols = [c for c in ("test/acc", "test/exact", "extrap/mean_acc") if c in best.columns]
    metric_cols += sorted(c for c in best.columns if c.startswith("len") and c.endswith("/acc"))
    rows = []
    for (task, mixer), group in df.groupby(["task", "mixer"], sort=False):
        sel = best[(best["task"] == task) & (best["mixer"] == mixer)]
        row: dict[str, Any] = {"task": task, "mixer": mixer,
                               "params": int(sel["n_params"].iloc[0]) if len(sel) and "n_params" in sel else float("nan"),
                               "seeds": len(sel), "failed": int((group["status"] != "ok").sum())}
        for col in metric_cols:
            vals = sel[col].dropna() if col in sel else pd.Series(dtype=float)
            row[f"{col} best"] = vals.max() if len(vals) else float("nan")
            row[f"{col} mean"] = vals.mean() if len(vals) else float("nan")
            row[f"{col} std"] = vals.std(ddof=0) if len(vals) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(best: float, mean: float, std: float, seeds: int) -> str:
    """``99.1`` for one seed, ``99.1 (97.0 ± 2.1)`` for several; percentages; ``–`` for missing."""
    if best != best:
        return "–"
    return f"{100 * best:.1f}" if seeds <= 1 else f"{100 * best:.1f} ({100 * mean:.1f} ± {100 * std:.1f})"


def table_markdown(df: pd.DataFrame) -> str:
    """The Markdown table of ``summarize(df)``: accuracies in %, best (mean ± std) over seeds."""
    summary = summarize(df)
    if summary.empty:
        return "_no finished trials yet_\n"
    metrics = [c[: -len(" best")] for c in summary.columns if c.endswith(" best")]
    # exact match equals accuracy when each sequence has one scored position: show it only if it differs
    if "test/exact" in metrics and (summary["test/exact best"].fillna(-1) == summary["test/acc best"].fillna(-1)).all():
        metrics = [m for m in metrics if not m.endswith("/exact")]
    metrics = [m for m in metrics if not (m.startswith("len") and m.endswith("/exact"))]
    head = ["task", "mixer", "params", "seeds", "failed"] + [m.replace("/", " ") for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in summary.iterrows():
        params = f"{r['params'] / 1000:.1f}k" if pd.notna(r["params"]) else "–"
        cells = [str(r["task"]), str(r["mixer"]), params, str(r["seeds"]), str(r["failed"])]
        cells += [_fmt(r[f"{m} best"], r[f"{m} mean"], r[f"{m} std"], r["seeds"]) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    note = ("\nAccuracy in % on the test set (`len<L>`: extrapolation lengths). Per (mixer, seed) the learning rate "
            "with the best validation accuracy; then the best over seeds (mean ± std in brackets). "
            "`failed`: trials that failed (NaN loss, errors).\n")
    return "\n".join(lines) + "\n" + note
