"""``python -m analysis.transfer``: mLSTM transfer-gain heatmaps (paper 002 §4.2, App. D.2, Fig. 3, 6, 7).

For every input-gate pre-activation ``i`` and forget-gate pre-activation ``f`` of a grid (constant
over time), one head of the mLSTM runs over a single sequence of ``T`` steps with ``q, k, v ~ N(0, 1)``
(the same draw for every grid point) and the gains

    G_before = mean_t ||h_t||_max / ||v_t||_max,     G_after = mean_t ||RMSNorm(h_t)||_max / ||v_t||_max

are measured, with ``RMSNorm(x) = x / sqrt(mean(x²) + ε)`` (unit scale) and ``||x||_max = max_j |x_j|``
(paper 002 eq. 25-26). ``h`` is the cell output before the output gate (``seqkernels.mlstm``'s reference
with the normalizer of the variant; the mLSTM's own ``eps`` is 1e-6). Paper defaults: ``i`` in
[-12, 8], ``f`` in [-5, 12], ``T = 512``, ``d_qk = d_v = 128``, norm ε in {1e-2, 1e-6, 1e-8}.

Variants (``--variants``; App. D.2; the paper's panel letters are our reading of the text):

=============  ==========  ==================================================================
name           input gate  normalizer of ``h = C^T q / (normalizer + eps)``
=============  ==========  ==================================================================
``exp``        exp         ``max(|n^T q|, exp(-m))`` — mLSTMexp default (Fig. 3, 6a)
``exp-max1``   exp         ``max(|n^T q|, 1)`` on the stabilized states, no max-state term
``exp-abs``    exp         ``|n^T q|`` (no lower bound)
``exp-none``   exp         none (the stabilized numerator alone)
``sig``        sigmoid     none — mLSTMsig default (Fig. 3, 7a)
``sig-max1``   sigmoid     ``max(|n^T q|, 1)`` ("bounded by 1", Fig. 7b)
``sig-abs``    sigmoid     ``|n^T q|`` (no lower bound)
=============  ==========  ==================================================================

Outputs (``--out DIR``): ``transfer-fig3.{png,pdf,csv}`` (both defaults, before and after the norm at
ε = 1e-6) and ``transfer-variants.{png,pdf,csv}`` (every variant, before the norm and after it for
each ε; its CSV holds every gain computed), with the gain-0.5 contour (the suppress/pass transition).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from analysis.cli import csv_list, run, setup_logging

log = logging.getLogger("analysis.transfer")

#: name -> (input gate, normalizer of seqkernels.mlstm.reference, label)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "exp": ("exp", "max_exp_m", r"mLSTMexp, max(|n·q|, $e^{-m}$)"),
    "exp-max1": ("exp", "max_one", "mLSTMexp, max(|n·q|, 1)"),
    "exp-abs": ("exp", "abs", "mLSTMexp, |n·q|"),
    "exp-none": ("exp", "none", "mLSTMexp, no normalizer"),
    "sig": ("sig", "none", "mLSTMsig, no normalizer"),
    "sig-max1": ("sig", "max_one", "mLSTMsig, max(|n·q|, 1)"),
    "sig-abs": ("sig", "abs", "mLSTMsig, |n·q|"),
}
DEFAULT_VARIANTS = ("exp", "exp-max1", "exp-abs", "sig", "sig-max1", "sig-abs")
DEFAULT_EPS = (1e-2, 1e-6, 1e-8)
I_RANGE = (-12.0, 8.0)
F_RANGE = (-5.0, 12.0)


def gate_grid(n_i: int = 21, n_f: int = 18) -> tuple[torch.Tensor, torch.Tensor]:
    """Evenly spaced input-gate values over [-12, 8] and forget-gate values over [-5, 12] (float64).

    The defaults (21 × 18) give integer steps.
    """
    if n_i < 2 or n_f < 2:
        raise ValueError(f"the grid needs at least 2 points per axis, got {n_i} x {n_f}")
    return torch.linspace(*I_RANGE, n_i, dtype=torch.float64), torch.linspace(*F_RANGE, n_f, dtype=torch.float64)


def random_inputs(T: int, d_qk: int, d_v: int, seed: int = 0, dtype=torch.float32):
    """``q, k (T, d_qk)``, ``v (T, d_v)`` drawn from N(0, 1) with ``seed``."""
    if T < 1 or d_qk < 1 or d_v < 1:
        raise ValueError(f"T, d_qk and d_v must be >= 1, got {T}, {d_qk}, {d_v}")
    g = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(T, d_qk, generator=g, dtype=torch.float64),
        torch.randn(T, d_qk, generator=g, dtype=torch.float64),
    )
    v = torch.randn(T, d_v, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def hidden_states(variant: str, q, k, v, i_values, f_values, *, backend: str = "parallel", cells_per_call: int = 32):
    """The mLSTM output ``h (n_i, n_f, T, d_v)`` for every (i, f) of the grid, in ``q``'s dtype.

    ``q, k (T, d_qk)``, ``v (T, d_v)``: one sequence shared by every grid point; gate pre-activations
    constant over time. The grid is run as a batch, ``cells_per_call`` grid points at a time, through
    ``seqkernels.mlstm``'s ``parallel`` (default, fastest on the CPU at T = 512) or ``recurrent`` reference.
    """
    from seqkernels.mlstm import mlstm_parallel, mlstm_recurrent

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    fn = {"parallel": mlstm_parallel, "recurrent": mlstm_recurrent}.get(backend)
    if fn is None:
        raise ValueError(f"backend must be 'parallel' or 'recurrent', got {backend!r}")
    gate, normalizer, _ = VARIANTS[variant]
    T, dv = q.shape[0], v.shape[1]
    ii, ff = torch.meshgrid(i_values.to(q.dtype), f_values.to(q.dtype), indexing="ij")
    ii, ff = ii.reshape(-1), ff.reshape(-1)
    out = torch.empty(ii.numel(), T, dv, dtype=q.dtype)
    with torch.no_grad():
        for start in range(0, ii.numel(), cells_per_call):
            n = min(cells_per_call, ii.numel() - start)
            qb, kb, vb = (x[None, None].expand(n, 1, *x.shape) for x in (q, k, v))
            i_pre = ii[start : start + n, None, None].expand(n, 1, T)
            f_pre = ff[start : start + n, None, None].expand(n, 1, T)
            out[start : start + n] = fn(qb, kb, vb, i_pre, f_pre, input_gate=gate, normalizer=normalizer)[:, 0]
    return out.reshape(len(i_values), len(f_values), T, dv)


def gains(h: torch.Tensor, v: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``mean_t ||h_t||_max / ||v_t||_max`` over the last two dims ``(T, d)`` of ``h``; with ``eps``,
    of ``RMSNorm(h_t) = h_t / sqrt(mean(h_t²) + eps)`` instead (float64 result, shape ``h.shape[:-2]``)."""
    h = h.double()
    if eps is not None:
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.abs().amax(-1) / v.double().abs().amax(-1)).mean(-1)


