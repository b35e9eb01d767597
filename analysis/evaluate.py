"""``python -m analysis.evaluate TRIAL_DIR...``: a trained trial's test sets again, in other precisions.

Each ``TRIAL_DIR`` is a trial folder of a sweep or reproduction (``<out>/trials/<cell>/``: its
``spec.json`` and ``checkpoints/``). The trial's own test sets (the same seeds, so the same sequences)
are rebuilt and the chosen checkpoint (``--checkpoint last``: the weights at the last validation, the
final weights of a trial that ran its whole budget; ``best``: the best validation's) is tested once per
``--precision`` (Lightning's names: ``32-true``, ``bf16-mixed`` autocasts, ``bf16-true`` casts the
weights and activations to bfloat16, as evaluating a model after ``model.to(torch.bfloat16)``).

Prints one row per (trial, precision, test set) with the accuracy and the scaled accuracy
(``(acc - chance) / (1 - chance)``) in %, and writes them to ``--out`` (CSV) when given.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import pandas as pd
import torch

from analysis.cli import csv_list, run

PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")
CHECKPOINTS = {"last": "last.ckpt", "best": "best.ckpt"}


def evaluate_trial(
    trial_dir: Path, precisions: Sequence[str] = PRECISIONS, checkpoint: str = "last", device: str = "cpu"
) -> pd.DataFrame:
    """Rows ``trial, mixer, seed, lr, step, precision, test_set, acc, scaled_acc`` (accuracies in [0, 1]) of
    ``trial_dir``'s ``checkpoint`` tested in each of ``precisions`` on ``device``."""
    from analysis.newton import trial_checkpoint
    from experiments.trial.lit import LitSequenceModel
    from experiments.trial.train import build_datamodule, evaluate_test_sets

    spec, ckpt = trial_checkpoint(trial_dir, CHECKPOINTS[checkpoint])
    dm = build_datamodule(spec, device)
    dm.setup()
    step = int(torch.load(ckpt, map_location="cpu", weights_only=False).get("global_step", -1))
    loaded = LitSequenceModel.load_from_checkpoint(ckpt, map_location=device)
    rows = []
    for precision in precisions:
        module = copy.deepcopy(loaded)  # bf16-true converts the module it tests
        trainer = L.Trainer(
            accelerator="gpu" if device.startswith("cuda") else "cpu",
            devices=1,
            precision=precision,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        for key, acc in evaluate_test_sets(trainer, module, dm).items():
            if key.endswith("/acc"):
                rows.append(
                    {
                        "trial": trial_dir.name,
                        "mixer": spec.model.mixer,
                        "seed": spec.seed,
                        "lr": spec.lr,
                        "step": step,
                        "precision": precision,
                        "test_set": key.removesuffix("/acc"),
                        "acc": acc,
                        "scaled_acc": dm.task.scaled_accuracy(acc),
                    }
                )
    return pd.DataFrame(rows)


def _evaluate(argv: Sequence[str] | None) -> None:
    p = argparse.ArgumentParser(prog="python -m analysis.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("trial_dirs", nargs="+", type=Path, metavar="TRIAL_DIR", help="trial folders (<out>/trials/<cell>)")
    p.add_argument(
        "--precision",
        type=csv_list(),
        default=list(PRECISIONS),
        help=f"comma-separated Lightning precisions (default: {','.join(PRECISIONS)})",
    )
    p.add_argument(
        "--checkpoint", choices=sorted(CHECKPOINTS), default="last", help="which weights (default: %(default)s)"
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: %(default)s)")
    p.add_argument("--out", type=Path, help="also write the rows to this CSV")
    args = p.parse_args(argv)
    if unknown := [s for s in args.precision if s not in PRECISIONS]:
        p.error(f"unknown precision {unknown[0]!r}; valid: {', '.join(PRECISIONS)}")
    df = pd.concat(
        [evaluate_trial(d, args.precision, args.checkpoint, args.device) for d in args.trial_dirs], ignore_index=True
    )
    if args.out:
        df.to_csv(args.out, index=False)
    shown = df.assign(scaled_acc=100 * df["scaled_acc"])
    table = shown.pivot_table(index=["trial", "step", "test_set"], columns="precision", values="scaled_acc", sort=False)
    print("scaled accuracy (%) by precision:")
    print(table.round(1).to_string())


def main(argv: Sequence[str] | None = None) -> int:
    """The command; bad input gives a one-line ``error: ...`` and exit status 2 (``analysis.cli.run``)."""
    return run(_evaluate, argv)


if __name__ == "__main__":
    sys.exit(main())
