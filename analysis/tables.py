"""``python -m analysis.tables RESULTS...``: accuracy tables from one or more ``results.csv``.

Per (task, mixer, seed) the learning rate with the best validation accuracy
(``experiments.sweeps.results.best_over_lrs``); then per (task, mixer) the best and the mean ± std
(population std, ddof=0) over seeds of the test accuracy, the extrapolation accuracy and every
extrapolation length (``experiments.sweeps.results.summarize``). Failed trials (NaN loss, errors) are
counted per (task, mixer). A task run in several configurations (k-hop with k=1 and k=2) gets one
group per configuration, labelled by the options that differ (``khop k=2 vocab_size=5``).

With ``--paper NAME`` (a reproduction preset: ``pararnn-table6``, ``pararnn-table1``,
``flashrnn-parity``) the paper's number (and parameter count) sits beside ours, for the metric and
statistic the paper reports (best seed, or mean over seeds).

Writes ``table.md`` (a mixer × task summary, then the details per task), ``table.tex`` (the summary,
booktabs) and ``table.csv`` (every number, long form) into ``--out`` (default: ``analysis-out/tables``; never
a sweep's own folder, so the sweep's ``table.md`` is never overwritten).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.cli import run, setup_logging
from experiments.paper import (
    PaperEntry,
    full_task_config,
    match_entry,
    model_label,
    paper_entries,
    reproduction_presets,
)

log = logging.getLogger("analysis.tables")

REQUIRED = ("task", "mixer", "seed", "lr", "status")


def load_results(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Concatenate ``results.csv`` files (a folder means ``<folder>/results.csv``, or without one every
    ``<folder>/<sweep>/results.csv``: a reproduction's folder); adds ``source``.

    Raises ``ValueError`` for a missing file or a file without the columns a sweep's results.csv has.
    """
    if not paths:
        raise ValueError("give at least one results.csv (or a sweep folder holding one)")
    frames = []
    files = []
    for p in map(Path, paths):
        nested = sorted(p.glob("*/results.csv")) if p.is_dir() and not (p / "results.csv").is_file() else []
        files += nested or [p / "results.csv" if p.is_dir() else p]
    for path in files:
        if not path.is_file():
            raise ValueError(f"no results file at {path} (expected a results.csv written by experiments.sweep)")
        df = pd.read_csv(path)
        missing = [c for c in REQUIRED if c not in df.columns]
        if missing:
            raise ValueError(
                f"{path}: missing column(s) {', '.join(missing)}; is it a results.csv of experiments.sweep?"
            )
        df["source"] = str(path)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True, sort=False)
    for col, default in (
        ("task_config", "{}"),
        ("extrapolation", ""),
        ("best_val_acc", math.nan),
        ("n_params", math.nan),
    ):
        if col not in df:
            df[col] = default
    df["task_config"] = df["task_config"].astype(object).fillna("{}").astype(str)
    df["extrapolation"] = df["extrapolation"].astype(object).fillna("").astype(str)
    return df


def _group_config(task: str, task_config: str, extrapolation: str) -> dict[str, Any]:
    options = json.loads(task_config) if task_config.strip() else {}
    if extrapolation.strip():
        options["extrapolation"] = json.loads(extrapolation)
    return full_task_config(task, options)