def transfer_gains(
    variants: Sequence[str] = DEFAULT_VARIANTS,
    eps_values: Sequence[float] = DEFAULT_EPS,
    n_i: int = 21,
    n_f: int = 18,
    T: int = 512,
    d_qk: int = 128,
    d_v: int = 128,
    seed: int = 0,
    dtype=torch.float32,
    backend: str = "parallel",
    progress: bool = False,
) -> pd.DataFrame:
    """Long table of gains: ``variant, input_gate, normalizer, i_pre, f_pre, stage, eps, gain``.

    ``stage`` is ``"before"`` (``eps`` NaN) or ``"after"`` the RMS norm with that ``eps``.
    """
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if any(not (e > 0) for e in eps_values):
        raise ValueError(f"norm epsilons must be > 0, got {list(eps_values)}")
    i_values, f_values = gate_grid(n_i, n_f)
    q, k, v = random_inputs(T, d_qk, d_v, seed, dtype)
    frames = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("mLSTM transfer gains", total=len(variants))
        for name in variants:
            t0 = time.perf_counter()
            h = hidden_states(name, q, k, v, i_values, f_values, backend=backend)
            if not torch.isfinite(h).all():
                log.warning("%s: %d non-finite outputs (counted as NaN gains)", name, int((~torch.isfinite(h)).sum()))
            stages = [("before", math.nan, gains(h, v))] + [("after", e, gains(h, v, e)) for e in eps_values]
            gate, normalizer, _ = VARIANTS[name]
            ii, ff = np.meshgrid(i_values.numpy(), f_values.numpy(), indexing="ij")
            for stage, eps, g in stages:
                frames.append(
                    pd.DataFrame(
                        {
                            "variant": name,
                            "input_gate": gate,
                            "normalizer": normalizer,
                            "i_pre": ii.ravel(),
                            "f_pre": ff.ravel(),
                            "stage": stage,
                            "eps": eps,
                            "gain": g.numpy().ravel(),
                        }
                    )
                )
            log.info("%s: %d grid points, T=%d, d=%d in %.1fs", name, n_i * n_f, T, d_v, time.perf_counter() - t0)
            bar.advance(task)
    return pd.concat(frames, ignore_index=True)


