"""``python -m benchmarks.ops.plot RESULTS_JSON...``: kernel time vs sequence length.

Reads the results of ``python -m benchmarks.ops <family>`` (``{family, env, rows}``; each row a flat
record: ``family, section, impl, direction, dtype``, one column per problem dimension (``batch``,
``length``, ``dim``, ``heads`` ...), ``ms, limit_ms, max_rel_err, note``; see
``benchmarks/ops/common.py``) and draws, per file (timings are only comparable within one run on one
device), log-log time in ms vs ``length``, one line per implementation (ours and the peers), one panel
per configuration (the other dimensions and the section) × direction × dtype, with the physical limit
(``limit_ms``) as a dashed black line. Configurations that hold a single length and differ only in
``batch`` (a constant-token grid) share one line. Rows without a time or a length are left out and
counted.

Writes ``<out>/<json stem>.{png,pdf,csv}`` (default ``--out``: the JSON's folder).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.cli import run, setup_logging

log = logging.getLogger("benchmarks.ops.plot")

#: the columns of a row that are not problem dimensions
FIELDS = ("family", "section", "impl", "direction", "dtype", "ms", "limit_ms", "max_rel_err", "note", "extra")
REQUIRED = ("impl", "direction", "dtype", "ms")


def dimension_columns(df: pd.DataFrame) -> list[str]:
    """The problem-dimension columns of a results frame, ``length`` excluded."""
    return [c for c in df.columns if c not in FIELDS and c not in ("length", "L", "config", "panel")]


def _fmt(value: Any) -> str:
    """A dimension's value: whole floats (a column with gaps is float) as ints."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def config_label(row: pd.Series, dims: Sequence[str]) -> str:
    """``batch=8 dim=1024`` from the row's dimensions (``nan`` ones left out), plus ``[section]``."""
    parts = [f"{d}={_fmt(row[d])}" for d in dims if pd.notna(row[d])]
    section = row.get("section")
    if isinstance(section, str) and section != "main":
        parts.append(f"[{section}]")
    return " ".join(parts)


def merge_batch_sweeps(df: pd.DataFrame) -> pd.Series:
    """Configurations that hold a single length and differ from each other only in ``batch`` (a
    constant-token grid: ``batch=32 length=2048``, ``batch=8 length=8192``) become one line, named
    ``... (batch varies)``."""
    if "batch" not in df.columns:
        return df["config"]
    others = [d for d in dimension_columns(df) if d != "batch"]
    stripped = df.apply(lambda r: config_label(r, others), axis=1)
    single = df.groupby("config")["L"].transform("nunique") == 1
    per_group = df[single].groupby(stripped[single])["config"].transform("nunique")
    merged = df["config"].copy()
    many = per_group[per_group > 1].index
    merged.loc[many] = stripped.loc[many] + " (batch varies)"
    return merged


def load_bench(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One results JSON -> (rows with ``L`` and ``config`` columns, env). ``ValueError`` if malformed."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no benchmark file at {path} (python -m benchmarks.ops <family> writes them)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: expected {{family, env, rows: [...]}} as written by benchmarks.ops")
    for r in data["rows"]:
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"{path}: a row lacks {', '.join(missing)}: {r}")
    df = pd.DataFrame(data["rows"])
    df["family"] = df.get("family", data.get("family", "")).fillna(data.get("family", ""))
    df["section"] = df["section"].fillna("main") if "section" in df.columns else "main"
    df["ms"] = pd.to_numeric(df["ms"], errors="coerce")
    df["limit_ms"] = pd.to_numeric(df["limit_ms"], errors="coerce") if "limit_ms" in df.columns else float("nan")
    df["note"] = df["note"].fillna("") if "note" in df.columns else ""
    df["L"] = pd.to_numeric(df["length"], errors="coerce") if "length" in df.columns else float("nan")
    dims = dimension_columns(df)
    df["config"] = df.apply(lambda r: config_label(r, dims), axis=1) if len(df) else []
    return df, dict(data.get("env") or {})