def label_tasks(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``task_label`` (the task, plus the options that differ between its configurations in
    ``df``) and ``task_full_config`` (JSON of the whole task configuration)."""
    df = df.copy()
    keys = list(zip(df["task"].astype(str), df["task_config"], df["extrapolation"]))
    configs = {k: _group_config(*k) for k in dict.fromkeys(keys)}
    labels = {}
    for task in dict.fromkeys(df["task"].astype(str)):
        mine = {k: c for k, c in configs.items() if k[0] == task}
        distinct = {json.dumps(c, sort_keys=True): c for c in mine.values()}
        differ = sorted(
            {
                o
                for c in distinct.values()
                for o in c
                if len({json.dumps(x.get(o), sort_keys=True) for x in distinct.values()}) > 1
            }
        )
        for k, c in mine.items():
            parts = [f"{o}={c.get(o)}" for o in differ if o != "extrapolation"]
            if "extrapolation" in differ:
                e = c.get("extrapolation")
                parts.append(f"train {e['min_len']}-{e['max_len']}" if e else "no extrapolation")
            labels[k] = " ".join([task, *parts])
    df["task_label"] = [labels[k] for k in keys]
    df["task_full_config"] = [json.dumps(configs[k], sort_keys=True) for k in keys]
    return df


def _len_key(metric: str) -> tuple:
    m = re.fullmatch(r"len(\d+)/acc", metric)
    order = {"test/acc": 0, "test/exact": 1, "extrap/mean_acc": 2}
    return (order.get(metric, 3), int(m.group(1)) if m else 0, metric)


def metrics_of(summary: pd.DataFrame) -> list[str]:
    """Metric names present in a ``summarize`` frame, in display order (extrapolation lengths by length)."""
    return sorted((c[: -len(" best")] for c in summary.columns if c.endswith(" best")), key=_len_key)


def summary_table(df: pd.DataFrame, paper: str | None = None) -> pd.DataFrame:
    """One row per (task configuration, mixer): parameters, seeds, trials, failed, per metric best /
    mean / std over seeds (after the best lr per seed), ``main`` metric; with ``paper``, the paper's
    ``paper`` value, ``paper_params``, ``paper_metric``, ``paper_aggregate``, ``paper_column``."""
    from experiments.sweeps.results import model_labels, summarize

    df = label_tasks(df)
    summary = summarize(df.assign(task=df["task_label"]))
    if summary.empty:
        return summary
    summary = summary.rename(columns={"task": "task_label"})
    # the row name: the mixer with every axis that varies in the results (depth, width, precision, options)
    axes = _axes_of(summary)
    summary.insert(summary.columns.get_loc("mixer") + 1, "model", model_labels(summary, axes))
    first = df.drop_duplicates("task_label").set_index("task_label")
    summary.insert(0, "task", summary["task_label"].map(first["task"]))
    summary.insert(2, "task_config", summary["task_label"].map(first["task_full_config"]))
    df = df.assign(model=model_labels(df, axes))
    trials = df.groupby(["task_label", "model"]).size()
    summary.insert(
        summary.columns.get_loc("failed"),
        "trials",
        [int(trials.get((t, m), 0)) for t, m in zip(summary["task_label"], summary["model"])],
    )
    entries: list[PaperEntry] = paper_entries(paper) if paper else []
    main, cols = [], {k: [] for k in ("paper_column", "paper_metric", "paper_aggregate", "paper", "paper_params")}
    for _, r in summary.iterrows():
        entry = match_entry(r["task"], json.loads(r["task_config"]), entries) if entries else None
        has_extrap = "extrap/mean_acc best" in summary and pd.notna(r.get("extrap/mean_acc best"))
        metric = entry.metric if entry else ("extrap/mean_acc" if has_extrap else "test/acc")
        main.append(metric)
        label = model_label(r["mixer"], int(r["layers"]), entry.layers) if entry else ""
        value = entry.values.get(label, (math.nan, math.nan)) if entry else (math.nan, math.nan)
        cols["paper_column"].append(entry.title if entry else "")
        cols["paper_metric"].append(entry.metric if entry else "")
        cols["paper_aggregate"].append(entry.aggregate if entry else "")
        cols["paper"].append(value[0])
        cols["paper_params"].append(value[1])
    summary["main"] = main
    if paper:
        for key, values in cols.items():
            summary[key] = values
        unmatched = sorted({t for t, c in zip(summary["task_label"], cols["paper_column"]) if not c})
        if unmatched:
            log.warning("no column of paper table %s for: %s", paper, ", ".join(unmatched))
    return summary


def _axes_of(summary: pd.DataFrame) -> list[str]:
    """The ``CELL_AXES`` that ``summarize`` made columns of (layers, and those that vary)."""
    from experiments.sweeps.results import CELL_AXES

    return [a for a in CELL_AXES if a in summary.columns]


# ---------------------------------------------------------------------------------------------- formatting
def _pct(x: float) -> str:
    return "–" if pd.isna(x) else f"{100 * x:.1f}"


def _params(n: float) -> str:
    return "–" if pd.isna(n) else f"{n / 1000:.1f}k"


def cell_text(r: pd.Series, metric: str) -> str:
    """``best (mean ± std)`` in %, just ``best`` for one seed, ``–`` when nothing finished."""
    best, mean, std = (
        r.get(f"{metric} best", math.nan),
        r.get(f"{metric} mean", math.nan),
        r.get(f"{metric} std", math.nan),
    )
    if pd.isna(best):
        return "–"
    return _pct(best) if r["seeds"] <= 1 else f"{_pct(best)} ({_pct(mean)} ± {_pct(std)})"


def _paper_text(r: pd.Series) -> str:
    if "paper" not in r or pd.isna(r["paper"]):
        return ""
    stat = "mean" if r["paper_aggregate"] == "mean_at_best_lr" else "best"
    params = "" if pd.isna(r["paper_params"]) else f" [{_params(r['paper_params'])}]"
    return f"{_pct(r['paper'])}{params} ({stat})"


def _summary_cell(r: pd.Series, tex: bool = False) -> str:
    text = cell_text(r, r["main"])
    if pd.notna(r["params"]):
        text += f" [{_params(r['params'])}]"
    if r["failed"]:
        text += f" {r['failed']}✗" if not tex else f" ({r['failed']} failed)"
    paper = _paper_text(r)
    if paper:
        text += (" / paper " if not tex else " / ") + paper
    return text


def _columns(summary: pd.DataFrame) -> list[tuple[str, str]]:
    """``(task_label, header)`` per task group, in order of appearance."""
    out = []
    for label, group in summary.groupby("task_label", sort=False):
        titles = [t for t in group.get("paper_column", pd.Series(dtype=str)) if t]
        if titles:
            head = f"{label}: {titles[0]}"
        else:
            head = label + (" (extrapolation)" if group["main"].iloc[0] == "extrap/mean_acc" else "")
        out.append((label, head))
    return out


def to_markdown(summary: pd.DataFrame, sources: Sequence[str] = (), paper: str | None = None) -> str:
    """The Markdown report: the mixer × task summary, then one detailed table per task group (pandas)."""
    if summary.empty:
        return "_no trials in the results files_\n"
    cols = _columns(summary)
    overview = pd.DataFrame(
        [
            {
                "mixer": model,
                **{
                    head: (_summary_cell(sel.iloc[0]) if len(sel) else "")
                    for label, head in cols
                    for sel in [summary[(summary["task_label"] == label) & (summary["model"] == model)]]
                },
            }
            for model in dict.fromkeys(summary["model"])
        ]
    )
    lines = [
        "## Summary",
        "",
        overview.to_markdown(index=False, disable_numparse=True),
        "",
        (
            "Accuracy in %: best over seeds (mean ± std over seeds in brackets); per seed the learning rate "
            "with the best validation accuracy. `[params]`: trainable parameters. `n✗`: failed trials. "
            "Extrapolation columns report the mean accuracy over the evaluation lengths."
        ),
    ]
    if paper:
        entries = paper_entries(paper)
        lines.append(
            f"`paper`: {entries[0].source if entries else paper} (preset `{paper}`); `(best)`: the paper "
            "reports the best seed, `(mean)`: the mean over seeds at the best learning rate."
        )
    for label, head in cols:
        group = summary[summary["task_label"] == label]
        metrics = [m for m in metrics_of(group) if group[f"{m} best"].notna().any()]
        if "test/exact" in metrics and (group["test/exact best"].fillna(-1) == group["test/acc best"].fillna(-1)).all():
            metrics.remove("test/exact")  # one scored position per sequence: exact match = accuracy
        metrics = [m for m in metrics if not (m.startswith("len") and m.endswith("/exact"))]
        has_paper = "paper" in group and group["paper"].notna().any()
        detail = pd.DataFrame(
            [
                {
                    "mixer": str(r["model"]),
                    "layers": str(r["layers"]),
                    "params": _params(r["params"]),
                    "seeds": str(r["seeds"]),
                    "trials": str(r["trials"]),
                    "failed": str(r["failed"]),
                    **{m.replace("/", " "): cell_text(r, m) for m in metrics},
                    **({"paper": _paper_text(r) or "–"} if has_paper else {}),
                }
                for _, r in group.iterrows()
            ]
        )
        lines += [
            "",
            f"## {head}",
            "",
            f"Configuration: `{group['task_config'].iloc[0]}`",
            "",
            detail.to_markdown(index=False, disable_numparse=True),
        ]
    if sources:
        lines += ["", "Sources: " + ", ".join(f"`{s}`" for s in sources)]
    return "\n".join(lines) + "\n"


def _tex_escape(text: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("_", r"\_"),
        ("#", r"\#"),
        ("κ", r"$\kappa$"),
        ("±", r"$\pm$"),
        ("†", r"$^\dagger$"),
        ("–", "--"),
        ("✗", "x"),
    ):
        text = text.replace(a, b)
    return text


def to_latex(summary: pd.DataFrame) -> str:
    """The mixer × task summary as a booktabs ``tabular`` (accuracies in %, paper after ``/``)."""
    if summary.empty:
        return "% no trials in the results files\n"
    cols = _columns(summary)
    lines = [
        r"\begin{tabular}{l" + "c" * len(cols) + "}",
        r"\toprule",
        "Mixer & " + " & ".join(_tex_escape(h) for _, h in cols) + r" \\",
        r"\midrule",
    ]
    for model in dict.fromkeys(summary["model"]):
        cells = []
        for label, _ in cols:
            sel = summary[(summary["task_label"] == label) & (summary["model"] == model)]
            cells.append(_tex_escape(_summary_cell(sel.iloc[0], tex=True)) if len(sel) else "")
        lines.append(_tex_escape(model) + " & " + " & ".join(cells) + r" \\")
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        "% accuracy in %: best over seeds (mean +- std over seeds); [parameters]; paper value after '/'",
    ]
    return "\n".join(lines) + "\n"


def to_csv_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with its metric columns in display order (what ``table.csv`` holds)."""
    if summary.empty:
        return summary
    front = [
        c
        for c in (
            "task",
            "task_label",
            "task_config",
            "mixer",
            "model",
            "layers",
            "params",
            "seeds",
            "trials",
            "failed",
            "main",
        )
        if c in summary
    ]
    metric_cols = [f"{m} {s}" for m in metrics_of(summary) for s in ("best", "mean", "std")]
    rest = [c for c in summary.columns if c not in front and c not in metric_cols]
    return summary[front + metric_cols + rest]


# ---------------------------------------------------------------------------------------------- CLI
def parser() -> argparse.ArgumentParser:
    papers = ", ".join(reproduction_presets()) or "none"
    p = argparse.ArgumentParser(
        prog="python -m analysis.tables",
        description="Accuracy tables from results.csv files of experiments.sweep / experiments.reproduce: per "
        "(mixer, seed) the learning rate with the best validation accuracy, then the best and the "
        "mean ± std over seeds, per task configuration and extrapolation length; failed trials "
        "counted. Writes table.md, table.tex and table.csv.",
        epilog=f"Paper tables (--paper): {papers}. Example: python -m analysis.tables runs/repro/*/results.csv "
        "--paper pararnn-table6 --out runs/repro",
    )
    p.add_argument("results", nargs="+", help="results.csv files or sweep folders holding one")
    p.add_argument("--paper", help=f"put this paper table's numbers beside ours; one of: {papers}")
    p.add_argument("--out", type=Path, default=Path("analysis-out/tables"), help="output folder (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="do not print the Markdown table")
    return p


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parser().parse_args(argv)
    setup_logging()
    df = load_results(args.results)
    summary = summary_table(df, args.paper)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    sources = list(dict.fromkeys(df["source"]))
    md = to_markdown(summary, sources, args.paper)
    paths = [out / "table.md", out / "table.tex", out / "table.csv"]
    paths[0].write_text(md)
    paths[1].write_text(to_latex(summary))
    to_csv_frame(summary).to_csv(paths[2], index=False)
    if not args.quiet:
        sys.stdout.write(md)
    log.info(
        "%d trials from %d file(s), %d failed -> %s",
        len(df),
        len(sources),
        int((df["status"] != "ok").sum()),
        ", ".join(map(str, paths)),
    )
    return paths


if __name__ == "__main__":
    sys.exit(run(main))