def transition(df: pd.DataFrame, level: float = 0.5) -> pd.Series:
    """Per ``f_pre``: the input-gate value where the gain first reaches ``level`` going up in ``i``
    (linear interpolation between grid points; NaN if it never does, -inf if it starts above).

    ``df``: one (variant, stage, eps) slice of ``transfer_gains``' table.
    """
    out = {}
    for f, group in df.sort_values("i_pre").groupby("f_pre"):
        i, g = group["i_pre"].to_numpy(), group["gain"].to_numpy()
        above = np.nonzero(g >= level)[0]
        if len(above) == 0:
            out[f] = math.nan
        elif above[0] == 0:
            out[f] = -math.inf
        else:
            j = above[0]
            out[f] = i[j - 1] + (level - g[j - 1]) * (i[j] - i[j - 1]) / (g[j] - g[j - 1])
    return pd.Series(out, name="i_transition").rename_axis("f_pre")


def select(df: pd.DataFrame, variant: str, stage: str, eps: float | None = None) -> pd.DataFrame:
    """The slice of ``transfer_gains``' table for one variant and stage (and ε after the norm)."""
    sel = df[(df["variant"] == variant) & (df["stage"] == stage)]
    if stage == "after":
        sel = sel[np.isclose(sel["eps"], eps, rtol=1e-9, atol=0)]
    return sel


# ---------------------------------------------------------------------------------------------- figures
def _panel(ax, sel: pd.DataFrame, norm, cmap: str, contour: bool):
    grid = sel.pivot(index="i_pre", columns="f_pre", values="gain").sort_index().sort_index(axis=1)
    i, f = grid.index.to_numpy(), grid.columns.to_numpy()
    di, df_ = (i[1] - i[0]) / 2, (f[1] - f[0]) / 2
    im = ax.imshow(
        grid.to_numpy(),
        origin="lower",
        aspect="auto",
        cmap=cmap,
        norm=norm,
        extent=(f[0] - df_, f[-1] + df_, i[0] - di, i[-1] + di),
        interpolation="nearest",
    )
    if contour and np.nanmax(grid.to_numpy()) >= 0.5 > np.nanmin(grid.to_numpy()):
        ax.contour(f, i, grid.to_numpy(), levels=[0.5], colors="white", linestyles="--", linewidths=1)
    ax.grid(False)
    return im


#: the before-norm panels' log colour scale starts no lower than this (smaller gains take its colour)
LOG_FLOOR = 1e-4


