"""``python -m analysis.newton``: Newton-convergence curves of recurrent cells (paper 000 App. A, Fig. 4).

For each cell and each sequence length ``L = 2^min … 2^max`` (default 2^6 … 2^14) the residual
``r_k = max |f(h^k_{t-1}, x_t) - h^k_t|`` (max over a batch of inputs, positions and channels; ``r_0``
for the initial guess ``h^0_t = f(0, x_t)``) after each Newton iteration ``k``, computed by
``mixers.cells.convergence.newton_residuals`` (no early exit, no fallback) in float64 by default.
Two panels per cell, as in the paper:

* **fresh**: a freshly initialized ``cell_mixer`` (seeded; ``--cell-option clip_norm=none`` etc.);
* **trained**: the cell of a trained model from a sweep folder (``--checkpoints runs/parity-smoke``
  holding ``trials/*/spec.json`` + ``checkpoints/best.ckpt``), per mixer the cell with the best validation accuracy.

Any cell is accepted: registered names (``flashgru``, ``flashlstm``) or ``module.path:CellClass``.
Inputs: ``random`` (N(0, 1), the mixer's width) or ``task`` / ``task:NAME`` — that task's sequences
of length ``L`` embedded by the model (embedding, positions, norm and, for a full block, its input
projection + convolution), i.e. exactly what the mixer sees. ``task`` uses the checkpoint's task.

Writes ``<out>/<name>.{png,pdf,csv}`` (CSV: ``cell, panel, source, L, iteration, residual``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml

from analysis.cli import csv_list, run, setup_logging
from experiments.trial.model import mixer_input

log = logging.getLogger("analysis.newton")

DEFAULT_CELLS = ("flashgru", "flashlstm")


def _is_cell(name: str) -> bool:
    """Whether mixer ``name`` builds a recurrent cell mixer (a ``CellMixer``)."""
    from mixers import build_mixer
    from mixers.cells.mixer import CellMixer

    try:
        return isinstance(build_mixer(name, 8, num_heads=2), CellMixer)
    except (TypeError, ValueError):
        return False


def _as_cell_mixer(mixer: torch.nn.Module, name: str):
    from mixers.cells.mixer import CellMixer

    if not isinstance(mixer, CellMixer):
        raise ValueError(
            f"mixer {name!r} is a {type(mixer).__name__}, not a recurrent cell; Newton curves need a "
            "cell (flashgru, flashlstm, a registered cell mixer or module.path:MyCell)"
        )
    return mixer


def fresh_cell(name: str, d_model: int = 64, num_heads: int = 4, options: dict[str, Any] | None = None, seed: int = 0):
    """A freshly initialized ``CellMixer`` for ``name`` (parameters from ``torch.manual_seed(seed)``)."""
    from mixers import build_mixer

    torch.manual_seed(seed)
    return _as_cell_mixer(build_mixer(name, d_model, num_heads=num_heads, **(options or {})), name)


def fresh_model(
    name: str, task: str, task_options: dict[str, Any], options: dict[str, Any] | None = None, seed: int = 0
):
    """A freshly initialized ``SequenceModel`` around cell ``name`` for ``task`` (the paper's block
    and positional encoding for that task), to embed task inputs for a fresh cell."""
    from experiments.sweeps.presets import TASK_DEFAULTS
    from experiments.trial.model import ModelConfig, SequenceModel
    from tasks import get_task

    t = get_task(task, **task_options)
    structure = TASK_DEFAULTS.get(task, {"block": "mixer", "positional": "none"})
    torch.manual_seed(seed)
    model = SequenceModel(
        ModelConfig(
            vocab_size=t.vocab_size,
            num_classes=t.num_classes,
            mixer=name,
            mixer_options=dict(options or {}),
            **structure,
        )
    )
    _as_cell_mixer(model.mixer, name)
    return model.eval()


def trial_checkpoint(trial_dir: Path, checkpoint: str | None = None):
    """``(spec, checkpoint path)`` of a cell folder of a sweep (``spec.json`` and
    ``checkpoints/<checkpoint>``, default ``best.ckpt``); a one-line ``ValueError`` when one is missing."""
    from experiments.trial.train import BEST_CHECKPOINT, CHECKPOINT_DIR, TrialSpec

    trial_dir, checkpoint = Path(trial_dir), checkpoint or BEST_CHECKPOINT
    for f in ("spec.json", f"{CHECKPOINT_DIR}/{checkpoint}"):
        if not (trial_dir / f).is_file():
            raise ValueError(
                f"{trial_dir} is not a finished trial folder: it has no {f} (a cell folder of "
                f"experiments.sweep holds spec.json and {CHECKPOINT_DIR}/{checkpoint})"
            )
    spec = TrialSpec.from_dict(json.loads((trial_dir / "spec.json").read_text()))
    return spec, trial_dir / CHECKPOINT_DIR / checkpoint


def load_trial(trial_dir: Path):
    """``(spec, SequenceModel)`` of a cell folder of a sweep: ``spec.json`` and ``checkpoints/best.ckpt``."""
    from experiments.trial.lit import LitSequenceModel

    spec, ckpt = trial_checkpoint(trial_dir)
    module = LitSequenceModel.load_from_checkpoint(ckpt, map_location="cpu")
    return spec, module.model.eval()


def find_checkpoints(sweep_dir: Path, mixers: Sequence[str] | None = None) -> dict[str, Path]:
    """Per mixer of ``sweep_dir/trials/*``, the cell folder with the best validation accuracy
    (from ``results.csv``'s ``trial_dir`` and ``best_val_acc`` when present, else the first folder);
    only ``mixers`` if given."""
    from experiments.trial.train import BEST_CHECKPOINT, CHECKPOINT_DIR

    sweep_dir = Path(sweep_dir)
    trials = sorted(
        p.parent.parent
        for p in sweep_dir.glob(f"trials/*/{CHECKPOINT_DIR}/{BEST_CHECKPOINT}")
        if (p.parent.parent / "spec.json").is_file()
    )
    if not trials:
        raise ValueError(
            f"no trained checkpoints under {sweep_dir}/trials/*/ (spec.json + {CHECKPOINT_DIR}/{BEST_CHECKPOINT}); "
            "give the output folder of experiments.sweep"
        )
    score: dict[str, float] = {}
    if (sweep_dir / "results.csv").is_file():
        res = pd.read_csv(sweep_dir / "results.csv")
        if {"trial_dir", "best_val_acc"} <= set(res.columns):
            score = {Path(str(d)).name: float(a) for d, a in zip(res["trial_dir"], res["best_val_acc"].fillna(-1.0))}
    best: dict[str, tuple[float, Path]] = {}
    for path in trials:
        mixer = json.loads((path / "spec.json").read_text())["mixer"]
        if mixers is not None and mixer not in mixers:
            continue
        s = score.get(path.name, -1.0)
        if mixer not in best or s > best[mixer][0]:
            best[mixer] = (s, path)
    if mixers is not None:
        missing = [m for m in mixers if m not in best]
        if missing:
            found = sorted({json.loads((p / "spec.json").read_text())["mixer"] for p in trials})
            raise ValueError(f"no checkpoint of {', '.join(missing)} under {sweep_dir}; it has: {', '.join(found)}")
    return {m: p for m, (_, p) in best.items()}


