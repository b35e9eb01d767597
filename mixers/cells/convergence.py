"""Newton convergence of a cell (paper 000 App. A, Fig. 4): max residual per Newton iteration.

``newton_residuals(mixer_or_cell, x, iters)`` returns ``[r_0, r_1, ..., r_iters]`` with
``r_k = max |f(h^k_{t-1}, x_t) - h^k_t|`` over batch, positions and channels (``r_0``: the initial
guess ``h^0_t = f(0, x_t)``). CLI (a Markdown table; ``--csv PATH`` also writes the numbers)::

    python -m mixers.cells.convergence [--mixers flashgru,flashlstm] [--log2-lengths 6-14]
        [--batch 8] [--iters 6] [--dtypes float64,float32] [--seed 0] [--clip-norm 0.9]
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
import time
from collections.abc import Sequence

import pandas as pd
import torch

from mixers.cells.base import RNNCell
from mixers.cells.mixer import CellMixer
from seqkernels.newton import newton_apply


def newton_residuals(mixer_or_cell: CellMixer | RNNCell, x: torch.Tensor, iters: int = 6) -> list[float]:
    """Max residual per Newton iteration (``iters + 1`` values) of a ``CellMixer`` or one ``RNNCell``.

    ``x``: ``(B, L, d_model)`` for a mixer, ``(B, L, d_in)`` for a cell. Runs exactly ``iters``
    iterations (no early exit, no residual check, no fallback), without autograd.
    """
    with torch.no_grad():
        if isinstance(mixer_or_cell, CellMixer):
            m = mixer_or_cell
            saved = (m.mode, m.iters, m.tol, m.check)
            m.mode, m.iters, m.tol, m.check = "parallel", iters, None, False
            try:
                m(x)
            finally:
                m.mode, m.iters, m.tol, m.check = saved
            return list(m.last_newton_stats.residuals)
        if isinstance(mixer_or_cell, RNNCell):
            cell = mixer_or_cell
            _, S = cell.sizes()
            u = cell.input_projection(x)
            _, stats = newton_apply(
                lambda h, uu: cell.state_update(h, uu),
                u,
                state_size=S,
                structure=cell.jacobian,
                jac=cell.jacobian_fn,
                time_dim=1,
                iters=iters,
                check=False,
            )
            return list(stats.residuals)
    raise TypeError(f"expected a CellMixer or an RNNCell, got {type(mixer_or_cell).__name__}")


def _lengths(spec: str) -> list[int]:
    lo, _, hi = spec.partition("-")
    return [2**k for k in range(int(lo), int(hi or lo) + 1)]


def main(argv: Sequence[str] | None = None) -> None:
    from mixers import build_mixer

    p = argparse.ArgumentParser(prog="python -m mixers.cells.convergence", description=__doc__.split("\n")[0])
    p.add_argument("--mixers", default="flashgru,flashlstm", help="registered names or module.path:Cell")
    p.add_argument("--log2-lengths", default="6-14", help="range of log2(L), e.g. 6-14")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--clip-norm",
        default=None,
        help="FlashGRU/FlashLSTM norm clipping: a number, or 'none' (the parity setting); "
        "omitted: the cell's default (0.9); other cells take no such option",
    )
    p.add_argument("--csv", default=None, help="also write the table as CSV here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    options = {}
    if args.clip_norm is not None:
        options["clip_norm"] = None if args.clip_norm.lower() == "none" else float(args.clip_norm)
    rows = []
    for name in args.mixers.split(","):
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            torch.manual_seed(args.seed)
            mixer = build_mixer(name, args.d_model, **options).to(dtype)
            for L in _lengths(args.log2_lengths):
                gen = torch.Generator().manual_seed(args.seed + L)
                x = torch.randn(args.batch, L, args.d_model, generator=gen).to(dtype)
                t0 = time.perf_counter()
                res = newton_residuals(mixer, x, args.iters)
                logging.info("%s %s L=%d: %.1fs", name, dtype_name, L, time.perf_counter() - t0)
                rows.append({"mixer": name, "dtype": dtype_name, "L": L, **{f"it{k}": r for k, r in enumerate(res)}})
    its = [f"it{k}" for k in range(args.iters + 1)]
    table = pd.DataFrame(rows, columns=["mixer", "dtype", "L", *its])
    sys.stdout.write(table.to_markdown(index=False, floatfmt=".1e") + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["mixer", "dtype", "L", *its])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