def heatmaps(df: pd.DataFrame, variants: Sequence[str], columns: Sequence[tuple[str, float | None]], title: str):
    """A figure: one row per variant, one column per ``(stage, eps)``; before-norm panels on a log
    colour scale, after-norm panels on a linear [0, 1.25] scale; dashed white line: gain 0.5."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm, Normalize

    from analysis.plotting import SEQUENTIAL

    before = df[(df["stage"] == "before") & df["variant"].isin(variants)]["gain"]
    finite = before[np.isfinite(before) & (before > 0)]
    log_norm = (
        LogNorm(vmin=max(finite.min(), LOG_FLOOR), vmax=max(finite.max(), 1e-3))
        if len(finite)
        else LogNorm(LOG_FLOOR, 1)
    )
    clipped = len(finite) and finite.min() < LOG_FLOOR  # the colour bar says so, and points its end
    lin_norm = Normalize(vmin=0.0, vmax=1.25)
    nrow, ncol = len(variants), len(columns)
    fig, axes = plt.subplots(
        nrow,
        ncol,
        figsize=(2.9 * ncol + 0.8, 2.4 * nrow + 0.6),
        squeeze=False,
        sharex=True,
        sharey=True,
        constrained_layout=True,
    )
    ims = {}
    for r, name in enumerate(variants):
        for c, (stage, eps) in enumerate(columns):
            ax = axes[r, c]
            sel = select(df, name, stage, eps)
            ims[c] = _panel(ax, sel, log_norm if stage == "before" else lin_norm, SEQUENTIAL, stage == "after")
            head = "before norm" if stage == "before" else f"after norm, ε = {eps:.0e}"
            ax.set_title(f"{VARIANTS[name][2]}\n{head}", fontsize=8.5)
            if r == nrow - 1:
                ax.set_xlabel("forget-gate pre-activation")
            if c == 0:
                ax.set_ylabel("input-gate pre-activation")
    before_cols = [c for c, (stage, _) in enumerate(columns) if stage == "before"]
    after_cols = [c for c, (stage, _) in enumerate(columns) if stage == "after"]
    before_label = "gain before the norm (log scale)" + (
        f"; values below {LOG_FLOOR:g} (down to {finite.min():.1e}) drawn at {LOG_FLOOR:g}" if clipped else ""
    )
    for cols, label, extend in (
        (before_cols, before_label, "min" if clipped else "neither"),
        (after_cols, "gain after the norm", "neither"),
    ):
        if cols:
            fig.colorbar(
                ims[cols[0]],
                ax=axes[:, cols],
                location="bottom",
                fraction=0.04 if nrow > 2 else 0.08,
                aspect=25 * len(cols),
                label=label,
                extend=extend,
            )
    fig.suptitle(title)
    return fig


def plot_all(
    df: pd.DataFrame, out: Path, variants: Sequence[str], eps_values: Sequence[float], meta: str
) -> list[Path]:
    """``transfer-fig3`` (the defaults at ε = 1e-6, or the middle ε) and ``transfer-variants``."""
    from analysis.plotting import save_figure, setup_style

    setup_style()
    paths = []
    defaults = [v for v in ("exp", "sig") if v in variants]
    eps_main = 1e-6 if any(math.isclose(e, 1e-6) for e in eps_values) else eps_values[len(eps_values) // 2]
    if defaults:
        cols = [("before", None), ("after", eps_main)]
        fig = heatmaps(df, defaults, cols, f"mLSTM transfer behaviour (paper 002 Fig. 3); {meta}")
        data = pd.concat([select(df, v, s, e) for v in defaults for s, e in cols])
        paths += save_figure(fig, out / "transfer-fig3", data)
    cols = [("before", None)] + [("after", e) for e in eps_values]
    fig = heatmaps(df, list(variants), cols, f"mLSTM normalizer variants and norm ε (paper 002 Fig. 6, 7); {meta}")
    paths += save_figure(fig, out / "transfer-variants", df[df["variant"].isin(variants)])
    return paths


# ---------------------------------------------------------------------------------------------- CLI
def _grid(text: str) -> tuple[int, int]:
    try:
        a, b = text.lower().split("x")
        return int(a), int(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N_IxN_F such as 21x18, got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.transfer",
        description="Transfer-gain heatmaps of the mLSTM (paper 002 Fig. 3, 6, 7): the gain ||h||_max/||v||_max "
        "averaged over time, before and after an RMS norm, over input-gate pre-activations in [-12, 8] "
        "and forget-gate pre-activations in [-5, 12] (constant over time), one head, q, k, v ~ N(0, 1).",
        epilog="Variants: "
        + "; ".join(f"{k} = {v[2]}" for k, v in VARIANTS.items())
        + ". Example: python -m analysis.transfer --out docs/figures",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--variants",
        type=csv_list(str),
        default=list(DEFAULT_VARIANTS),
        help="comma-separated variants (default: %(default)s)",
    )
    p.add_argument(
        "--eps", type=csv_list(float), default=list(DEFAULT_EPS), help="RMS-norm epsilons (default: 1e-2,1e-6,1e-8)"
    )
    p.add_argument("--grid", type=_grid, default=(21, 18), help="grid points N_IxN_F (default: 21x18, integer steps)")
    p.add_argument("--T", type=int, default=512, help="sequence length (default: %(default)s)")
    p.add_argument("--d", type=int, default=128, help="head dimension d_qk = d_v (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the N(0, 1) inputs (default: %(default)s)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument(
        "--backend",
        choices=("parallel", "recurrent"),
        default="parallel",
        help="mLSTM reference form (same numbers; parallel is faster on the CPU)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument(
        "--out", type=Path, default=Path("analysis-out/transfer"), help="output folder (default: %(default)s)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    args = parser().parse_args(argv)
    setup_logging()
    torch.set_num_threads(max(1, args.threads))
    n_i, n_f = args.grid
    df = transfer_gains(
        args.variants,
        args.eps,
        n_i,
        n_f,
        args.T,
        args.d,
        args.d,
        args.seed,
        getattr(torch, args.dtype),
        args.backend,
        progress=True,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    meta = f"T={args.T}, d={args.d}, {n_i}×{n_f} grid"
    plot_all(df, args.out, args.variants, args.eps, meta)
    for name in [v for v in ("exp", "sig") if v in args.variants]:
        for eps in args.eps:
            t = transition(select(df, name, "after", eps))
            log.info(
                "%s, ε=%g: gain 0.5 reached at input gate %.2f (f=%g) … %.2f (f=%g)",
                name,
                eps,
                t.iloc[0],
                t.index[0],
                t.iloc[-1],
                t.index[-1],
            )
    return df


if __name__ == "__main__":
    sys.exit(run(main))