def task_tokens(task: str, task_options: dict[str, Any], L: int, batch: int, seed: int) -> torch.Tensor:
    """``batch`` sequences of ``task`` at length ``L`` (token ids ``(batch, L)``)."""
    from tasks import get_task

    return get_task(task, **{**task_options, "seq_len": L}).generate(batch, seed=seed).inputs


def residual_curves(
    mixer,
    make_input: Callable[[int], torch.Tensor],
    lengths: Sequence[int],
    iters: int,
    dtype: torch.dtype = torch.float64,
    label: dict[str, Any] | None = None,
    progress=None,
) -> pd.DataFrame:
    """Rows ``(**label, L, iteration, residual)`` for each length: ``newton_residuals`` of ``mixer``
    (cast to ``dtype``) on ``make_input(L)`` of shape ``(B, L, d_model)``."""
    from mixers.cells.convergence import newton_residuals

    mixer = mixer.to(dtype)
    rows = []
    for L in lengths:
        t0 = time.perf_counter()
        x = make_input(L).to(dtype)
        res = newton_residuals(mixer, x, iters)
        rows += [{**(label or {}), "L": L, "iteration": k, "residual": r} for k, r in enumerate(res)]
        log.debug("%s L=%d: %s (%.1fs)", label, L, ", ".join(f"{r:.1e}" for r in res), time.perf_counter() - t0)
        if progress is not None:
            progress()
    return pd.DataFrame(rows)


