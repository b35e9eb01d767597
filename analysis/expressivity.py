"""``python -m analysis.expressivity RESULTS... --out DIR``: the expressivity map, mixers × tasks across lengths.

Reads ``results.csv`` files of length-extrapolation sweeps (e.g. ``python -m experiments.reproduce
state-tracking``). Per (task configuration, mixer, seed) the learning rate with the best validation
accuracy (``experiments.sweeps.results.best_over_lrs``); then per (task, mixer) and evaluation length the
best seed (``--aggregate best``, default) or the mean over seeds.

Metric (``--metric``): ``auto`` (the default) picks per task from its declared answer layout
(``Task.answer_positions``): ``last_acc`` (accuracy at each sequence's last scored position, i.e. of the
label or the running value over the whole length; ``acc`` where the results lack it) for tasks whose last
scored position holds the answer, and ``acc`` (the mean over every scored position) for tasks where each
scored position is an answer of its own: the string-output tasks of Deletang et al. (reverse string,
duplicate string, binary addition, ...: per output symbol, Deletang's accuracy), MQAR's queries, k-hop.
``last_acc``, ``acc`` or ``exact`` (whole sequences right) force one metric on every task; ``acc`` on a
task with dense targets includes the positions inside the training range.

Writes into ``--out`` (default ``analysis-out/expressivity``):

- ``expressivity-map.{png,pdf,csv}``: a heatmap, mixers × tasks, the accuracy written in each cell and
  coloured by accuracy above chance (``(acc - chance) / (1 - chance)``, so chance is the same colour on
  every task), one panel per factor of the longest training length (``--factors 2,6``: 2× and 6×; where
  a task was not evaluated at exactly that length, its nearest evaluated length within 1.5× of it,
  which the CSV names; none that near: the cell is empty);
- ``expressivity-lengths.{png,pdf,csv}``: per task, accuracy vs evaluation length for every mixer,
  with the longest training length and chance (the task's ``chance_accuracy``, ``1 / classes`` for
  the state-tracking tasks) marked.
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

import numpy as np
import pandas as pd

from analysis.cli import csv_list, run, setup_logging
from analysis.tables import label_tasks, load_results

log = logging.getLogger("analysis.expressivity")

METRICS = ("auto", "last_acc", "acc", "exact")
AGGREGATES = ("best", "mean")
#: task families in the map's column order (then by number of classes): the state-tracking tasks, then
#: Deletang et al.'s by level of the Chomsky hierarchy as their Table 2 (R, DCF, CS)
TASK_ORDER = (
    "parity",
    "modular_count",
    "word_problem",
    "even_pairs",
    "modular_arithmetic",
    "cycle_navigation",
    "stack_manipulation",
    "reverse_string",
    "modular_arithmetic_brackets",
    "solve_equation",
    "duplicate_string",
    "missing_duplicate",
    "odds_first",
    "binary_addition",
    "binary_multiplication",
    "compute_sqrt",
    "bucket_sort",
)


def _display_label(label: str, task: str, config: dict) -> str:
    """``word_problem`` -> ``S5 word``, ``modular_count`` -> ``count mod 3``; other tasks keep their label."""
    if task == "word_problem" and "group" in config:
        return re.sub(r" ?group=\S+", "", label).replace("word_problem", f"{config['group']} word", 1)
    if task == "modular_count" and "m" in config:
        return re.sub(r" ?\bm=\S+", "", label).replace("modular_count", f"count mod {config['m']}", 1)
    return label


def _chance(task: str, config: dict) -> float:
    from tasks import get_task

    try:
        return get_task(task, **{k: v for k, v in config.items() if k != "extrapolation"}).chance_accuracy
    except (ValueError, TypeError):
        return math.nan


def with_model_labels(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``mixer`` naming every axis that varies in the results besides the task: depth, width,
    precision, mixer options (``gru, 2 layers``, ``signed_deltanet, bf16-mixed``: rows of their own)."""
    from experiments.sweeps.results import model_labels, with_layers

    return with_layers(df).assign(mixer=model_labels(df))


def answer_positions(task: str) -> str:
    """The task's declared answer layout (``Task.answer_positions``: ``"last"`` or ``"every"``); ``"last"``
    for a task this installation does not know."""
    from tasks import TASKS

    return TASKS[task].answer_positions if task in TASKS else "last"


