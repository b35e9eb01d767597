"""``python -m analysis.kernels BENCH_JSON...``: kernel time vs sequence length (SPEC §9.4).

Reads the JSON files of ``python -m kernels.bench <family>`` (``{family, env, rows: [BenchRow...]}``,
see ``kernels/bench/common.py``) and draws, per file (timings are only comparable within one run on
one device), log-log time in ms vs sequence length, one line per implementation (ours and the
peers), one panel per problem configuration × direction × dtype, with the physical limit (bytes /
copy bandwidth or FLOPs / matmul rate, ``limit_ms``) as a dashed black line.

The sequence length comes from ``extra`` (``seq_len``, ``length``, ``S``, ``T``, ``L``) or from the
shape string: ``S4096`` (mlstm), ``L4096`` (ssd), ``T1024`` (fused_rnn), ``L=512`` (newton),
``G16 … L64`` (chunks × chunk size), or a batch-first ``(B, L, D)`` tuple (scan). The rest of the shape names the configuration (``B8 NH8 DQK128 DV128``; single-length
configurations that differ only in the batch, as in a constant-token grid, share one line). Rows without a
time (skipped, out of memory) or without a length are left out and counted.

Writes ``<out>/<json stem>.{png,pdf,csv}`` (default ``--out``: the JSON's folder).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.cli import run, setup_logging

log = logging.getLogger("analysis.kernels")

_LEN_KEYS = ("seq_len", "length", "S", "T", "L")


def parse_length(shape: str, extra: dict[str, Any] | None = None) -> tuple[int | None, str]:
    """``(sequence length or None, configuration)`` from a BenchRow's ``shape`` and ``extra``.

    >>> parse_length("B8 NH8 S4096 DQK128 DV128")
    (4096, 'B8 NH8 DQK128 DV128')
    >>> parse_length("lstm B16 T1024 12x64")
    (1024, 'lstm B16 12x64')
    >>> parse_length("gru B=8 L=512 D=256")
    (512, 'gru B=8 D=256')
    >>> parse_length("B2 NH4 G16 D128 L64")
    (1024, 'B2 NH4 D128 chunk 64')
    >>> parse_length("2x2 (8, 4096, 512)")
    (4096, '2x2 B8 D512')
    """
    tokens = shape.split()
    for key in _LEN_KEYS:
        if extra and isinstance(extra.get(key), (int, float)) and not isinstance(extra.get(key), bool):
            return int(extra[key]), " ".join(t for t in tokens if not re.fullmatch(rf"{key}=?\d+", t))
    values = {m.group(1): int(m.group(2)) for t in tokens if (m := re.fullmatch(r"([A-Z]+)=?(\d+)", t))}
    if "G" in values and "L" in values:  # G chunks of L steps
        rest = [t for t in tokens if not re.fullmatch(r"[GL]=?\d+", t)]
        return values["G"] * values["L"], " ".join(rest + [f"chunk {values['L']}"])
    for key in ("S", "T", "L"):
        if key in values:
            return values[key], " ".join(t for t in tokens if not re.fullmatch(rf"{key}=?\d+", t))
    m = re.search(r"\((\d+),\s*(\d+),\s*(\d+)\)", shape)  # a (B, L, D) tuple, batch-first (SPEC §2.1)
    if m:
        rest = (shape[:m.start()] + f"B{m.group(1)} D{m.group(3)}" + shape[m.end():]).split()
        return int(m.group(2)), " ".join(rest)
    return None, shape


def merge_batch_sweeps(df: pd.DataFrame) -> pd.Series:
    """Configurations that hold a single length and differ from each other only in the batch
    (``B32 S2048``, ``B8 S8192``: a constant-token grid) become one line, named ``… (B varies)``."""
    lengths = df.groupby("config")["L"].nunique()
    single = {c for c, n in lengths.items() if n == 1}
    stripped = {c: " ".join(t for t in c.split() if not re.fullmatch(r"B=?\d+", t)) for c in single}
    groups = pd.Series(stripped).value_counts() if stripped else pd.Series(dtype=int)
    return df["config"].map(lambda c: f"{stripped[c]} (B varies)" if c in stripped and groups[stripped[c]] > 1 else c)


def load_bench(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One benchmark JSON -> (rows with ``L`` and ``config`` columns, env). ``ValueError`` if malformed."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no benchmark file at {path} (python -m kernels.bench <family> writes them under benchmarks/)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: expected {{family, env, rows: [...]}} as written by kernels.bench")
    rows = []
    for r in data["rows"]:
        missing = [k for k in ("impl", "shape", "direction", "dtype", "ms") if k not in r]
        if missing:
            raise ValueError(f"{path}: a row lacks {', '.join(missing)}: {r}")
        extra = r.get("extra") or {}
        L, config = parse_length(str(r["shape"]), extra)
        if extra.get("section"):
            config = f"{config} [{extra['section']}]"
        ms = float("nan") if r["ms"] is None else float(r["ms"])
        limit = r.get("limit_ms")
        rows.append({"family": data.get("family", r.get("family", "")), "impl": r["impl"], "shape": r["shape"],
                     "config": config, "direction": r["direction"], "dtype": r["dtype"], "L": L, "ms": ms,
                     "limit_ms": float("nan") if limit is None else float(limit), "note": r.get("note", "")})
    return pd.DataFrame(rows), dict(data.get("env") or {})


def plot(df: pd.DataFrame, title: str):
    """Log-log ms vs L: panels per (config, direction, dtype), hue and marker per impl, limit dashed."""
    import seaborn as sns
    from matplotlib.lines import Line2D

    from analysis.plotting import PALETTE, as_categories

    data = as_categories(df.sort_values(["config", "direction", "dtype", "impl", "L"]), ["impl", "panel"])
    per_config = data.groupby("config")["panel"].nunique().max()
    ncol = per_config if 1 < per_config <= 4 else min(3, data["panel"].nunique())  # one row per config if it fits
    g = sns.relplot(data=data, x="L", y="ms", hue="impl", style="impl", col="panel", col_wrap=ncol, kind="line",
                    markers=True, dashes=False, palette=PALETTE, height=3.0, aspect=1.25,
                    facet_kws={"sharey": False, "sharex": False})
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
        prog="python -m analysis.kernels",
        description="Kernel timing plots from the JSON of python -m kernels.bench: time vs sequence length "
                    "(log-log) per implementation, peers included, with the physical limit dashed; one figure per file.",
        epilog="Example: python -m analysis.kernels benchmarks/mlstm-*.json --out docs/figures",
    )
    p.add_argument("bench", nargs="+", type=Path, help="benchmark JSON files (benchmarks/<family>-<device>-<date>.json)")
    p.add_argument("--direction", choices=("fwd", "fwd+bwd"), help="only this direction (default: both)")
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
            raise ValueError(f"{path}: no timed rows with a sequence length to plot"
                             + (" (after the filters)" if args.direction or args.dtype or args.impls else ""))
        df["L"] = df["L"].astype(int)
        df["config"] = merge_batch_sweeps(df)
        df["panel"] = df["config"] + " · " + df["direction"] + " · " + df["dtype"]
        family = df["family"].iloc[0]
        title = (f"{family} kernels on {env.get('device') or 'unknown device'} "
                 f"(commit {env.get('commit') or '?'}, {(env.get('date') or '?')[:10]})")
        out = (args.out or path.parent) / path.stem
        cols = ["family", "impl", "config", "direction", "dtype", "L", "ms", "limit_ms", "shape", "note"]
        written += save_figure(plot(df, title), out, df[cols])
    return written


if __name__ == "__main__":
    sys.exit(run(main))