#: residuals above this (or non-finite: Newton diverged) are drawn on this ceiling line
CEILING = 1e4


def plot(df: pd.DataFrame, title: str, eps: float):
    """Rows: cells; columns: panels (fresh, trained); one line per length (viridis, light = long).

    Exact zeros are left out (log axis); residuals above ``CEILING`` or non-finite are drawn on
    the ceiling (red dotted line); the CSV keeps the true values."""
    import numpy as np
    import seaborn as sns

    from analysis.plotting import SEQUENTIAL, as_categories

    data = df.copy()
    r = data["residual"].astype(float)
    data["residual"] = r.where(~np.isfinite(r) | (r <= CEILING), CEILING).where(np.isfinite(r), CEILING).where(r != 0)
    clipped = bool((data["residual"] == CEILING).any())
    data["length"] = [f"$2^{{{int(L).bit_length() - 1}}}$" if L & (L - 1) == 0 else str(L) for L in data["L"]]
    data = as_categories(data.sort_values(["L", "iteration"]), ["length", "cell", "panel"])
    g = sns.relplot(
        data=data,
        x="iteration",
        y="residual",
        hue="length",
        row="cell",
        col="panel",
        kind="line",
        marker="o",
        markersize=4,
        palette=SEQUENTIAL,
        height=2.7,
        aspect=1.35,
        facet_kws={"sharey": True, "margin_titles": False},
    )
    g.set(yscale="log")
    for (cell, panel), ax in g.axes_dict.items():
        ax.axhline(eps, color="0.4", ls=":", lw=1)
        if clipped:
            ax.axhline(CEILING, color="tab:red", ls=":", lw=1)
        ax.set_xticks(sorted(data["iteration"].unique()))
        sel = df[(df["cell"] == cell) & (df["panel"] == panel)]
        if not (sel["residual"].astype(float) > 0).any():  # nothing on a log axis: say why, on the panel
            why = "no runs" if sel.empty else "every residual is exactly 0 or missing"
            ax.text(
                0.5,
                0.5,
                f"nothing to draw:\n{why}",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize="small",
                color="0.3",
            )
            log.warning("%s (%s): nothing to draw (%s)", cell, panel, why)
    g.set_axis_labels("Newton iteration", "max residual")
    g.set_titles("{row_name} — {col_name}")
    g.legend.set_title("L")
    key = "grey dotted: machine ε" + (f"; red dotted: ≥ {CEILING:.0e} or diverged (non-finite)" if clipped else "")
    g.figure.suptitle(f"{title}\n{key}", y=1.0 + 0.16 / len(g.axes))
    return g.figure