def pick_metric(df: pd.DataFrame, metric: str = "auto") -> str:
    """The metric to map for the rows ``df`` (one task): ``metric``, or for ``"auto"`` ``acc`` when the task
    answers at every scored position (``answer_positions``), else ``last_acc`` when any ``len<L>/last_acc``
    value exists, else ``acc``."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if metric != "auto":
        return metric
    if any(answer_positions(t) == "every" for t in set(df["task"].astype(str))):
        return "acc"
    has_last = any(re.fullmatch(r"len\d+/last_acc", c) and df[c].notna().any() for c in df.columns)
    return "last_acc" if has_last else "acc"


def metric_note(table: pd.DataFrame) -> str:
    """The metric of ``table``'s rows in words: ``last_acc``, or ``last_acc; acc: reverse_string, ...`` when
    tasks differ (the task labels after each metric but the most common)."""
    counts = table.drop_duplicates("task_label")["metric"].value_counts()
    main, others = counts.index[0], counts.index[1:]
    notes = [f"{m}: {', '.join(dict.fromkeys(table.loc[table['metric'] == m, 'task_label']))}" for m in others]
    return "; ".join([main, *notes])


def length_table(df: pd.DataFrame, metric: str = "auto", aggregate: str = "best") -> pd.DataFrame:
    """Long table, one row per (task configuration, mixer, evaluation length).

    Columns: ``task``, ``task_label``, ``mixer``, ``length``, ``train_max_len``, ``factor``
    (``length / train_max_len``), ``metric``, ``value`` (the ``aggregate`` over seeds), ``best``,
    ``mean``, ``std`` (ddof 0) over seeds, ``seeds``, ``lr`` (of the best seed), ``chance``.
    ``metric`` is ``pick_metric`` per task (``"auto"``: by the task's answer layout).
    ``ValueError`` when no finished trial has extrapolation lengths.
    """
    from experiments.sweeps.results import best_over_lrs

    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    df = df[df["extrapolation"].str.strip() != ""]
    if df.empty:
        raise ValueError("no length-extrapolation trials in the results (their 'extrapolation' column is empty)")
    metrics = {task: pick_metric(rows, metric) for task, rows in df.groupby(df["task"].astype(str), sort=False)}
    columns = {
        m: {int(x.group(1)): c for c in df.columns if (x := re.fullmatch(rf"len(\d+)/{m}", c))}
        for m in set(metrics.values())
    }
    for m, cols in columns.items():
        if not cols:
            raise ValueError(f"the results have no len<L>/{m} columns (metric {m!r})")
    df = label_tasks(with_model_labels(df))
    best = best_over_lrs(df.assign(task=df["task_label"]))
    if best.empty:
        raise ValueError("no finished ('ok') trials in the results")
    rows = []
    for (label, mixer), group in best.groupby(["task", "mixer"], sort=False):
        first = df[df["task_label"] == label].iloc[0]
        config = json.loads(first["task_full_config"])
        train_max = int(config["extrapolation"]["max_len"])
        metric_here = metrics[str(first["task"])]
        for length, col in sorted(columns[metric_here].items()):
            values = group[col].dropna()
            if values.empty:
                continue
            top = values.idxmax()
            rows.append(
                {
                    "task": first["task"],
                    "task_label": _display_label(label, first["task"], config),
                    "mixer": mixer,
                    "length": length,
                    "train_max_len": train_max,
                    "factor": length / train_max,
                    "metric": metric_here,
                    "best": float(values.max()),
                    "mean": float(values.mean()),
                    "std": float(values.std(ddof=0)),
                    "seeds": len(values),
                    "lr": float(group.loc[top, "lr"]),
                    "chance": _chance(first["task"], config),
                }
            )
    out = pd.DataFrame(rows)
    out.insert(out.columns.get_loc("best"), "value", out[aggregate])
    return _ordered(out, list(dict.fromkeys(df["mixer"])))


def _ordered(table: pd.DataFrame, mixers: list[str]) -> pd.DataFrame:
    """Tasks by family (parity, counting, word problems, others) then classes; mixers in ``mixers``' order."""
    family = {t: TASK_ORDER.index(t) if t in TASK_ORDER else len(TASK_ORDER) for t in table["task"]}
    tasks = (
        table.drop_duplicates("task_label")
        .assign(_f=lambda d: d["task"].map(family), _c=lambda d: -d["chance"].fillna(0))
        .sort_values(["_f", "_c"], kind="stable")["task_label"]
        .tolist()
    )
    table = table.assign(_t=table["task_label"].map(tasks.index), _m=table["mixer"].map(mixers.index))
    return table.sort_values(["_t", "_m", "length"], kind="stable").drop(columns=["_t", "_m"]).reset_index(drop=True)


#: the map uses an evaluated length for a factor's panel only within this ratio of ``factor × train_max_len``
NEAREST_RATIO = 1.5


def map_table(lengths: pd.DataFrame, factors: Sequence[float] = (2, 6)) -> pd.DataFrame:
    """The heatmap's numbers: per (task, mixer, factor) the row of ``lengths`` at ``factor × train_max_len``,
    or at the evaluated length nearest to it (in log length) when that is within ``NEAREST_RATIO`` of it
    (else no row: the cell stays empty, never another panel's number); adds ``target_factor`` and
    ``scaled`` (``(value - chance) / (1 - chance)``: 0 at chance on every task; the value where chance is
    unknown), which colours the map."""
    if not factors or min(factors) <= 0:
        raise ValueError(f"factors must be positive, got {list(factors)}")
    picked, substituted, absent = [], {}, {}
    for (task, _), group in lengths.groupby(["task_label", "mixer"], sort=False):
        for factor in factors:
            want = factor * group["train_max_len"].iloc[0]
            row = group.loc[(np.log(group["length"]) - math.log(want)).abs().idxmin()].copy()
            if abs(math.log(row["length"] / want)) > math.log(NEAREST_RATIO):
                absent[(task, want)] = factor
                continue
            if row["length"] != want:
                substituted[(task, want)] = row["length"]
            row["target_factor"] = factor
            picked.append(row)
    for (task, want), used in substituted.items():
        log.warning("%s: not evaluated at length %g; the map uses length %d", task, want, used)
    for (task, want), factor in absent.items():
        log.warning(
            "%s: no length near %g (%g× training) evaluated: its cell of that panel is empty", task, want, factor
        )
    if not picked:
        raise ValueError(f"no task was evaluated near {', '.join(f'{f:g}x' for f in factors)} its training length")
    table = pd.DataFrame(picked).reset_index(drop=True)
    chance = table["chance"].astype(float)
    table["scaled"] = np.where(chance.notna() & (chance < 1), (table["value"] - chance) / (1 - chance), table["value"])
    return table


# ---------------------------------------------------------------------------------------------- figures
def plot_map(table: pd.DataFrame, stem: Path) -> list[Path]:
    """Heatmap panels (one per factor), mixers × tasks, accuracy in % annotated."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from analysis.plotting import SEQUENTIAL, save_figure

    factors = list(dict.fromkeys(table["target_factor"]))  # a factor no task was evaluated near has no panel
    tasks, mixers = list(dict.fromkeys(table["task_label"])), list(dict.fromkeys(table["mixer"]))
    fig, axes = plt.subplots(
        1,
        len(factors),
        figsize=(2.2 + max(1.6, 0.9 * len(tasks)) * len(factors), 0.45 * len(mixers) + 1.6),
        squeeze=False,
        sharey=True,
    )
    for i, (ax, factor) in enumerate(zip(axes[0], factors)):
        sel = table[table["target_factor"] == factor]
        values = sel.pivot(index="mixer", columns="task_label", values="value").reindex(index=mixers, columns=tasks)
        scaled = sel.pivot(index="mixer", columns="task_label", values="scaled").reindex(index=mixers, columns=tasks)
        sns.heatmap(
            (100 * scaled).clip(lower=0),  # colour: above chance, so chance looks the same on every task
            ax=ax,
            vmin=0,
            vmax=100,
            cmap=SEQUENTIAL,
            annot=(100 * values).map(lambda v: "" if v != v else f"{v:.0f}"),  # text: the accuracy itself
            fmt="",
            linewidths=0.5,
            cbar=i == len(factors) - 1,
            cbar_kws={"label": "above chance (%): (acc - chance) / (1 - chance), below chance as 0"},
        )
        lengths = sorted(set(sel["length"]))
        at = f"L = {lengths[0]}" if len(lengths) == 1 else f"L = {lengths[0]}…{lengths[-1]}"
        shown = sel.drop_duplicates("task_label")
        missing = shown[shown["length"] != factor * shown["train_max_len"]]
        if missing.empty:
            ax.set_title(f"{factor:g}× the training length\n({at})")
        else:  # the runs have no length at this factor for some task: say what is shown instead
            ax.set_title(f"nearest to {factor:g}× the training length\n({at})")
            note = "; ".join(
                f"{r.task_label}: L = {r.length:g} ({r.length / r.train_max_len:.2g}×)" for r in missing.itertuples()
            )
            ax.text(
                0.5,
                -0.32,
                f"no length at {factor:g}× in these runs: {note}",
                transform=ax.transAxes,
                ha="center",
                va="top",
                fontsize="x-small",
                wrap=True,
            )
        ax.set_xlabel("")
        ax.set_ylabel("" if i else "mixer")
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(
        f"numbers: accuracy (%, {metric_note(table)}); colour: accuracy above chance; empty: not evaluated "
        f"near that length",
        y=1.02,
        fontsize="small",
    )
    return save_figure(fig, stem, table)


def plot_lengths(lengths: pd.DataFrame, stem: Path) -> list[Path]:
    """Accuracy vs evaluation length, one panel per task, one line per mixer."""
    from analysis.plotting import as_categories, mixer_lines, save_figure

    data = as_categories(_dodge_coinciding(lengths), ["task_label", "mixer"])
    grid = mixer_lines(data, "length", "task_label", aspect=1.25)  # each task its own evaluation lengths
    for task, ax in grid.axes_dict.items():
        sel = lengths[lengths["task_label"] == task]
        ax.axvline(sel["train_max_len"].iloc[0], color="0.4", linestyle=":", linewidth=1)
        if sel["chance"].notna().any():
            ax.axhline(sel["chance"].iloc[0], color="0.6", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ticks = sorted(set(sel["length"]))
        ax.set_xticks(ticks, [str(t) for t in ticks], rotation=45 if len(ticks) > 4 else 0)
        ax.minorticks_off()
        ax.set_title(str(task))
    grid.set(ylim=(-0.02, 1.02))
    grid.set_axis_labels("evaluation length", f"accuracy ({metric_note(lengths)})")
    grid.figure.suptitle(
        f"dotted: longest training length; dashed: chance; lines that coincide are drawn {DODGE:g} apart",
        y=1.02,
        fontsize="small",
    )
    return save_figure(grid.figure, stem, lengths)


#: vertical distance between lines that coincide in the lengths plot (accuracy units; the CSV keeps the values)
DODGE = 0.012


def _dodge_coinciding(lengths: pd.DataFrame) -> pd.DataFrame:
    """``lengths`` with the plotted ``value`` of mixers whose whole curve in a task equals another's (to
    1e-3) moved apart by ``DODGE`` each, centred on the true value, so that every line stays visible."""
    data = lengths.copy()
    for _, task in data.groupby("task_label", sort=False):
        curves = {
            m: tuple(g.sort_values("length")[["length", "value"]].round(3).itertuples(index=False))
            for m, g in task.groupby("mixer", sort=False)
        }
        groups: dict[tuple, list] = {}
        for mixer, curve in curves.items():
            groups.setdefault(curve, []).append(mixer)
        for mixers in groups.values():
            for k, mixer in enumerate(mixers if len(mixers) > 1 else []):
                rows = task.index[task["mixer"] == mixer]
                data.loc[rows, "value"] = data.loc[rows, "value"] + (k - (len(mixers) - 1) / 2) * DODGE
    return data


# ---------------------------------------------------------------------------------------------- CLI
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.expressivity",
        description="The expressivity map from results.csv files of length-extrapolation sweeps: a mixers × tasks "
        "heatmap of accuracy at 2x and 6x the training length, and accuracy vs length per task "
        "(PNG, PDF and the CSV of every plotted number).",
        epilog="Example: python -m analysis.expressivity runs/reproduce/state-tracking/*/results.csv --out docs/figures",
    )
    p.add_argument("results", nargs="+", help="results.csv files or sweep folders holding one")
    p.add_argument(
        "--out", type=Path, default=Path("analysis-out/expressivity"), help="output folder (default: %(default)s)"
    )
    p.add_argument(
        "--metric",
        choices=METRICS,
        default="auto",
        help="accuracy reading (default: per task, acc where every scored position is an answer (string "
        "outputs), else last_acc when present, else acc)",
    )
    p.add_argument("--aggregate", choices=AGGREGATES, default="best", help="over seeds (default: %(default)s)")
    p.add_argument(
        "--factors",
        type=csv_list(float),
        default=[2.0, 6.0],
        help="panels: multiples of the longest training length (default: 2,6)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parser().parse_args(argv)
    setup_logging()
    from analysis.plotting import setup_style

    lengths = length_table(load_results(args.results), args.metric, args.aggregate)
    table = map_table(lengths, args.factors)
    setup_style()
    args.out.mkdir(parents=True, exist_ok=True)
    paths = plot_map(table, args.out / "expressivity-map") + plot_lengths(lengths, args.out / "expressivity-lengths")
    log.info(
        "%d tasks x %d mixers (%s, %s over seeds) -> %s",
        lengths["task_label"].nunique(),
        lengths["mixer"].nunique(),
        metric_note(lengths),
        args.aggregate,
        args.out,
    )
    return paths


if __name__ == "__main__":
    sys.exit(run(main))
