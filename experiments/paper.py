"""The papers' tables and the comparison of our results with them: the one path behind
``experiments.reproduce`` and ``analysis.tables --paper``.

A reproduction preset (``experiments/presets/<name>.yaml``) holds the sweeps and a ``paper:`` section::

    tasks:   {khop2: {task: khop, task_options: {k: 2, vocab_size: 5}}, ...}    # the sweeps
    paper:
      source: "paper 000, Table 6 (best of 3 seeds)"
      metric: test/acc              # the results column the paper reports, or per sweep:
                                    # {default: test/acc, keep_nth: test/last_acc}; len{L}/exact: at
                                    # each sweep's longest evaluation length
      aggregate: best               # best seed, or mean_at_best_lr
      columns: {khop2: "k-hop k=2 V=5", ...}
      results: {flashgru: {khop2: [1.00, 17000], ...}, ...}   # [accuracy, parameters (optional)], or
                                    # {mean: 0.566, std: 0.036, params: 17000} (std, params optional)
      layers: 1                     # the depth of the paper's models (or per sweep: {parity: 2, ...})
      solved: 0.98                  # optional: the accuracy that counts as solved (the paper's threshold)
      tolerance: 0.15               # optional: instead, a cell agrees when within this of the paper,
                                    # or {std: 2, min: 0.05}: within max(2 x the paper's std, 0.05)
      awaiting: {...}               # optional, ignored: rows of models the suite cannot build yet

A sweep at another depth (the preset's ``layers``) shows as a departure row ``<mixer>, <N> layers``
beside the paper's rows; a paper whose table has rows at several depths keys those rows so
(``results: {"deltaproduct, 2 layers": {...}}``: the paper's row of that mixer at 2 layers, beside its
row at ``layers``), and the sweep runs the mixer at both depths (``mixer_layers``); two sweeps may
share a column title (``columns: {mqar: MQAR, mqar_deep: MQAR}``), so a departure of one mixer fills
that mixer's row of the paper's column.

``paper_entries(name)`` reads it as one ``PaperEntry`` per column; ``compare`` puts our number (the
paper's statistic over our seeds) beside the paper's for every (column, mixer); ``comparison_markdown``
renders it (pandas) with a verdict per cell: ✓ same side of the solved line (98% unless the preset says
``solved:``) as the paper, ✗ the paper reaches it and we do not, ↑ the reverse.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

#: an accuracy at or above this counts as "solved" when comparing with the paper
SOLVED = 0.98
#: a cell whose trials skipped more than this share of their updates (Newton check failures inside CUDA
#: graphs) is marked ⚠ and listed under the table
SKIPPED_WARNING = 0.01
AGGREGATES = ("best", "mean_at_best_lr")


@dataclasses.dataclass(frozen=True)
class PaperEntry:
    """One column of a paper table: a sweep of the preset, with every mixer's number."""

    entry: str  #: the preset's name for the sweep (e.g. ``khop2``)
    task: str
    options: dict[str, Any]  #: the sweep's task options (resolved by the preset; ``extrapolation`` if any)
    title: str  #: the paper's column title
    metric: str  #: the results.csv column the paper reports (``test/acc``, ``test/last_acc``, ``extrap/mean_acc``)
    aggregate: str  #: ``best`` (best seed) or ``mean_at_best_lr``
    source: str
    values: dict[str, tuple[float, float]]  #: mixer -> (accuracy in [0, 1], parameters or nan)
    layers: int = 1  #: the depth of the paper's models in this column
    #: mixer -> the paper's standard deviation over seeds (for cells given as ``{mean, std}``)
    stds: dict[str, float] = dataclasses.field(default_factory=dict)


def paper_tolerance(name: str) -> float | None:
    """The preset's ``paper: tolerance`` when it is one number (a cell agrees when within it of the
    paper's number), else ``None`` (no tolerance: a cell agrees when on the same side of 98%; or the
    per-cell rule of ``paper_agreement``)."""
    tolerance = load_reproduction(name)["paper"].get("tolerance")
    return None if tolerance is None or isinstance(tolerance, dict) else float(tolerance)


