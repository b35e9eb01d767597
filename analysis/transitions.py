"""``python -m analysis.transitions TRIAL_DIR``: the state transitions a trained linear-RNN model learned.

For every layer whose mixer has a method ``transitions(x) -> A (B, L, H, D, D)`` (the delta rule's
``deltanet``, ``signed_deltanet``, ``deltaproduct``, ``gated_deltanet``: ``DeltaRuleMixer.transitions``;
``rwkv7``: ``RWKV7.transitions``; any mixer of your own that defines it) of a finished trial
(``spec.json`` + ``checkpoints/best.ckpt``), on
``--batch`` sequences of the trial's task at ``--length``: each position's transition ``A_t`` per head
(``S_t = S_{t-1} A_t + writes``) and its eigenvalues away from 1 (``|lambda - 1| > 1e-3``, a conjugate
pair once) of modulus at least ``--min-modulus``. Per (layer, head, input token) the table gives, for
each such eigenvalue sorted by angle, its median angle (degrees, 0..180) and modulus over the
positions, and the angle's spread (max - min).

Tracking a cyclic state exactly takes a rotation of exactly ``360 k / m`` degrees of modulus 1 per
token (counting mod ``m``; a reflection, 180 degrees, for parity). With ``--modulus m`` the table adds
``drift``, the angle minus the nearest multiple of ``360 / m``, and ``tokens_to_half_class`` =
``(180 / m) / |drift|``: after that many such tokens the accumulated phase is half a class off, so a
readout of the class fails on sequences holding more of them. Writes ``OUT/transitions.csv``
(default ``OUT``: the trial folder) and prints the table.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from analysis.cli import run, setup_logging
from mixers.protocol import declared

log = logging.getLogger("analysis.transitions")

#: eigenvalues within this distance of 1 are the identity's (directions the transition leaves alone)
TRIVIAL = 1e-3


def eigen_table(A: torch.Tensor, tokens: torch.Tensor, min_modulus: float = 0.5) -> pd.DataFrame:
    """Per (head, token, rank): the median angle (degrees) and modulus of the transitions'
    non-trivial eigenvalues, and the angle's spread over positions.

    ``A (B, L, H, D, D)``: transitions; ``tokens (B, L)``: the input token at each position. Per
    transition the eigenvalues with ``|lambda - 1| > TRIVIAL``, ``|lambda| >= min_modulus`` and
    ``imag >= 0`` (a conjugate pair once), sorted by angle (largest first), get ranks 0, 1, ...;
    per (head, token) only the positions with the most common count of them are summarized (their
    count is ``positions``, of ``of_positions``)."""
    ev = torch.linalg.eigvals(A.detach().to(torch.float64))  # (B, L, H, D)
    keep = ((ev - 1).abs() > TRIVIAL) & (ev.abs() >= min_modulus) & (ev.imag >= -1e-12)
    angle = torch.where(keep, ev.angle().abs() * (180 / math.pi), torch.full_like(ev.real, -1.0))
    order = angle.argsort(dim=-1, descending=True)
    angle, modulus = angle.gather(-1, order), ev.abs().gather(-1, order)
    count = keep.sum(-1)  # (B, L, H)
    rows = []
    H = A.shape[2]
    for h in range(H):
        for tok in tokens.unique().tolist():
            at = tokens == tok  # (B, L)
            counts = count[..., h][at]
            r = int(counts.mode().values) if counts.numel() else 0
            sel = at & (count[..., h] == r)
            for i in range(r):
                a, m = angle[..., h, i][sel], modulus[..., h, i][sel]
                rows.append(
                    {
                        "head": h,
                        "token": tok,
                        "rank": i,
                        "angle_deg": float(a.median()),
                        "modulus": float(m.median()),
                        "angle_spread_deg": float(a.max() - a.min()),
                        "positions": int(sel.sum()),
                        "of_positions": int(at.sum()),
                    }
                )
    return pd.DataFrame(rows)


def add_drift(df: pd.DataFrame, modulus: int) -> pd.DataFrame:
    """``drift`` (degrees) to the nearest multiple of ``360 / modulus`` and ``tokens_to_half_class``."""
    step = 360.0 / modulus
    out = df.copy()
    out["drift"] = out["angle_deg"] - (out["angle_deg"] / step).round() * step
    out["tokens_to_half_class"] = (step / 2) / out["drift"].abs().where(out["drift"] != 0)
    return out


def transition_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's mixers with a ``transitions`` method, in the order of ``model.modules()``."""
    return [m for m in model.modules() if callable(declared(m, "transitions"))]


def layer_transitions(model: torch.nn.Module, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Per such layer, the transitions ``(B, L, H, D, D)`` on ``tokens (B, L)``, in the model's dtype."""
    layers = transition_layers(model)
    if not layers:
        raise ValueError(
            "the model has no mixer with state transitions (deltanet, signed_deltanet, deltaproduct, "
            "gated_deltanet, rwkv7, or one with a transitions(x) method)"
        )
    inputs: dict[int, torch.Tensor] = {}
    handles = [
        layer.register_forward_pre_hook(lambda mod, args, i=i: inputs.__setitem__(i, args[0].detach()))
        for i, layer in enumerate(layers)
    ]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        return [layer.transitions(inputs[i]) for i, layer in enumerate(layers)]


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    from analysis.newton import load_trial, task_tokens

    p = argparse.ArgumentParser(prog="python -m analysis.transitions", description=__doc__.splitlines()[0])
    p.add_argument("trial", type=Path, help="a finished trial folder: spec.json + checkpoints/best.ckpt")
    p.add_argument("--length", type=int, default=None, help="sequence length (default: the longest training length)")
    p.add_argument("--batch", type=int, default=64, help="sequences (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-modulus", type=float, default=0.5, help="eigenvalues below this modulus are left out")
    p.add_argument("--modulus", type=int, default=None, help="m: add the drift to the nearest multiple of 360/m")
    p.add_argument("--out", type=Path, default=None, help="folder for transitions.csv (default: the trial folder)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    setup_logging(args.verbose)
    if args.modulus is not None and args.modulus < 2:
        raise ValueError(f"--modulus must be >= 2, got {args.modulus}")
    spec, model = load_trial(args.trial)
    length = args.length or (spec.extrapolation or {}).get("max_len") or spec.task_options.get("seq_len")
    if not length:
        raise ValueError("give --length: the trial's spec states no training length")
    tokens = task_tokens(spec.task, dict(spec.task_options), int(length), args.batch, args.seed)
    tables = []
    for i, A in enumerate(layer_transitions(model.double(), tokens)):
        tables.append(eigen_table(A, tokens, args.min_modulus).assign(layer=i + 1))
    df = pd.concat(tables, ignore_index=True)
    df = df[["layer", *[c for c in df.columns if c != "layer"]]]
    if args.modulus:
        df = add_drift(df, args.modulus)
    out = args.out or args.trial
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "transitions.csv", index=False)
    print(f"# {spec.model.mixer} on {spec.task} {spec.task_options}, {args.batch} sequences of length {length}")
    print(df.round(4).to_string(index=False))
    log.info("written: %s", out / "transitions.csv")
    return df


if __name__ == "__main__":
    sys.exit(run(main))