def plot(df: pd.DataFrame, title: str):
    """Log-log ms vs L: panels per (config, direction, dtype), hue and marker per impl, limit dashed."""
    import seaborn as sns
    from matplotlib.lines import Line2D

    from analysis.plotting import PALETTE, as_categories

    data = as_categories(df.sort_values(["config", "direction", "dtype", "impl", "L"]), ["impl", "panel"])
    per_config = data.groupby("config")["panel"].nunique().max()
    ncol = per_config if 1 < per_config <= 4 else min(3, data["panel"].nunique())  # one row per config if it fits
    g = sns.relplot(
        data=data,
        x="L",
        y="ms",
        hue="impl",
        style="impl",
        col="panel",
        col_wrap=ncol,
        kind="line",
        markers=True,
        dashes=False,
        palette=PALETTE,
        height=3.0,
        aspect=1.25,
        facet_kws={"sharey": False, "sharex": False},
    )
    for panel, ax in g.axes_dict.items():
        lim = data[data["panel"] == panel].groupby("L", observed=True)["limit_ms"].min().dropna()
        if len(lim):  # the marker shows a limit at a single length too
            ax.plot(lim.index, lim.values, ls="--", color="black", lw=1.2, marker="_", markersize=12)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        lengths = data.loc[data["panel"] == panel, "L"]
        if lengths.nunique() == 1:  # one length: centre it instead of matplotlib's default decades
            ax.set_xlim(lengths.iloc[0] / 2, lengths.iloc[0] * 2)
    g.set_titles("{col_name}", size=9)
    g.set_axis_labels("sequence length", "time (ms)")
    old = g.legend
    legend = {t.get_text(): h for t, h in zip(old.texts, old.legend_handles)}
    if data["limit_ms"].notna().any():
        legend["physical limit"] = Line2D([], [], ls="--", color="black")
    old.remove()
    g.add_legend(legend_data=legend, title="implementation", label_order=list(legend))
    g.figure.suptitle(title, y=1.03)
    return g.figure


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.ops.plot",
        description="Kernel timing plots from the results of python -m benchmarks.ops: time vs sequence length "
        "(log-log) per implementation, peers included, with the physical limit dashed; one figure per file.",
        epilog="Example: python -m benchmarks.ops.plot benchmarks/ops/results/mlstm.json --out docs/figures",
    )
    p.add_argument("bench", nargs="+", type=Path, help="results JSON files (benchmarks/ops/results/<family>.json)")
    p.add_argument("--direction", choices=("fwd", "bwd", "fwd+bwd"), help="only this direction (default: all)")
    p.add_argument("--dtype", help="only this dtype (as written in the JSON, e.g. bfloat16)")
    p.add_argument("--impls", help="regular expression: only implementations whose name matches")
    p.add_argument("--out", type=Path, help="output folder (default: each JSON's folder)")
    return p


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parser().parse_args(argv)
    setup_logging()
    from analysis.plotting import save_figure, setup_style

    setup_style()
    written = []
    for path in args.bench:
        df, env = load_bench(path)
        keep = df["ms"].notna() & df["L"].notna() & (df["ms"] > 0)
        if args.direction:
            keep &= df["direction"] == args.direction
        if args.dtype:
            keep &= df["dtype"] == args.dtype
        if args.impls:
            keep &= df["impl"].str.contains(args.impls, regex=True)
        left = df[~keep]
        if len(left):
            log.info("%s: %d of %d rows left out (no time, no length or filtered)", path.name, len(left), len(df))
        df = df[keep].copy()
        if df.empty:
            raise ValueError(
                f"{path}: no timed rows with a sequence length to plot"
                + (" (after the filters)" if args.direction or args.dtype or args.impls else "")
            )
        df["L"] = df["L"].astype(int)
        df["config"] = merge_batch_sweeps(df)
        df["panel"] = df["config"] + " · " + df["direction"] + " · " + df["dtype"]
        family = df["family"].iloc[0]
        title = (
            f"{family} kernels on {env.get('device') or 'unknown device'} "
            f"(commit {env.get('commit') or '?'}, {(env.get('date') or '?')[:10]})"
        )
        out = (args.out or path.parent) / path.stem
        cols = ["family", "section", "impl", "config", "direction", "dtype", "L", "ms", "limit_ms", "note"]
        written += save_figure(plot(df, title), out, df[cols])
    return written


if __name__ == "__main__":
    sys.exit(run(main))