def paper_agreement(name: str) -> tuple[float, float] | None:
    """``(k, floor)`` for a preset's ``paper: tolerance: {std: k, min: floor}`` (a cell agrees when within
    ``max(k × the paper's std over seeds, floor)`` of the paper's mean), else ``None``."""
    tolerance = load_reproduction(name)["paper"].get("tolerance")
    if not isinstance(tolerance, dict):
        return None
    if set(tolerance) != {"std", "min"}:
        raise ValueError(f"preset {name!r}: paper: tolerance is a number or {{std: k, min: floor}}, got {tolerance!r}")
    return float(tolerance["std"]), float(tolerance["min"])


def tolerance_rule(name: str) -> Callable[[float], float | None]:
    """The preset's agreement margin as a function of a cell's paper std (the preset read once): its
    number, ``max(k × paper_std, floor)`` under ``paper_agreement`` (a missing std counts as 0), or
    ``None`` (the solved line decides)."""
    rule = paper_agreement(name)
    if rule is None:
        fixed = paper_tolerance(name)
        return lambda paper_std: fixed
    k, floor = rule
    return lambda paper_std: max(k * (paper_std if paper_std == paper_std else 0.0), floor)


def cell_tolerance(name: str, paper_std: float) -> float | None:
    """The agreement margin of one cell (``tolerance_rule``)."""
    return tolerance_rule(name)(paper_std)


def paper_cell(ref: Any) -> tuple[float, float, float]:
    """``(accuracy, parameters, std)`` of one ``paper: results`` cell: a number, ``[accuracy, parameters]``
    or ``{mean: accuracy, std: ..., params: ...}`` (missing parts ``nan``)."""
    nan = float("nan")
    if isinstance(ref, dict):
        unknown = set(ref) - {"mean", "std", "params"}
        if "mean" not in ref or unknown:
            raise ValueError(f"a paper cell as a mapping is {{mean, std, params}}, got {ref!r}")
        return float(ref["mean"]), float(ref.get("params", nan)), float(ref.get("std", nan))
    ref = list(ref) if isinstance(ref, (list, tuple)) else [ref]
    return float(ref[0]), float(ref[1]) if len(ref) > 1 else nan, nan


def paper_solved(name: str) -> float:
    """The preset's ``paper: solved`` (the accuracy that counts as solving a cell), else ``SOLVED``."""
    solved = float(load_reproduction(name)["paper"].get("solved", SOLVED))
    if not 0 < solved <= 1:
        raise ValueError(f"preset {name!r}: paper: solved must be in (0, 1], got {solved}")
    return solved


def model_label(mixer: str, layers: int, paper_layers: int = 1) -> str:
    """A table row's name: the mixer at the paper's depth, else ``<mixer>, <N> layer(s)`` (a departure)."""
    return mixer if layers == paper_layers else f"{mixer}, {layers} layer{'s' if layers > 1 else ''}"


def label_mixer(label: str) -> str:
    """The mixer of a ``model_label`` (``mamba, 2 layers`` -> ``mamba``)."""
    return label.split(", ")[0]


def paper_layers(paper: dict[str, Any], entry: str) -> int:
    """The depth of the paper's models for sweep ``entry`` (``layers:`` is a number or ``{entry: number}``)."""
    layers = paper.get("layers", 1)
    return int(layers.get(entry, 1) if isinstance(layers, dict) else layers)


def reproduction_presets() -> list[str]:
    """Names of the presets that carry a ``paper:`` section."""
    from experiments.sweeps.presets import available_presets, load_preset

    return [name for name in available_presets() if "paper" in load_preset(name)]


def load_reproduction(name: str) -> dict[str, Any]:
    """The raw reproduction preset; ``ValueError`` listing the known ones."""
    from experiments.sweeps.presets import load_preset

    known = reproduction_presets()
    if name not in known:
        raise ValueError(f"unknown reproduction {name!r}; known: {', '.join(known) or 'none'}")
    return load_preset(name)


