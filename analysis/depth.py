"""``python -m analysis.depth RESULTS... [--metric len{L}/exact] [--threshold 0.9] [--out DIR]``: the
minimum depth that solves a task, against sequence length (Merrill, Petty, Sabharwal 2024, Fig. 3).

Reads ``results.csv`` files of sweeps over depth (the ``layers`` column, an integer; a file without it
is depth 1 throughout) and evaluation lengths (the ``len<L>/<metric>`` columns): one model evaluated at
several lengths, or one sweep per training length (sweeps that differ only in their lengths form one
group: ``group_names``). Per group, mixer, depth and length it takes the best over seeds and
learning rates: by default each seed's learning rate is the one with the best validation accuracy in
its sweep (``--lr val``, as every table of the suite), ``--lr max`` takes the best value over all learning rates.
Then per (group, mixer, length) the smallest depth whose value reaches ``--threshold``; where no depth
tried does, the figure puts a cross above the largest depth, in a band labelled ``none of 1..N``.

The default metric ``len{L}/exact`` is Merrill et al.'s: their "sequence accuracy" counts a sequence
right when every prefix product is (``jopetty/sfirah`` ``metrics.sequence_accuracy``), which is this
suite's ``exact`` for running targets.

Writes ``NAME.{png,pdf,csv}`` (``--name``, default ``depth``) into ``--out`` (default
``analysis-out/depth``): one panel per group, a line per mixer (distinct markers, a small vertical
offset per mixer so that coinciding lines stay visible; the CSV holds the true depth and the plotted
position).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cli import run, setup_logging
from analysis.tables import label_tasks, load_results
from experiments.sweeps.results import model_labels, varying_axes

log = logging.getLogger("analysis.depth")

LR_CHOICES = ("val", "max")


def metric_columns(df: pd.DataFrame, metric: str) -> dict[int, str]:
    """``{length: column}`` for the template ``metric`` (``len{L}/exact`` -> ``len64/exact``, ...)."""
    if metric.count("{L}") != 1:
        raise ValueError(f"metric must hold {{L}} once where the length goes, e.g. len{{L}}/exact; got {metric!r}")
    pattern = re.compile(re.escape(metric).replace(re.escape("{L}"), r"(\d+)"))
    columns = {int(m.group(1)): c for c in df.columns if (m := pattern.fullmatch(c))}
    if not columns:
        found = sorted({re.sub(r"^len\d+/", "len{L}/", c) for c in df.columns if re.match(r"len\d+/", c)})
        raise ValueError(f"the results have no column matching {metric!r}; metrics there: {', '.join(found) or 'none'}")
    return dict(sorted(columns.items()))


def _depths(df: pd.DataFrame) -> pd.Series:
    if "layers" not in df:
        return pd.Series(1, index=df.index)
    layers = pd.to_numeric(df["layers"], errors="coerce").fillna(1)
    if (layers < 1).any() or (layers != layers.round()).any():
        raise ValueError(f"the layers column must hold positive integers, got {sorted(set(layers))}")
    return layers.astype(int)


def group_names(df: pd.DataFrame) -> pd.Series:
    """Each row's group: its sweep entry; sweeps that differ only in their lengths (one model per
    training length, as Merrill et al. train) share one group, named by their entries' common prefix
    (``a5_8``, ``a5_32`` -> ``a5``), else by the task and its options. Without entries: the task label."""
    if "task_config" not in df:  # results without task options: the entry (or the task) is all we know
        return (df["entry"] if "entry" in df and df["entry"].notna().all() else df["task"]).astype(str)
    labels = label_tasks(df.assign(extrapolation=""))["task_label"]
    if "entry" not in df or df["entry"].isna().any():
        return labels
    entries = df["entry"].astype(str)
    names = {}
    for label, mine in entries.groupby(labels, sort=False):
        distinct = list(dict.fromkeys(mine))
        prefix = os.path.commonprefix(distinct).rstrip("_-") if len(distinct) > 1 else distinct[0]
        names[label] = prefix or label
    return labels.map(names)


def best_values(df: pd.DataFrame, metric: str = "len{L}/exact", lr: str = "val") -> pd.DataFrame:
    """Long table: per (group, mixer, layers, length) the best over seeds (``lr``: see the module docstring).

    Columns ``group``, ``mixer``, ``layers``, ``length``, ``value``, ``seeds`` (seeds with a value).
    """
    if lr not in LR_CHOICES:
        raise ValueError(f"lr must be one of {', '.join(LR_CHOICES)}, got {lr!r}")
    columns = metric_columns(df, metric)
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        raise ValueError("no finished ('ok') trials in the results")
    ok["group"] = group_names(ok)
    ok["layers"] = _depths(ok)
    # models that differ in anything but depth (width, precision, options) are lines of their own
    ok["mixer"] = model_labels(ok, [a for a in varying_axes(ok) if a != "layers"])
    keys = ["group", "mixer", "layers"]
    if lr == "val":
        # a learning rate is chosen per cell: per sweep (one per training length), mixer, depth and seed
        sweep = [c for c in ("entry", "extrapolation") if c in ok and ok[c].notna().all()][:1]
        ranked = ok.assign(_rank=ok["best_val_acc"].fillna(-1.0) if "best_val_acc" in ok else 0.0)
        ok = ok.loc[ranked.groupby([*sweep, *keys, "seed"], sort=False)["_rank"].idxmax()]
    long = ok.melt(id_vars=[*keys, "seed"], value_vars=list(columns.values()), var_name="column", value_name="value")
    long["length"] = long["column"].map({c: length for length, c in columns.items()})
    long = long.dropna(subset=["value"])
    if long.empty:
        raise ValueError(f"no finished trial has a value in the {metric} columns")
    out = (
        long.groupby([*keys, "length"], sort=False).agg(value=("value", "max"), seeds=("seed", "nunique")).reset_index()
    )
    return out


def min_depth_table(values: pd.DataFrame, threshold: float = 0.9) -> pd.DataFrame:
    """Per (group, mixer, length): ``min_layers`` (the smallest depth with ``value >= threshold``, NaN when
    none), ``reached``, ``value_at_min``, ``best_value`` (over the depths), ``layers_tried``, ``max_layers``."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    rows = []
    for (group, mixer, length), sel in values.groupby(["group", "mixer", "length"], sort=False):
        sel = sel.sort_values("layers")
        good = sel[sel["value"] >= threshold]
        tried = sel["layers"].tolist()
        rows.append(
            {
                "group": group,
                "mixer": mixer,
                "length": int(length),
                "threshold": threshold,
                "min_layers": float(good["layers"].iloc[0]) if len(good) else np.nan,
                "reached": bool(len(good)),
                "value_at_min": float(good["value"].iloc[0]) if len(good) else np.nan,
                "best_value": float(sel["value"].max()),
                "layers_tried": ",".join(map(str, tried)),
                "max_layers": max(tried),
            }
        )
    out = pd.DataFrame(rows)
    groups, mixers = list(dict.fromkeys(values["group"])), list(dict.fromkeys(values["mixer"]))
    out = out.assign(_g=out["group"].map(groups.index), _m=out["mixer"].map(mixers.index))
    return out.sort_values(["_g", "_m", "length"], kind="stable").drop(columns=["_g", "_m"]).reset_index(drop=True)