# ---------------------------------------------------------------------------------------------- CLI
def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    value = value.strip()
    return key.strip(), None if value.lower() in ("none", "null") else yaml.safe_load(value)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.newton",
        description="Newton convergence of recurrent cells (paper 000 Fig. 4): max residual over a batch vs "
        "Newton iteration for sequence lengths 2^min … 2^max, for freshly initialized cells and "
        "for the cells of trained checkpoints.",
        epilog="Examples: python -m analysis.newton --out docs/figures;  python -m analysis.newton "
        "--cells my.module:MyCell --max-log2 10;  python -m analysis.newton --checkpoints "
        "runs/parity-smoke --inputs task",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--cells",
        type=csv_list(str),
        default=None,
        help="comma-separated registered cell mixers or module.path:CellClass (default: flashgru,flashlstm; "
        "with --checkpoints: every cell mixer found there)",
    )
    p.add_argument(
        "--checkpoints",
        type=Path,
        help="a sweep folder (trials/*/spec.json + checkpoints/best.ckpt): add the trained panel",
    )
    p.add_argument("--no-fresh", action="store_true", help="only the trained panel")
    p.add_argument(
        "--inputs",
        default="random",
        help="'random' (N(0,1)), 'task' (each checkpoint's task) or 'task:NAME' (default: %(default)s)",
    )
    p.add_argument("--min-log2", type=int, default=6, help="shortest length 2^N (default: %(default)s)")
    p.add_argument("--max-log2", type=int, default=14, help="longest length 2^N (default: %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="sequences per length; the residual is their max (default: 8)")
    p.add_argument("--iters", type=int, default=6, help="Newton iterations (default: %(default)s)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--d-model", type=int, default=64, help="width of the fresh cells (default: %(default)s)")
    p.add_argument("--num-heads", type=int, default=4, help="heads of the fresh cells (default: %(default)s)")
    p.add_argument(
        "--cell-option",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option of the fresh cells (repeatable), e.g. --cell-option clip_norm=none",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the fresh parameters and the inputs")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("analysis-out"), help="output folder (default: %(default)s)")
    p.add_argument("--name", default="newton", help="file name stem (default: %(default)s)")
    p.add_argument("--from-csv", type=Path, help="re-plot the CSV of an earlier run instead of computing")
    return p


def _short(name: str) -> str:
    return name.split(":")[-1] if ":" in name else {"flashgru": "FlashGRU", "flashlstm": "FlashLSTM"}.get(name, name)


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    args = parser().parse_args(argv)
    setup_logging()
    torch.set_num_threads(max(1, args.threads))
    if not 0 <= args.min_log2 <= args.max_log2 <= 20:
        raise ValueError(f"need 0 <= --min-log2 <= --max-log2 <= 20, got {args.min_log2} and {args.max_log2}")
    if args.batch < 1 or args.iters < 1:
        raise ValueError(f"--batch and --iters must be >= 1, got {args.batch} and {args.iters}")
    kind, _, task_name = args.inputs.partition(":")
    if args.from_csv is not None:
        if not args.from_csv.is_file():
            raise ValueError(f"no CSV at {args.from_csv} (written by an earlier python -m analysis.newton)")
        df = pd.read_csv(args.from_csv)
        missing = {"cell", "panel", "L", "iteration", "residual"} - set(df.columns)
        if missing:
            raise ValueError(f"{args.from_csv} lacks column(s) {', '.join(sorted(missing))}")
        return _finish(df, args, kind, task_name, getattr(torch, args.dtype))
    if kind not in ("random", "task") or (kind == "random" and task_name):
        raise ValueError(f"--inputs must be 'random', 'task' or 'task:NAME', got {args.inputs!r}")
    if kind == "task" and not task_name and args.checkpoints is None:
        raise ValueError("--inputs task needs --checkpoints (their task) or a task name: --inputs task:parity")
    if args.no_fresh and args.checkpoints is None:
        raise ValueError("--no-fresh leaves nothing to plot without --checkpoints")
    if task_name:
        from tasks import TASKS

        if task_name not in TASKS:
            raise ValueError(f"unknown task {task_name!r}; known tasks: {', '.join(sorted(TASKS))}")
    dtype = getattr(torch, args.dtype)
    lengths = [2**k for k in range(args.min_log2, args.max_log2 + 1)]
    options = dict(args.cell_option)

    checkpoints = find_checkpoints(args.checkpoints, args.cells) if args.checkpoints is not None else {}
    fresh_task = task_name
    if kind == "task" and not fresh_task:  # the checkpoints' task
        fresh_task = json.loads((next(iter(checkpoints.values())) / "spec.json").read_text())["task"]
    jobs = []  # (label, mixer, make_input)
    if not args.no_fresh:
        # as --help says: with --checkpoints, the fresh panels are of the cells found there (the trained
        # panels' own), so no row lacks one of its two panels
        fresh_cells = args.cells or [n for n in checkpoints if _is_cell(n)] or list(DEFAULT_CELLS)
        for name in fresh_cells:
            if kind == "task":
                model = fresh_model(name, fresh_task, {}, options, args.seed).to(dtype)
                make = lambda L, m=model: mixer_input(m, task_tokens(fresh_task, {}, L, args.batch, args.seed))
                mixer, source = model.mixer, f"fresh, {fresh_task} inputs"
            else:
                mixer = fresh_cell(name, args.d_model, args.num_heads, options, args.seed)
                make = lambda L, d=args.d_model: torch.randn(
                    args.batch, L, d, dtype=torch.float64, generator=torch.Generator().manual_seed(args.seed + L)
                )
                source = "fresh, N(0,1) inputs"
            jobs.append(({"cell": _short(name), "panel": "freshly initialized", "source": source}, mixer, make))
    if checkpoints:
        for name, trial in checkpoints.items():
            spec, model = load_trial(trial)
            try:
                _as_cell_mixer(model.mixer, name)
            except ValueError:
                if args.cells is not None:
                    raise
                log.info("skipping %s (not a recurrent cell)", name)
                continue
            model = model.to(dtype)
            if kind == "task":
                tname = task_name or spec.task
                topts = spec.task_options if tname == spec.task else {}
                make = lambda L, m=model, t=tname, o=topts: mixer_input(m, task_tokens(t, o, L, args.batch, args.seed))
                source = f"trained on {spec.task} ({trial.name}), {tname} inputs"
            else:
                d = model.config.d_model
                make = lambda L, d=d: torch.randn(
                    args.batch, L, d, dtype=torch.float64, generator=torch.Generator().manual_seed(args.seed + L)
                )
                source = f"trained on {spec.task} ({trial.name}), N(0,1) inputs"
            jobs.append(
                ({"cell": _short(name), "panel": f"trained on {spec.task}", "source": source}, model.mixer, make)
            )
    if not jobs:
        raise ValueError(f"no recurrent cell to analyse in {args.checkpoints}")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    frames = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True
    ) as bar:
        task = bar.add_task("Newton residuals", total=len(jobs) * len(lengths))
        for label, mixer, make in jobs:
            bar.update(task, description=f"{label['cell']} ({label['panel']})")
            frames.append(
                residual_curves(mixer, make, lengths, args.iters, dtype, label, progress=lambda: bar.advance(task))
            )
    return _finish(pd.concat(frames, ignore_index=True), args, kind, task_name, dtype)


