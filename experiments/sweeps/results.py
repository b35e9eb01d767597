"""Results files: ``results.csv`` (one row per grid cell, the source of truth) and ``table.md``.

``collect`` reads the study: per cell its completed trial, else its latest failed one, else a row
saying the cell has no result yet (``status`` ``running``, ``waiting`` or ``missing``), so an
unfinished grid is visible in every table. The table, rendered by pandas: for each (entry, mixer,
seed) the learning rate with the best validation accuracy; then per (entry, mixer) the best and the
mean ± std over seeds of the test accuracy (the best checkpoint's), extrapolation accuracies, and
counts of failed and missing cells; for Newton mixers the share of forwards that fell back to the
sequential loop or were re-solved.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from experiments.trial.shape import ModelShape

log = logging.getLogger("experiments.sweeps.results")

#: metrics shown in table.md, in this order, when present
TABLE_METRICS = ("test/acc", "test/last_acc", "test/exact", "extrap/mean_acc", "extrap/scaled_acc")
#: accuracy on a subset of the training sequences (``tasks.datamodule.TRAIN_SUBSET``), shown last
TRAIN_SUBSET_METRIC = "trainset/acc"
#: a mixer that falls back to the sequential loop in more forwards than this gets a console warning
FALLBACK_WARNING = 0.05
#: a trial whose best checkpoint predicts one class at this share of the test positions (``test/top_pred``,
#: ``experiments.trial.lit.TopPredictionShare``) collapsed to a constant output: flagged in table.md
COLLAPSED = 0.999


def git_describe() -> str:
    """The suite's git commit, ``-dirty`` when the work tree has uncommitted changes; outside a git checkout
    (a copy on another machine) the ``EXPRESSIVITY_COMMIT`` environment variable, else ``unknown``."""
    if os.environ.get("EXPRESSIVITY_COMMIT"):
        return os.environ["EXPRESSIVITY_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    """Versions of the libraries a result depends on, and the suite's git commit (with a dirty flag)."""
    import lightning
    import torch

    out = {"torch": torch.__version__, "lightning": lightning.__version__, "python": platform.python_version()}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "none"
    out["commit"] = git_describe()
    return out