def entry_metric(paper: dict[str, Any], entry: str, eval_lengths: list[int] | None = None) -> str:
    """The metric the paper reports for sweep ``entry`` (``metric:`` is a name or ``{default: ..., entry: ...}``).

    A name holding ``{L}`` (``len{L}/exact``) is at the sweep's longest evaluation length ``eval_lengths``:
    one template for sweeps that each train and test at their own length."""
    metric = paper.get("metric", "test/acc")
    if isinstance(metric, dict):
        metric = metric.get(entry, metric.get("default", "test/acc"))
    metric = str(metric)
    if "{L}" in metric:
        if not eval_lengths:
            raise ValueError(f"sweep {entry!r}: the paper metric {metric!r} needs the sweep's evaluation lengths")
        metric = metric.replace("{L}", str(max(eval_lengths)))
    return metric


def paper_entries(name: str) -> list[PaperEntry]:
    """The paper table of reproduction preset ``name``, one entry per sweep, in the paper's column order
    (``columns:``; a preset may list its sweeps in another order, e.g. longest first)."""
    from experiments.sweeps.presets import resolve_sweep

    data = load_reproduction(name)
    paper = data["paper"]
    aggregate = str(paper.get("aggregate", "best"))
    if aggregate not in AGGREGATES:
        raise ValueError(f"preset {name!r}: paper aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    entries = []
    for entry in data.get("tasks", {}):
        plan = resolve_sweep(entry, name)
        values, stds = {}, {}
        for mixer, by_entry in (paper.get("results") or {}).items():
            ref = (by_entry or {}).get(entry)
            if ref is None:
                continue
            accuracy, params, std = paper_cell(ref)
            values[mixer] = (accuracy, params)
            if std == std:
                stds[mixer] = std
        options = dict(plan.task_options)
        if plan.extrapolation:
            options["extrapolation"] = plan.extrapolation
        entries.append(
            PaperEntry(
                entry=entry,
                task=plan.task,
                options=options,
                title=str((paper.get("columns") or {}).get(entry, entry)),
                metric=entry_metric(paper, entry, (plan.extrapolation or {}).get("eval_lengths")),
                aggregate=aggregate,
                source=str(paper.get("source", name)),
                values=values,
                layers=paper_layers(paper, entry),
                stds=stds,
            )
        )
    order = list(paper.get("columns") or {})
    return sorted(entries, key=lambda e: order.index(e.entry) if e.entry in order else len(order))


def full_task_config(task: str, options: dict[str, Any]) -> dict[str, Any]:
    """The task's whole configuration (defaults filled in; ``None`` defaults replaced by the task's
    effective value, e.g. k-hop's vocabulary); the raw ``options`` if the task cannot be built."""
    from tasks import get_task

    opts = {k: v for k, v in options.items() if k != "extrapolation"}
    try:
        t = get_task(task, **opts)
        config = dataclasses.asdict(t.config)
        for key, value in config.items():
            if value is None and hasattr(t, key):
                config[key] = getattr(t, key)
    except (ValueError, TypeError):
        config = dict(opts)
    if options.get("extrapolation"):
        config["extrapolation"] = dict(sorted(options["extrapolation"].items()))
    return config


def match_entry(task: str, config: dict[str, Any], entries: list[PaperEntry]) -> PaperEntry | None:
    """The entry of ``entries`` for a results group of ``task`` with full ``config``, or ``None``.

    Only the options that tell the paper's columns of one task apart are compared (k-hop: ``k``
    and the vocabulary), so a shortened run (other ``seq_len``) still lines up with its column; but
    the protocol must agree: a length-extrapolation run only matches an extrapolation column.
    """
    extrap = bool(config.get("extrapolation"))
    same = [e for e in entries if e.task == task and bool(e.options.get("extrapolation")) == extrap]
    if len(same) <= 1:
        return same[0] if same else None
    configs = [full_task_config(e.task, e.options) for e in same]
    keys = sorted({k for c in configs for k in c if len({json.dumps(x.get(k), sort_keys=True) for x in configs}) > 1})
    for entry, entry_config in zip(same, configs):
        if all(
            json.dumps(config.get(k), sort_keys=True) == json.dumps(entry_config.get(k), sort_keys=True) for k in keys
        ):
            return entry
    return None


def selection_column(metric: str) -> str:
    """The validation accuracy that picks the learning rate for ``metric``: that of the weights it scores
    (``final_val_acc`` for the final weights' ``final/...`` metrics, else ``best_val_acc``)."""
    return "final_val_acc" if metric.startswith("final/") else "best_val_acc"


def aggregate(df: pd.DataFrame, metric: str, how: str, layers: int = 1) -> pd.DataFrame:
    """Per model of ``df`` (one sweep's rows; ``mixer``: ``model_label`` of its mixer and depth, the
    paper's depth ``layers``): ``value`` (best over seeds, per seed at the lr with the best
    validation accuracy; or the mean over seeds at the lr with the best mean validation accuracy; the
    validation accuracy of the weights ``metric`` scores: the final weights' for a ``final/...`` metric,
    else the best checkpoint's),
    ``std``, ``params``, ``seeds``, ``lr``, ``steps`` (median), ``failed``, ``missing``, ``skipped`` (the
    share of the chosen trials' optimizer steps that skipped their update: a Newton solve failed its
    check inside a CUDA graph; 0 without Newton statistics), ``climbing`` (how many chosen trials were
    still climbing when their budget ran out: ``still_climbing``)."""
    from experiments.sweeps.results import best_over_lrs, with_layers

    rows = []
    df = with_layers(df) if len(df) else df
    val = selection_column(metric)
    for name, depth in dict.fromkeys(zip(df["mixer"], df["layers"])) if len(df) else []:
        mine, mixer = df[(df["mixer"] == name) & (df["layers"] == depth)], model_label(name, int(depth), layers)
        counts = {
            "failed": int((mine["status"] == "failed").sum()),
            "missing": int((~mine["status"].isin(["ok", "failed"])).sum()),
        }
        sel = mine[mine["status"] == "ok"]
        if sel.empty or metric not in sel or sel[metric].isna().all():
            rows.append(
                {
                    "mixer": mixer,
                    "value": float("nan"),
                    "std": float("nan"),
                    "params": float("nan"),
                    "seeds": 0,
                    "lr": float("nan"),
                    "steps": float("nan"),
                    "skipped": 0.0,
                    "climbing": 0,
                    **counts,
                }
            )
            continue
        if how == "mean_at_best_lr":
            lr = float(sel.groupby("lr")[val].mean().idxmax())
            chosen = sel[sel["lr"] == lr]
            value, std = chosen[metric].mean(), chosen[metric].std(ddof=0)
        else:
            chosen = best_over_lrs(sel, by=val)
            value, std = chosen[metric].max(), chosen[metric].std(ddof=0)
            lr = float(chosen.loc[chosen[metric].idxmax(), "lr"])
        skipped = chosen["newton/skipped_steps"].fillna(0).sum() if "newton/skipped_steps" in chosen else 0.0
        rows.append(
            {
                "mixer": mixer,
                "value": float(value),
                "std": float(std),
                "params": int(chosen["n_params"].iloc[0]),
                "seeds": int(chosen["seed"].nunique()),
                "lr": lr,
                "steps": int(chosen["steps"].median()),
                "skipped": float(skipped / max(1, chosen["steps"].sum())),
                "climbing": int(still_climbing(chosen).sum()),
                **counts,
            }
        )
    return pd.DataFrame(rows)


#: a trial whose best validation came in this last share of its step budget, which it ran to the end
#: below the early-stop accuracy, was still climbing: a longer budget may have changed its cell
CLIMBING_TAIL = 0.1


def still_climbing(trials: pd.DataFrame, early_stop: float = 0.999) -> pd.Series:
    """Per trial (results rows with ``steps``, ``max_steps``, ``best_step``, ``best_val_acc``): ran its whole
    budget, its best validation accuracy is below ``early_stop`` and came in the last ``CLIMBING_TAIL``
    of the budget. False where a column is missing."""
    if not {"steps", "max_steps", "best_step", "best_val_acc"} <= set(trials.columns):
        return pd.Series(False, index=trials.index)
    return (
        (trials["steps"] >= trials["max_steps"])
        & (trials["best_val_acc"] < early_stop)
        & (trials["best_step"] >= (1 - CLIMBING_TAIL) * trials["max_steps"])
    )


def evaluated_metric(metric: str, df: pd.DataFrame) -> str:
    """``metric`` when ``df`` has values of it; for a length metric that was not evaluated (``--quick``
    evaluates shorter lengths) the evaluated one of the longest lengths: ``len<L>/<m>`` -> ``len<K>/<m>``
    of the largest ``K``, ``range<a>-<b>/<m>`` -> the ``range<c>-<d>/<m>`` of the largest ``d`` (the final
    weights' ``final/...`` alike); else ``metric``."""
    if metric in df and df[metric].notna().any():
        return metric
    m = re.fullmatch(r"(final/)?(len|range)[\d-]+/(.+)", metric)
    if not m:
        return metric
    weights, kind, name = re.escape(m.group(1) or ""), m.group(2), re.escape(m.group(3))
    pattern = rf"{weights}len(\d+)/{name}" if kind == "len" else rf"{weights}range(\d+)-(\d+)/{name}"
    found = [
        (int(hit.groups()[-1]), c) for c in df.columns if (hit := re.fullmatch(pattern, c)) and df[c].notna().any()
    ]
    return max(found)[1] if found else metric


def compare(name: str, results: dict[str, pd.DataFrame], planned: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """Long table: one row per (entry, mixer) with ours and the paper's value and parameters. With
    ``planned`` (entry -> the mixers its sweep trains), a paper model that an entry does not train (a
    variant preset's subset) has no row there, so it is not reported as missing."""
    entries = {e.entry: e for e in paper_entries(name)}
    rows = []
    tolerance = tolerance_rule(name)
    for entry_name, df in results.items():
        entry = entries.get(entry_name)
        if entry is None:
            continue
        metric = evaluated_metric(entry.metric, df)
        ours = aggregate(df, metric, entry.aggregate, entry.layers).set_index("mixer") if len(df) else pd.DataFrame()
        for mixer in dict.fromkeys([*entry.values, *(ours.index if len(ours) else [])]):
            paper_value, paper_params = entry.values.get(mixer, (float("nan"), float("nan")))
            paper_std = entry.stds.get(mixer, float("nan"))
            r = ours.loc[mixer] if len(ours) and mixer in ours.index else None
            if r is None and planned is not None and label_mixer(mixer) not in planned.get(entry_name, []):
                continue
            get = lambda k, default=float("nan"): r[k] if r is not None else default  # noqa: E731
            rows.append(
                {
                    "entry": entry_name,
                    "mixer": mixer,
                    "metric": metric,
                    "ours": float(get("value")),
                    "ours_std": float(get("std")),
                    "ours_params": get("params"),
                    "seeds": int(get("seeds", 0)),
                    "lr": get("lr"),
                    "median_steps": get("steps"),
                    "skipped": float(get("skipped", 0.0)),
                    "climbing": int(get("climbing", 0)),
                    "failed": int(get("failed", 0)),
                    "missing": int(get("missing", 0)),
                    "paper": paper_value,
                    "paper_params": paper_params,
                    "paper_std": paper_std,
                    "tolerance": _none_to_nan(tolerance(paper_std)),
                }
            )
    return pd.DataFrame(rows)


def _none_to_nan(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def _row_tolerance(row: Any, default: float | None) -> float | None:
    """A comparison row's agreement margin (``None``: the solved line decides); ``default`` for a table
    written before rows carried one."""
    if "tolerance" not in row:
        return default
    t = row["tolerance"]
    return None if t != t else float(t)


def verdict(ours: float, paper: float, tolerance: float | None = None, solved: float = SOLVED) -> str:
    """``✓`` same side of the ``solved`` line as the paper, ``✗`` paper solved it and we did not, ``↑`` the reverse.
    With ``tolerance`` (a preset's ``paper: tolerance``, or a cell's ``cell_tolerance``): ``✓`` within it of
    the paper (the bound included), else ``✗`` below, ``↑`` above."""
    if ours != ours or paper != paper:
        return ""
    if tolerance is not None:
        return "✓" if abs(ours - paper) <= tolerance + 1e-9 else ("✗" if ours < paper else "↑")  # inclusive
    if (ours >= solved) == (paper >= solved):
        return "✓"
    return "✗" if paper >= solved else "↑"


def _pct(x: float) -> str:
    return "–" if x != x else f"{100 * x:.0f}%" if x in (0.0, 1.0) else f"{100 * x:.1f}%"


def _k(n: float) -> str:
    return "" if n != n else f" ({n / 1000:.1f}k)"


#: where the committed reports (``<name>.md``, written with ``--copy-to``) and their hand-written per-cell
#: evidence (``<name>.evidence.md``: what was measured for the cells that differ, with the commands) live
REPORTS = Path(__file__).resolve().parents[1] / "benchmarks" / "reproduction"


def evidence_link(name: str, reports: Path | None = None) -> str | None:
    """The report's line linking preset ``name``'s evidence file when ``reports`` (default ``REPORTS``)
    holds one, else None. The link is relative to that folder, where the committed report sits beside
    its evidence; its text is the repository path, for a report read elsewhere (``runs/``)."""
    reports = REPORTS if reports is None else reports
    evidence = f"{name}.evidence.md"
    if not (reports / evidence).is_file():
        return None
    return (
        "Evidence for the cells that differ (what was measured, with the commands): "
        f"[benchmarks/reproduction/{evidence}]({evidence})."
    )


def comparison_frame(name: str, table: pd.DataFrame) -> pd.DataFrame:
    """The side-by-side table (strings): a row per model in the order of the paper's ``results`` (each
    mixer's departures at other depths after it; mixers the paper lacks last), a column per paper column
    title, in the paper's order."""
    entries = [e for e in paper_entries(name) if e.entry in set(table["entry"])]
    mean = entries and entries[0].aggregate == "mean_at_best_lr"
    titles = {e.title: [x.entry for x in entries if x.title == e.title] for e in entries}
    tolerance, solved = paper_tolerance(name), paper_solved(name)
    out: dict[str, list[str]] = {"model": []}
    for title in titles:
        out[title] = []
    paper_order = list((load_reproduction(name).get("paper") or {}).get("results") or {})
    rank = {m: i for i, m in enumerate(paper_order)}
    # the paper's row order (rows keyed "<mixer>, <N> layers" included); a departure at another depth
    # ("mamba, 2 layers") after its mixer's row
    rows = sorted(
        dict.fromkeys(table["mixer"]),
        key=lambda label: rank.get(label, rank.get(label_mixer(label), len(rank))),
    )
    for mixer in rows:
        out["model"].append(mixer)
        for title, names in titles.items():
            r = table[table["entry"].isin(names) & (table["mixer"] == mixer)]
            if r.empty:
                out[title].append("")
                continue
            r = r.iloc[0]
            ours = _pct(r["ours"]) + (
                f" ± {100 * r['ours_std']:.1f}" if mean and r["ours_std"] == r["ours_std"] else ""
            )
            gaps = "".join(f", {int(r[k])} {k}" for k in ("failed", "missing") if r[k])
            warn = " ⚠" if r["skipped"] > SKIPPED_WARNING else ""
            std = r["paper_std"] if "paper_std" in r else float("nan")
            paper = _pct(r["paper"]) + (f" ± {100 * std:.1f}" if std == std else "")
            mark = verdict(r["ours"], r["paper"], _row_tolerance(r, tolerance), solved)
            out[title].append(
                f"{ours}{_k(r['ours_params'])} / {paper}{_k(r['paper_params'])} "
                f"{mark}{warn}{' (' + gaps[2:] + ')' if gaps else ''}".strip()
            )
    return pd.DataFrame(out)


def comparison_markdown(name: str, table: pd.DataFrame, meta: dict[str, Any]) -> str:
    """The Markdown report: a header (device, date, budget; the link to the preset's evidence file where
    ``REPORTS`` holds one), the side-by-side table, the differing cells."""
    data = load_reproduction(name)
    entries = paper_entries(name)
    shown = dict(zip(table["entry"], table["metric"])) if len(table) else {}
    metrics = sorted({shown[e.entry] for e in entries if e.entry in shown})
    substituted = sorted(
        {(e.metric, shown[e.entry]) for e in entries if e.entry in shown and shown[e.entry] != e.metric}
    )
    weights = "final weights" if any(m.startswith("final/") for m in metrics) else "best checkpoints"
    statistic = (
        f"best over seeds (per seed the lr whose {weights} have the best validation accuracy)"
        if entries[0].aggregate == "best"
        else f"mean over seeds at the learning rate whose {weights} have the best mean validation accuracy (± std)"
    )
    tolerance, solved, rule = paper_tolerance(name), paper_solved(name), paper_agreement(name)
    margin = (
        f"max({rule[0]:g} × the paper's std over seeds, {100 * rule[1]:g} points)"
        if rule
        else f"{tolerance:g}"
        if tolerance is not None
        else None
    )
    legend = "Each cell: ours (parameters) / paper (parameters); " + (
        f"✓ within {margin} of the paper, ✗ lower, ↑ higher."
        if margin is not None
        else f"✓ same side of {solved:.0%} as the paper, ✗ the paper reaches ≥ {solved:.0%} and we do not, ↑ we reach "
        f"≥ {solved:.0%} where the paper does not."
    )
    lines = [
        f"# Reproduction: {name}",
        "",
        f"Paper: {entries[0].source}.",
        "",
        *([evidence, ""] if (evidence := evidence_link(name)) else []),
        f"- Device: {meta.get('device', '?')}; date: {meta.get('date', '?')}; "
        + (
            f"workers: {meta.get('workers', '?')}; wall time of this invocation: {meta.get('wall_min', float('nan')):.1f} min; "
            if meta.get("ran", True)
            else "table written from stored results; "
        )
        + f"time with trials running, over every invocation: {meta.get('busy_min', float('nan')):.1f} min"
        + (
            f" (and up-front model checks: {meta['check_min']:.1f} min over {meta['checks']} invocation(s))"
            if meta.get("checks")
            else ""
        )
        + "; "
        + f"trials' own training+test time, summed: {meta.get('trial_min', float('nan')):.1f} min"
        + (
            f" ({meta['resumed']} trials resumed from a checkpoint: their last invocation only)"
            if meta.get("resumed")
            else ""
        )
        + (
            f"; those times, whole trials, laid on {meta['scheduled_workers']} worker(s) in claim order: "
            f"{meta['scheduled_min']:.1f} min for one uninterrupted run."
            if not pd.isna(meta.get("scheduled_min", float("nan")))
            else "."
        ),
        f"- Budget: {meta.get('budget', '')}",
        f"- Cells: {meta.get('done', '?')} of {meta.get('cells', '?')} finished; versions: {meta.get('versions', '')}.",
        "",
        f"Metric: {', '.join(f'`{m}`' for m in metrics)} "
        + (
            "(per column: "
            + ", ".join(dict.fromkeys(f"{e.title} `{shown[e.entry]}`" for e in entries if e.entry in shown))
            + "); "
            if len(metrics) > 1
            else "; "
        )
        + f"{statistic}."
        + "".join(
            f" The paper's `{paper}` was not evaluated in this run: shown is `{ours}`, at the longest lengths this run evaluated."
            for paper, ours in substituted
        ),
        legend,
        "",
        comparison_frame(name, table).to_markdown(index=False, disable_numparse=True),
    ]
    marks = [verdict(r["ours"], r["paper"], _row_tolerance(r, tolerance), solved) for _, r in table.iterrows()]
    differ = table[[m in ("✗", "↑") for m in marks]]
    if margin is not None:
        compared = int(sum(o == o and p == p for o, p in zip(table["ours"], table["paper"])))
        lines += ["", f"{compared - len(differ)} of {compared} cells within {margin} of the paper."]
    lines += meta.get("claims", [])  # the preset's claims checked on the cells (experiments.claims)
    lines += [
        "",
        f"Preset: `experiments/presets/{name}.yaml`. {' '.join(str(data.get('description', '')).split())}",
        "",
    ]
    if len(differ):
        lines.append(
            "Cells that differ from the paper (✗/↑): "
            + "; ".join(
                f"{r.entry}/{r.mixer} {_pct(r.ours)} vs {_pct(r.paper)} (median steps {r.median_steps:g})"
                for r in differ.itertuples()
            )
            + "."
        )
    climbing = table[table["climbing"] > 0] if "climbing" in table else table.iloc[:0]
    lines.append(
        "Cells still climbing when their budget ran out (a chosen trial's best validation in the last "
        f"{CLIMBING_TAIL:.0%} of its steps, below the early stop): "
        + ("; ".join(f"{r.entry}/{r.mixer} ({r.climbing} of {r.seeds} seeds)" for r in climbing.itertuples()) or "none")
        + "."
    )
    skipping = table[table["skipped"] > SKIPPED_WARNING]
    if len(skipping):
        lines.append(
            "⚠ Trials that skipped updates (a Newton solve failed its residual check inside a CUDA graph; "
            "their accuracy is that of a model trained on fewer steps than the budget): "
            + "; ".join(f"{r.entry}/{r.mixer} {100 * r.skipped:.0f}% of the steps" for r in skipping.itertuples())
            + "."
        )
    unfinished = table[(table["missing"] > 0) | (table["seeds"] == 0)]
    if len(unfinished):
        lines.append(f"**{len(unfinished)} cell(s) of the table are incomplete** (missing trials): re-run the command.")
    return "\n".join(lines) + "\n"


def parameter_counts(preset: str) -> pd.DataFrame:
    """Our parameter count for every (sweep entry, mixer) of ``preset``, built as its trials build the
    model, next to the paper's (the second number of the preset's ``paper: results`` cell, or None)."""
    from experiments.sweeps.presets import load_preset, resolve_sweep
    from experiments.trial.model import ModelConfig, SequenceModel, count_parameters
    from tasks import get_task

    data = load_preset(preset)
    paper = (data.get("paper") or {}).get("results", {})
    rows = []
    for entry in data.get("tasks", {}):
        plan = resolve_sweep(entry, preset)
        task = get_task(plan.task, **plan.task_options)
        vocab = task.vocab_size + (1 if plan.extrapolation else 0)  # the pad token
        depth = paper_layers(data.get("paper") or {}, entry)
        for mixer in plan.mixers:
            for layers in plan.depths(mixer):
                config = ModelConfig.of(plan.shape(mixer, layers), vocab, task.num_classes)
                cell = paper.get(model_label(mixer, layers, depth), {}).get(entry)
                params = paper_cell(cell)[1] if cell is not None else float("nan")
                rows.append(
                    {
                        "entry": entry,
                        "mixer": model_label(mixer, layers, depth),
                        "ours": count_parameters(SequenceModel(config)),
                        "paper": int(params) if params == params else None,
                    }
                )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.paper PRESET``: a preset's parameter counts, ours / the paper's (difference)."""
    from experiments.cli import Parser, run_cli

    parser = Parser(prog="python -m experiments.paper", description=main.__doc__)
    parser.add_argument("preset", help="a preset name, e.g. pararnn-table6")
    args = parser.parse_args(argv)

    def run() -> None:
        rows = parameter_counts(args.preset)
        rows["cell"] = [
            f"{o:,}" + ("" if p is None or p != p else f" / {int(p):,} ({(o - p) / p:+.1%})")
            for o, p in zip(rows["ours"], rows["paper"])
        ]
        table = rows.pivot(index="mixer", columns="entry", values="cell").reindex(
            index=list(dict.fromkeys(rows["mixer"])), columns=list(dict.fromkeys(rows["entry"]))
        )
        print("Parameters: ours / paper (difference)\n")
        print(table.fillna("–").to_markdown())

    return run_cli(run, "")


if __name__ == "__main__":
    import sys

    sys.exit(main())