def _finish(df: pd.DataFrame, args, kind: str, task_name: str, dtype) -> pd.DataFrame:
    """Write the figure and CSV, log the longest length's residuals and any non-convergence."""
    from analysis.plotting import save_figure, setup_style

    setup_style()
    inputs = "N(0,1)" if kind == "random" else task_name
    if not inputs and "source" in df:  # the checkpoints' task, as recorded in the sources
        found = df["source"].astype(str).str.extract(r", (\S+) inputs$")[0].dropna()
        inputs = found.iloc[0] if len(found) else "task"
    title = (
        f"Newton convergence (paper 000 Fig. 4)\nmax residual over {args.batch} sequences, {args.dtype}, "
        f"{inputs} inputs"
    )
    save_figure(plot(df, title, torch.finfo(dtype).eps), args.out / args.name, df)
    longest = int(df["L"].max())
    last = df[df["L"] == longest].pivot_table(
        index=["cell", "panel"], columns="iteration", values="residual", dropna=False
    )
    log.info("residuals at L=%d:\n%s", longest, last.to_string(float_format=lambda x: f"{x:.1e}"))
    final = df[df["iteration"] == df["iteration"].max()]
    bad = final[~(final["residual"].abs() <= 1e3 * torch.finfo(dtype).eps)]
    for (cell, panel), group in bad.groupby(["cell", "panel"]):
        log.warning(
            "%s (%s): not converged after %d iterations at L = %s (final residual up to %.1e)",
            cell,
            panel,
            int(df["iteration"].max()),
            ", ".join(map(str, sorted(group["L"]))),
            group["residual"].max(),
        )
    return df


if __name__ == "__main__":
    sys.exit(run(main))
