"""``python -m analysis.recall_answers TRIAL_DIR...``: what a trained MQAR model answers at its queries.

For each trial folder of an MQAR sweep (``<out>/trials/<trial>``: ``spec.json`` and
``checkpoints/best.ckpt``), generate fresh sequences of the trial's task (seed ``--seed``, never the
training data's), run the best checkpoint and sort every query's prediction into:

- ``right``: the value paired with the queried key;
- ``other_pair``: the value of another key-value pair of the same sequence (the model found the
  context values but did not bind the query to its own pair);
- ``neither``: anything else.

``right_by_pair`` splits ``right`` by which pair the query asks for (the first, second, ... of the
context). Prints one Markdown row per trial; ``--csv`` also writes them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from analysis.cli import run, setup_logging


def answer_split(inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor, num_pairs: int) -> dict:
    """Shares of the query predictions that are right / another pair's value / neither.

    ``inputs``, ``targets``, ``predictions``: ``LongTensor (N, L)``; the context is ``k1 v1 ... kκ vκ`` at
    positions ``0 .. 2κ-1``; query positions have ``targets >= 0``.
    """
    query = targets >= 0
    values = inputs[:, 1 : 2 * num_pairs : 2]  # (N, κ)
    keys = inputs[:, 0 : 2 * num_pairs : 2]
    right = predictions == targets
    in_context = (predictions.unsqueeze(-1) == values.unsqueeze(1)).any(-1)  # (N, L)
    pair = (inputs.unsqueeze(-1) == keys.unsqueeze(1)).float().argmax(-1)  # which key a query asks for
    n = max(1, int(query.sum()))
    return {
        "queries": int(query.sum()),
        "right": float(right[query].sum()) / n,
        "other_pair": float((in_context & ~right)[query].sum()) / n,
        "neither": float((~in_context)[query].sum()) / n,
        "right_by_pair": [float(right[query & (pair == j)].float().mean()) for j in range(num_pairs)],
    }


def trial_answers(trial: Path, num_sequences: int, seed: int) -> dict:
    """``answer_split`` of the best checkpoint of one MQAR trial folder on fresh sequences."""
    from analysis.newton import load_trial
    from tasks import get_task

    spec, model = load_trial(trial)
    if spec.task != "mqar":
        raise ValueError(f"{trial} is a {spec.task!r} trial; recall_answers reads MQAR trials")
    task = get_task("mqar", **spec.task_options)
    data = task.generate(num_sequences, seed=seed)
    with torch.no_grad():
        predictions = torch.cat([model(x).argmax(-1) for x in data.inputs.split(500)])
    split = answer_split(data.inputs, data.targets, predictions, task.config.num_kv_pairs)
    split["right_by_pair"] = " / ".join(f"{v:.3f}" for v in split["right_by_pair"])
    return {"trial": trial.name, "mixer": spec.model.mixer, "seed": spec.seed, "lr": spec.lr, **split}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.recall_answers",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        epilog="Example: python -m analysis.recall_answers runs/mqar-pararnn-table6/trials/*transformer*",
    )
    p.add_argument("trials", nargs="+", type=Path, help="trial folders of MQAR sweeps")
    p.add_argument("--sequences", type=int, default=4000, help="fresh sequences per trial (default: %(default)s)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the fresh sequences (default: %(default)s)")
    p.add_argument("--csv", type=Path, help="also write the rows here")
    return p


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    args = parser().parse_args(argv)
    setup_logging()
    if args.sequences < 1:
        raise ValueError(f"--sequences must be >= 1, got {args.sequences}")
    df = pd.DataFrame([trial_answers(t, args.sequences, args.seed) for t in args.trials])
    print(df.to_markdown(index=False, floatfmt=".3f"))
    if args.csv:
        df.to_csv(args.csv, index=False)
    return df


if __name__ == "__main__":
    sys.exit(run(main))
