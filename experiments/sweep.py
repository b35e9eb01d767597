"""``python -m experiments.sweep TASK``: mixers × seeds × learning rates as Optuna trials.

Re-running the same command resumes: finished cells are kept, interrupted ones re-run (from their
last checkpoint), nothing runs twice. ``--workers N`` runs N worker processes; ``--storage
postgresql://...`` lets workers on several machines share one study. Results: ``<out>/results.csv``
and ``<out>/table.md``; per cell in ``<out>/trials/<entry>-<mixer>-s<seed>-lr<lr>-<hash>/``:
``checkpoints/best.ckpt`` and ``last.ckpt``, the step log (``logs/``), ``spec.json`` and ``run.json``
(worker, device, versions). ``<out>/journal.log`` is the Optuna study (open it with
``optuna-dashboard <out>/journal.log``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from experiments.cli import (
    Parser,
    add_run_arguments,
    check_run_arguments,
    int_list,
    key_value,
    positive_float_list,
    positive_int,
    positive_int_list,
    str_list,
    sweep_options,
    training_main,
)
from experiments.sweeps.presets import SweepPlan, available_presets, load_preset, resolve_sweep
from experiments.sweeps.runner import SweepOptions, run_plans
from experiments.trial.shape import PRECISIONS
from mixers import MIXERS
from tasks import TASKS

log = logging.getLogger("experiments.sweep")


def study_name(plan: SweepPlan) -> str:
    return f"{plan.entry or plan.task}-{plan.preset}"


def run_sweep(plan: SweepPlan, out: Path, options: SweepOptions = SweepOptions()):
    """Run (or resume) the sweep as ``options`` says; returns the results ``DataFrame`` (one row per cell)."""
    results, _ = run_plans([plan], out, study_name(plan), options, label=f"{plan.entry or plan.task} sweep", flat=True)
    return next(iter(results.values()))


def preset_entries(preset: str) -> list[str]:
    """The sweep entries (``tasks:`` keys) of ``preset``; ``[]`` if it does not exist."""
    try:
        return list(load_preset(preset).get("tasks", {}))
    except ValueError:
        return []


def parser() -> Parser:
    p = Parser(
        prog="python -m experiments.sweep",
        description="Train models (one layer or several: --layers) for every (mixer, seed, learning rate) of a preset on one task, "
        "as Optuna trials; print and write the accuracy table. Re-running the same command resumes.",
        epilog=f"Tasks: {', '.join(sorted(TASKS))}. Presets: {', '.join(available_presets())} "
        "(files in experiments/presets/). Mixers: see --mixers (a registered name, "
        "'module.path:CellClass' for your own RNNCell, or 'fla:<Layer>'). Example on a CPU: "
        "python -m experiments.sweep parity --preset smoke",
    )
    p.add_argument("task", help=f"one of: {', '.join(sorted(TASKS))}, or a sweep entry of --preset (e.g. khop2)")
    p.add_argument(
        "--preset",
        help="named configuration (default: default, the paper's setup: meant for a GPU; on a CPU use --preset smoke)",
    )
    p.add_argument(
        "--mixers",
        type=str_list,
        metavar="MIXER[,MIXER...]",
        help=f"comma-separated mixers, overriding the preset's: a registered name ({', '.join(sorted(MIXERS))}), "
        "'module.path:Cell' for your own RNNCell subclass (or a factory), or 'fla:<Layer>' for a layer of "
        "flash-linear-attention; any of them with options as NAME[key=value,...], e.g. "
        "deltaproduct[householders=2]",
    )
    p.add_argument("--seeds", type=int_list, help="comma-separated seeds, e.g. 0,1,2")
    p.add_argument("--lrs", type=positive_float_list, help="comma-separated learning rates, e.g. 1e-3,3e-4")
    p.add_argument("--max-steps", type=positive_int, help="training step budget per trial")
    p.add_argument(
        "--layers",
        type=positive_int_list,
        metavar="N[,N...]",
        help="model depth: sequence blocks, each pre-norm and residual (a list sweeps depth; default: "
        "the preset's, else 1)",
    )
    p.add_argument("--d-model", type=positive_int, help="the model's width (default: the preset's, else 64)")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="32-true (float32; the default) or bf16-mixed (float32 weights, optimizer and loss, the "
        "forward under bfloat16 autocast)",
    )
    p.add_argument(
        "--mixer-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pass KEY=VALUE to every mixer's constructor (repeatable), e.g. --mixer-option num_heads=2; "
        "for fla:<Layer> mixers any argument of the fla layer",
    )
    p.add_argument(
        "--task-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a task option (repeatable), e.g. --task-option seq_len=64",
    )
    p.add_argument(
        "--extrapolation-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a length-extrapolation option (repeatable; min_len, max_len: the training lengths, "
        "eval_lengths: the test lengths, test_range: one more test set of lengths drawn from [a, b], "
        "val_range: the validation set's lengths drawn from [a, b] instead of the training lengths), "
        "e.g. --extrapolation-option max_len=16 "
        "--extrapolation-option 'eval_lengths=[16, 64]'",
    )
    p.add_argument(
        "--train-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a training option (repeatable; a field of experiments.trial.train.TrainConfig), "
        "e.g. --train-option train_size=100000",
    )
    p.add_argument("--out", type=Path, help="output folder (default: runs/<task>-<preset>)")
    add_run_arguments(p)
    return p


def run(args) -> None:
    """The sweep of the parsed command line: resolve the plan, check the options, run, print the table."""
    from experiments.engines.mps import workers_mps
    from experiments.trial.train import resolve_device

    chosen, args.preset = args.preset, args.preset or "default"
    if args.task not in TASKS and args.task not in preset_entries(args.preset):
        raise ValueError(f"unknown task {args.task!r}; known tasks: {', '.join(sorted(TASKS))}")
    train_over = dict(args.train_option)
    if args.max_steps:
        train_over["max_steps"] = args.max_steps
    overrides = {
        "mixers": args.mixers,
        "seeds": args.seeds,
        "lrs": args.lrs,
        "train": train_over or None,
        "task_options": dict(args.task_option) or None,
        "extrapolation": dict(args.extrapolation_option) or None,
        "layers": args.layers,
        "d_model": args.d_model,
        "precision": args.precision,
        "every_mixer": dict(args.mixer_option),
    }
    plan = resolve_sweep(args.task, args.preset, overrides)
    # a width other than the preset's gets its own default folder: the tables group cells by mixer and depth
    preset_width = resolve_sweep(args.task, args.preset).model.d_model
    width = f"-d{args.d_model}" if args.d_model and args.d_model != preset_width else ""
    out = args.out or Path("runs") / f"{args.task}-{args.preset}{width}"
    check_run_arguments(args, out)
    if chosen is None and resolve_device(args.device)[0] == "cpu":
        cells = len(plan.mixers) * len(plan.layers) * len(plan.seeds) * len(plan.lrs)
        log.warning(
            "no --preset: running the 'default' preset, the paper's setup for a GPU, on the CPU: %d cells of "
            "up to %s steps each (hours to days); for minutes on a CPU: --preset smoke",
            cells,
            f"{plan.train.max_steps:,}",
        )
    with workers_mps(args.mps, args.workers):
        df = run_sweep(plan, out, sweep_options(args, args.preset))
    print((out / "table.md").read_text())
    print(f"results: {out / 'results.csv'} ({len(df)} cells); study: optuna-dashboard {out / 'journal.log'}")


def main(argv: list[str] | None = None) -> int:
    return training_main(parser(), argv, run)


if __name__ == "__main__":
    sys.exit(main())