def _spec_columns(entry: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The columns of a spec dict (``TrialSpec.to_dict``): one per ``ModelShape`` field (absent in trials
    stored before the field existed: its default; ``mixer_options`` as ``mixer_config`` JSON and its
    ``backend``), between the task's and the trial's own."""
    model = ModelShape.from_dict(spec).to_dict()
    options = model.pop("mixer_options")
    shape = {"mixer": model.pop("mixer"), "mixer_config": json.dumps(options, sort_keys=True)}
    shape["backend"] = options.get("backend", options.get("mode", "auto"))
    return {
        "entry": entry,
        "task": spec["task"],
        "task_config": json.dumps(spec["task_options"], sort_keys=True),
        **shape,
        **model,
        "extrapolation": json.dumps(spec["extrapolation"]) if spec["extrapolation"] else "",
        "seed": spec["seed"],
        "lr": spec["lr"],
        "max_steps": spec["train"]["max_steps"],
    }


def _row(entry: str, trial: FrozenTrial) -> dict[str, Any]:
    status = {TrialState.COMPLETE: "ok", TrialState.FAIL: "failed"}.get(trial.state, trial.state.name.lower())
    row = {
        **_spec_columns(entry, trial.user_attrs["spec"]),
        "status": status,
        "failure": trial.user_attrs.get("failure", ""),
        "error": trial.user_attrs.get("error", ""),
        "trial": trial.number,
    }
    for key, value in trial.user_attrs.get("result", {}).items():
        row[key] = json.dumps(value) if isinstance(value, list) else value
    return row


def _final_trial(trials: list[FrozenTrial]) -> FrozenTrial:
    """A done cell's trial: its completed one, else its final failed one."""
    done = [t for t in trials if t.state == TrialState.COMPLETE] or [
        t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("failure") != "duplicate"
    ]
    return max(done, key=lambda t: t.number)


def busy_seconds(trials: Iterable[FrozenTrial]) -> float:
    """Seconds during which at least one of ``trials`` ran: the length of the union of their
    start-to-end intervals (trials without both times left out). Over a run resumed in several
    invocations this is the run's time with trials running, without the gaps between invocations.

    A trial whose worker died (``failure="died"``: its machine was given back mid-trial) is marked
    failed only when the next invocation finds it, so its recorded end lies after the gap; its interval
    ends instead at its last sign of life: the ``alive`` time its last validation recorded, or (runs
    that did not record it) the latest start or end of another trial within its interval."""
    trials = [t for t in trials if t.datetime_start and t.datetime_complete]
    events = sorted(
        {t.datetime_start for t in trials}
        | {t.datetime_complete for t in trials if t.user_attrs.get("failure") != "died"}
    )

    def end(t: FrozenTrial) -> datetime:
        if t.user_attrs.get("failure") != "died":
            return t.datetime_complete
        if "alive" in t.user_attrs:
            return min(t.datetime_complete, max(t.datetime_start, datetime.fromisoformat(t.user_attrs["alive"])))
        inside = [e for e in events if t.datetime_start <= e < t.datetime_complete]
        return max(inside) if inside else t.datetime_start

    spans = sorted((t.datetime_start, end(t)) for t in trials)
    total, last = 0.0, None
    for start, stop in spans:
        if last is None or start > last:
            total += (stop - start).total_seconds()
            last = stop
        elif stop > last:
            total += (stop - last).total_seconds()
            last = stop
    return total


def collect(
    grid, cells: Iterable[tuple[str, Any]], meta: dict[str, Any] | None = None, every_finished: bool = False
) -> pd.DataFrame:
    """One row per cell ``(entry, spec)``: its completed trial, else its final failed one, else a row with
    the cell's state (``running``, ``waiting``, or ``missing``: never started, or interrupted and to be re-run).
    With ``every_finished`` (a sweep's folder, whose study is its own), then one row per other done cell
    of the study under the same entries (cells an earlier command of the folder added, e.g. with another
    ``--mixers``), then one per done cell of the other studies in the folder's own journal (another task
    swept into the same ``--out``): a command's subset filters what is trained, not what is reported. A
    reproduction's study is shared by every table, so its reports keep to their own cells.

    ``meta`` (e.g. ``versions()``) fills the version columns of completed trials that did not record
    them; a failed trial's row keeps them empty (it recorded none, and the reporting process's are not its).
    """
    from experiments.sweeps.study import cell_id, cell_state

    by_cell = grid.trials_by_cell()
    cells = list(cells)
    planned = {cell_id(spec) for _, spec in cells}
    entries = list(dict.fromkeys(entry for entry, _ in cells))
    rows = []
    for entry, spec in cells:
        trials = by_cell.get(cell_id(spec), [])
        state = cell_state(trials)
        if state == "done":
            rows.append(_with_meta(_row(entry, _final_trial(trials)), meta))
            continue
        status = "missing"
        if state == "pending":
            status = "running" if any(t.state == TrialState.RUNNING for t in trials) else "waiting"
        failed = [t for t in trials if t.state == TrialState.FAIL]
        last = max(failed, key=lambda t: t.number).user_attrs.get("failure", "") if failed else ""
        rows.append({**_spec_columns(entry, spec.to_dict()), "status": status, "failure": last})
    earlier = []
    for key, trials in by_cell.items() if every_finished else ():
        entry = trials[0].params.get("entry")
        if key not in planned and entry in entries and cell_state(trials) == "done":
            earlier.append((entries.index(entry), _final_trial(trials)))
    for _, trial in sorted(earlier, key=lambda pair: (pair[0], pair[1].number)):
        rows.append(_with_meta(_row(trial.params["entry"], trial), meta))
    for other in grid.other_studies_by_cell() if every_finished else ():  # other sweeps into the same folder
        for trials in other.values():
            if cell_state(trials) == "done":
                trial = _final_trial(trials)
                rows.append(_with_meta(_row(trial.params.get("entry", trial.user_attrs["spec"]["task"]), trial), meta))
    return pd.DataFrame(rows)


def _with_meta(row: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    """``row`` with ``meta`` under it when the trial completed; a failed trial's row as it is."""
    return {**(meta or {}), **row} if row["status"] == "ok" else row


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it over (never a half-written file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_results(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``results.csv`` (+ ``results.parquet`` with the ``parquet`` extra installed) and ``table.md``."""
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


def finished(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of cells with a result (``ok`` or ``failed``)."""
    return df[df["status"].isin(["ok", "failed"])] if len(df) else df


def with_layers(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with an integer ``layers`` column (results written before depth existed: 1) and the other
    ``CELL_AXES`` it has with their defaults where empty."""
    df = df.copy()
    df["layers"] = df["layers"].fillna(1).astype(int) if "layers" in df else 1
    for axis, default in AXIS_DEFAULTS.items():
        if axis in df:
            df[axis] = df[axis].astype(object).where(df[axis].notna(), default)
    return df


#: what tells two cells of one sweep entry and mixer apart besides seed and learning rate, with its name in
#: a table: where one varies in a results file it is a column of every table made from it (``varying_axes``)
CELL_AXES = {
    "layers": "layers",
    "d_model": "width",
    "precision": "precision",
    "mixer_config": "mixer options",
    "task_config": "task options",
    "extrapolation": "lengths",
    "block": "block",
    "positional": "positions",
    "conv_kernel": "conv",
    "max_steps": "steps",
}
# a model option added to ModelShape is an axis under its own name
CELL_AXES.update({k: k for k in ModelShape.field_names() if k not in CELL_AXES and k not in ("mixer", "mixer_options")})
#: an axis's value in results written before it existed
AXIS_DEFAULTS = {
    **{k: v for k, v in ModelShape.defaults().items() if k not in ("mixer", "mixer_options", "layers")},
    "mixer_config": "{}",
    "task_config": "{}",
    "extrapolation": "",
}


def varying_axes(df: pd.DataFrame) -> list[str]:
    """``layers`` and every other ``CELL_AXES`` column that takes more than one value for some (entry, mixer)
    of ``df``'s rows (a mixer's options differing from another mixer's do not count)."""
    df = with_layers(df)
    key = ["entry" if "entry" in df else "task", "mixer"]
    axes = ["layers"]
    for axis in CELL_AXES:
        if axis != "layers" and axis in df and len(df) and df.groupby(key)[axis].nunique(dropna=False).max() > 1:
            axes.append(axis)
    return axes


def axis_text(axis: str, value: Any) -> str:
    """An axis value as a table shows it: ``2 layers``, ``d=128``, ``bf16-mixed``, ``num_heads=2``."""
    if axis == "layers":
        return f"{int(value)} layer{'s' if int(value) > 1 else ''}"
    if axis == "d_model":
        return f"d={int(value)}"
    if axis in ("mixer_config", "task_config"):
        options = json.loads(value) if isinstance(value, str) and value.strip() else {}
        return ",".join(f"{k}={v}" for k, v in sorted(options.items())) or "defaults"
    if axis == "extrapolation":
        lengths = json.loads(value) if isinstance(value, str) and value.strip() else None
        return f"train {lengths['min_len']}-{lengths['max_len']}" if lengths else "no extrapolation"
    return str(value) if axis in ("precision", "block", "positional") else f"{CELL_AXES[axis]}={value}"


def model_labels(df: pd.DataFrame, axes: list[str] | None = None) -> list[str]:
    """Per row the mixer's name with the values of the varying ``axes`` other than depth 1
    (``gru, 2 layers``, ``signed_deltanet, bf16-mixed``): the row name of a figure or table whose columns
    are tasks, so that cells that differ never share a row."""
    df = with_layers(df)
    axes = varying_axes(df) if axes is None else axes
    labels = []
    for _, r in df.iterrows():
        parts = [axis_text(a, r[a]) for a in axes if not (a == "layers" and int(r[a]) == ModelShape().layers)]
        labels.append(", ".join([str(r["mixer"]), *parts]))
    return labels


def best_over_lrs(df: pd.DataFrame, by: str = "best_val_acc", axes: list[str] | None = None) -> pd.DataFrame:
    """Per (entry, mixer, the varying ``axes`` (default ``varying_axes(df)``), seed): the row of the learning
    rate with the best validation accuracy ``by``: ``best_val_acc`` (the best checkpoint's, default) or
    ``final_val_acc`` (the final weights')."""
    axes = varying_axes(df) if axes is None else axes
    ok = with_layers(df[df["status"] == "ok"])
    if ok.empty:
        return ok
    keys = ["entry" if "entry" in ok else "task", "mixer", *axes, "seed"]
    ok["_rank"] = ok[by].fillna(-1.0) if by in ok else -1.0
    idx = ok.groupby(keys)["_rank"].idxmax()
    return ok.loc[idx].drop(columns="_rank")


def _newton_rates(rows: pd.DataFrame) -> tuple[float, float, float]:
    """(fallback, re-solve, skipped-update) shares of the Newton forwards of ``rows``; NaN without Newton statistics."""
    if "newton/newton_forwards" not in rows or rows["newton/newton_forwards"].fillna(0).sum() == 0:
        return float("nan"), float("nan"), float("nan")
    forwards = rows["newton/newton_forwards"].fillna(0).sum()
    total = lambda key: rows.get(key, pd.Series(dtype=float)).fillna(0).sum()  # noqa: E731
    return (
        float(total("newton/fallback_count") / forwards),
        float(total("newton/retry_count") / forwards),
        float(total("newton/skipped_steps") / forwards),
    )


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per (entry, mixer, and each of the ``varying_axes``: layers, width, precision, options ...): params, counts (seeds with a result, failed, missing), best / mean / std
    over seeds of every metric, and Newton fallback / retry shares."""
    if df.empty:
        return pd.DataFrame()
    df = with_layers(df)
    group_key = "entry" if "entry" in df else "task"
    axes = varying_axes(df)
    best = best_over_lrs(df, axes=axes)
    metric_cols = [c for c in TABLE_METRICS if c in best.columns]
    metric_cols += sorted(
        (c for c in best.columns if c.startswith("len") and c.endswith("/acc")), key=lambda c: int(c[3:].split("/")[0])
    )
    metric_cols += sorted(c for c in best.columns if c.startswith("range") and c.endswith(("/acc", "/scaled_acc")))
    if TRAIN_SUBSET_METRIC in best.columns:
        metric_cols.append(TRAIN_SUBSET_METRIC)
    rows = []
    for (entry, mixer, *values), group in df.groupby([group_key, "mixer", *axes], sort=False):
        sel = best
        for col, value in zip([group_key, "mixer", *axes], [entry, mixer, *values]):
            sel = sel[sel[col] == value] if len(sel) else sel
        fallback, retry, skipped = _newton_rates(group[group["status"] == "ok"])
        row: dict[str, Any] = {
            "entry": entry,
            "task": group["task"].iloc[0],
            "mixer": mixer,
            **dict(zip(axes, values)),
            "layers": int(values[0]),
            "params": int(sel["n_params"].iloc[0]) if len(sel) and "n_params" in sel else float("nan"),
            "seeds": len(sel),
            "failed": int((group["status"] == "failed").sum()),
            "missing": int((~group["status"].isin(["ok", "failed"])).sum()),
            "newton_fallback": fallback,
            "newton_retry": retry,
            "newton_skipped": skipped,
            "collapsed": int((sel["test/top_pred"] >= COLLAPSED).sum()) if "test/top_pred" in sel else 0,
        }
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


def _pct(x: float) -> str:
    return "–" if x != x else f"{100 * x:.1f}%"


def table_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The display table of ``summarize(df)`` (strings): what ``table.md`` shows."""
    summary = summarize(df)
    if summary.empty:
        return summary
    metrics = [c[: -len(" best")] for c in summary.columns if c.endswith(" best")]
    # exact match equals accuracy when each sequence has one scored position: show it only if it differs
    for twin in ("test/exact", "test/last_acc"):
        if twin in metrics and (summary[f"{twin} best"].fillna(-1) == summary["test/acc best"].fillna(-1)).all():
            metrics.remove(twin)
    table = pd.DataFrame(
        {
            "task": summary["entry"],
            "mixer": summary["mixer"],
            "layers": summary["layers"],
            **{CELL_AXES[a]: [axis_text(a, v) for v in summary[a]] for a in varying_axes(df) if a != "layers"},
            "params": [f"{p / 1000:.1f}k" if p == p else "–" for p in summary["params"]],
            "seeds": summary["seeds"],
            "failed": summary["failed"],
        }
    )
    if summary["missing"].any():
        table["missing"] = summary["missing"]
    if summary["collapsed"].any():
        table["constant output"] = [f"{c}/{n}" if c else "" for c, n in zip(summary["collapsed"], summary["seeds"])]
    for m in metrics:
        table[m.replace("/", " ")] = [
            _fmt(r[f"{m} best"], r[f"{m} mean"], r[f"{m} std"], r["seeds"]) for _, r in summary.iterrows()
        ]
    if summary["newton_fallback"].notna().any():
        table["Newton fallback / retry / skipped"] = [
            "" if f != f else f"{_pct(f)} / {_pct(r)} / {_pct(k)}"
            for f, r, k in zip(summary["newton_fallback"], summary["newton_retry"], summary["newton_skipped"])
        ]
    return table


def table_markdown(df: pd.DataFrame) -> str:
    """``table.md``: accuracies in %, best (mean ± std) over seeds, with the counts that qualify them."""
    table = table_frame(df)
    if table.empty:
        return "_no trials yet_\n"
    text = table.to_markdown(index=False, disable_numparse=True)
    notes = [
        "Accuracy in % on the test set at the checkpoint with the best validation accuracy "
        "(`last_acc`: at each sequence's last scored position; `len<L>`: extrapolation lengths; `range<a>-<b>`: "
        "one test set of lengths drawn uniformly from a..b; "
        "`trainset acc`: on the first training sequences, as many as the validation set has; a gap to `test acc` "
        "shows memorization; `scaled_acc`: (acc - chance) / (1 - chance), 0 at chance). "
        "Per (mixer, seed) the learning rate with the best validation accuracy; then the best over seeds "
        "(mean ± std in brackets). `failed`: trials that failed (NaN loss, errors)."
    ]
    if "missing" in table:
        n = int(table["missing"].sum())
        notes.append(
            f"**{n} cell(s) have no result yet** (`missing`: running, waiting or never started): "
            "re-run the same command to finish them."
        )
    if "constant output" in table:
        notes.append(
            f"`constant output`: seeds whose model predicts one class at ≥ {COLLAPSED:.1%} of the test positions "
            "(it collapsed to a constant: its accuracy is that class's frequency, whatever the mixer; two such "
            "rows may agree number for number)."
        )
    if "Newton fallback / retry / skipped" in table:
        notes.append(
            "`Newton fallback / retry / skipped`: share of the Newton forwards that fell back to the sequential "
            "loop / were re-solved with more iterations / failed the check inside a CUDA graph, whose training "
            "step then skipped its update."
        )
    return text + "\n\n" + "\n\n".join(notes) + "\n"


def warn_newton_fallbacks(df: pd.DataFrame, threshold: float = FALLBACK_WARNING) -> list[str]:
    """Log a warning for every (entry, mixer) whose Newton forwards fell back more than ``threshold``; returns them."""
    summary = summarize(df)
    warnings = []
    for _, r in summary.iterrows() if len(summary) else []:
        if r["newton_fallback"] == r["newton_fallback"] and r["newton_fallback"] > threshold:
            warnings.append(
                f"{r['entry']}/{r['mixer']}: {100 * r['newton_fallback']:.0f}% of its Newton forwards fell back to "
                "the sequential loop (slow; the Newton solve does not converge for this cell: try more "
                "iters, damping, or mode='sequential')"
            )
            log.warning("%s", warnings[-1])
    return warnings
