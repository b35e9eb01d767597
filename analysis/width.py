"""``python -m analysis.width RESULTS... [--metric test/acc] [--out DIR] [--name NAME]``: accuracy against
model width, one panel per setting, one line per mixer (Arora et al. 2023, Zoology, Figure 2).

Reads ``results.csv`` files of sweeps over width (the ``d_model`` column), e.g. a reproduction's folder
``runs/reproduce/zoology-mqar`` (one sweep per setting and width). A setting is a task configuration (the
task and the options that differ between the results' configurations: ``mqar num_kv_pairs=4
seq_len=64``). Each point is the number of the reproduction report's cell (``experiments.claims.width_table``):
per seed the learning rate with the best validation accuracy, then the best seed (``--aggregate best``,
default; Zoology runs one seed and keeps the best learning rate) or the mean over seeds at the learning rate
with the best mean validation accuracy (``mean_at_best_lr``).

Writes ``NAME.{png,pdf,csv}`` (``--name``, default ``width``) into ``--out`` (default ``analysis-out/width``):
a panel per setting, width on a log2 axis, the solved line (``--solved``, default 98%) dashed; the CSV holds
every plotted number with its seeds, learning rate and parameter count.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis.cli import run, setup_logging
from analysis.tables import load_results
from experiments.claims import width_table
from experiments.paper import AGGREGATES, SOLVED

log = logging.getLogger("analysis.width")


def plot_widths(table: pd.DataFrame, stem: Path | None, metric: str, solved: float) -> list[Path]:
    """Accuracy vs width: one panel per ``setting`` of a ``width_table``, one line per mixer."""
    from analysis.plotting import as_categories, mixer_lines, save_figure

    data = as_categories(table, ["setting", "mixer"])
    # one number per (setting, mixer, width): the report's cell
    grid = mixer_lines(data, "width", "setting", errorbar=None, aspect=1.2)
    for setting, ax in grid.axes_dict.items():
        ax.axhline(solved, color="0.5", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ticks = sorted(set(table.loc[table["setting"] == setting, "width"]))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_title(str(setting))
    grid.set(ylim=(-0.02, 1.02))
    grid.set_axis_labels("model width (d_model)", f"accuracy ({metric})")
    grid.figure.suptitle(f"dashed: solved ({solved:.0%})", y=1.02, fontsize="small")
    return save_figure(grid.figure, stem, table)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.width",
        description="Accuracy against model width from results.csv files: one panel per task setting, one line "
        "per mixer (PNG, PDF and the CSV of every plotted number).",
        epilog="Example: python -m analysis.width runs/reproduce/zoology-mqar --out docs/figures --name zoology-mqar",
    )
    p.add_argument("results", nargs="+", help="results.csv files, sweep folders, or a reproduction's folder")
    p.add_argument("--out", type=Path, default=Path("analysis-out/width"), help="output folder (default: %(default)s)")
    p.add_argument("--name", default="width", help="file name stem (default: %(default)s)")
    p.add_argument("--metric", default="test/acc", help="results column to plot (default: %(default)s)")
    p.add_argument("--aggregate", choices=AGGREGATES, default="best", help="over seeds (default: %(default)s)")
    p.add_argument("--solved", type=float, default=SOLVED, help="the dashed line (default: %(default)s)")
    return p


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parser().parse_args(argv)
    setup_logging()
    if not 0 < args.solved <= 1:
        raise ValueError(f"--solved must be in (0, 1], got {args.solved}")
    from analysis.plotting import setup_style

    table = width_table(load_results(args.results), args.metric, args.aggregate)
    setup_style()
    paths = plot_widths(table, args.out / args.name, args.metric, args.solved)
    log.info(
        "%d settings x %d mixers x %d widths -> %s",
        *(table[c].nunique() for c in ("setting", "mixer", "width")),
        args.out,
    )
    return paths


if __name__ == "__main__":
    sys.exit(run(main))