def _depths_text(layers: Sequence[int]) -> str:
    """``[1]`` -> ``"depth 1"``, ``[1, 2, 4]`` -> ``"depths 1,2,4"``."""
    return f"depth {layers[0]}" if len(layers) == 1 else "depths " + ",".join(map(str, layers))


def _tried_label(layers: Sequence[int]) -> str:
    layers = sorted(set(layers))
    if layers == list(range(1, layers[-1] + 1)):
        return f"none of 1..{layers[-1]}" if len(layers) > 1 else "not with 1"
    return "none of " + ",".join(map(str, layers))


def plot_depth(table: pd.DataFrame, stem: Path, metric: str) -> list[Path]:
    """One panel per group: minimum depth vs length per mixer; lengths no depth solves sit in a band above."""
    import matplotlib.pyplot as plt

    from analysis.plotting import name_styles, save_figure

    groups, mixers = list(dict.fromkeys(table["group"])), list(dict.fromkeys(table["mixer"]))
    colours, markers = name_styles(mixers)
    spread = min(0.4, 0.1 * (len(mixers) - 1))  # total vertical spread of the mixers' offsets
    offsets = dict(zip(mixers, np.linspace(-spread / 2, spread / 2, len(mixers)) if len(mixers) > 1 else [0.0]))
    cols = min(3, len(groups))
    rows_n = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.2 * rows_n + 0.8), squeeze=False)
    plotted, fewer = [], {}  # fewer: mixers tried at fewer depths than others in a panel, with theirs
    for ax, group in zip(axes.flat, groups):
        sel = table[table["group"] == group]
        top = int(sel["max_layers"].max())
        none_y, unsolved = top + 1, bool((~sel["reached"]).any())
        for mixer in mixers:
            part = sel[sel["mixer"] == mixer]
            if part.empty:
                continue
            hit = part["reached"].to_numpy()
            y = np.where(hit, part["min_layers"], none_y) + offsets[mixer]
            plotted.append(part.assign(plotted_y=y))
            x = part["length"].to_numpy()
            # the line joins solved lengths only; an unsolved length breaks it and shows as a cross in the band
            ax.plot(x, np.where(hit, y, np.nan), color=colours[mixer], linewidth=1.3, alpha=0.85, zorder=2)
            ax.scatter(
                x[hit],
                y[hit],
                color=colours[mixer],
                marker=markers[mixer],
                s=38,
                zorder=3,
                edgecolor="white",
                linewidth=0.5,
            )
            ax.scatter(x[~hit], y[~hit], color=colours[mixer], marker="x", s=46, linewidth=1.6, zorder=3)
        if unsolved:
            ax.axhspan(top + 0.5, top + 1.5, color="0.92", zorder=0)
        tried = [int(v) for s in sel["layers_tried"] for v in s.split(",")]
        # a mixer tried at fewer depths than another is not "none of" depths it never ran: say whose
        own = {m: sorted({int(v) for s in g["layers_tried"] for v in s.split(",")}) for m, g in sel.groupby("mixer")}
        band = _tried_label(tried) if len({tuple(v) for v in own.values()}) == 1 else "none of the depths tried"
        for mixer, depths in own.items():
            if depths != sorted(set(tried)):
                fewer[mixer] = depths
        ticks = list(range(1, top + 1)) + ([none_y] if unsolved else [])
        ax.set_yticks(ticks, [str(t) for t in range(1, top + 1)] + ([band] if unsolved else []))
        ax.set_ylim(0.5, (none_y if unsolved else top) + 0.5)
        lengths = sorted(set(sel["length"]))
        if lengths[-1] / lengths[0] >= 8:
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        ax.set_xticks(lengths, [str(v) for v in lengths], rotation=45 if len(lengths) > 5 else 0)
        ax.set_title(str(group))
        ax.set_xlabel("sequence length")
        ax.set_ylabel("minimum layers")
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_visible(False)
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=colours[m], marker=markers[m], label=f"{m} (tried at {_depths_text(fewer[m])})")
        if m in fewer
        else Line2D([], [], color=colours[m], marker=markers[m], label=m)
        for m in mixers
    ]
    handles.append(Line2D([], [], color="0.3", marker="x", linestyle="none", label="no depth tried reaches it"))
    fig.legend(handles=handles, title="mixer", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    shown = metric.replace("{L}", "<L>")
    threshold = table["threshold"].iloc[0]
    fig.suptitle(
        f"smallest depth with {shown} ≥ {threshold:g}, best over seeds and learning rates\n"
        "crosses in the grey band: no depth tried reaches it; mixers offset vertically to stay apart",
        fontsize="small",
        y=1.0,
    )
    fig.tight_layout()
    return save_figure(fig, stem, pd.concat(plotted, ignore_index=True))


# ---------------------------------------------------------------------------------------------- CLI
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.depth",
        description="Minimum number of layers reaching a threshold vs sequence length, per mixer and task "
        "(Merrill et al. 2024, Fig. 3), from results.csv files of sweeps over depth "
        "(PNG, PDF and the CSV of every plotted number).",
        epilog="Example: python -m analysis.depth runs/word_problem-depth --metric 'len{L}/exact' --threshold 0.9",
    )
    p.add_argument("results", nargs="+", help="results.csv files or sweep folders holding one")
    p.add_argument(
        "--metric",
        default="len{L}/exact",
        help="column template, {L} the evaluation length (default: %(default)s; also len{L}/acc, len{L}/last_acc)",
    )
    p.add_argument("--threshold", type=float, default=0.9, help="value a depth must reach (default: %(default)s)")
    p.add_argument(
        "--lr",
        choices=LR_CHOICES,
        default="val",
        help="val: per seed the lr with the best validation accuracy; max: the best value over lrs "
        "(default: %(default)s)",
    )
    p.add_argument("--out", type=Path, default=Path("analysis-out/depth"), help="output folder (default: %(default)s)")
    p.add_argument("--name", default="depth", help="file name stem (default: %(default)s)")
    return p


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parser().parse_args(argv)
    setup_logging()
    from analysis.plotting import setup_style

    values = best_values(load_results(args.results), args.metric, args.lr)
    table = min_depth_table(values, args.threshold)
    setup_style()
    args.out.mkdir(parents=True, exist_ok=True)
    paths = plot_depth(table, args.out / args.name, args.metric)
    unsolved = int((~table["reached"]).sum())
    log.info(
        "%d groups x %d mixers, %d (group, mixer, length) points, %d not reached by any depth -> %s",
        table["group"].nunique(),
        table["mixer"].nunique(),
        len(table),
        unsolved,
        args.out,
    )
    return paths


if __name__ == "__main__":
    sys.exit(run(main))
